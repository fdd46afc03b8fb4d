"""``trainer.micro_batch_tokens: auto``: micro-batches sized from the device's free memory.

A micro-batch's activations (what the backward keeps) grow with its tokens; its gradients
and the optimizer's state do not. On a GPU, `micro_batch_tokens` takes the free memory when
the learner starts, less what the update will still allocate whatever the micro-batch (a
gradient and two AdamW moments per trained parameter, in its dtype, and the chunked output
layer's logits), keeps a tenth for the allocator, and divides the rest by an estimate of the
activations a token keeps per layer. The estimate, in bytes, for a decoder layer of width
``h`` and MLP width ``i`` computing in bf16: ``36 h + 8 i`` (the norms' fp32 inputs, q, k, v,
the attention output, the MLP's four intermediate tensors); twice that in fp32; a tenth of
it with gradient checkpointing (only each layer's input is kept, and one layer is recomputed
at a time). The result is rounded down to a multiple of 1024, at least 1024 and at most
131072. It is an estimate: an update that still runs out of memory halves it and is redone
(`tracerl.train.learner`), and ``train/micro_batch_tokens`` shows the size in use.

On a CPU ``auto`` is 4096, the default: host memory is not the limit there, time is.
"""

from __future__ import annotations

from typing import Any

import torch

from tracerl.models.placement import device_of, placement_of

CPU_TOKENS = 4096
STEP = 1024
MOST = 131072


def per_token_bytes(config: Any, compute: torch.dtype, checkpointing: bool = False) -> int:
    """The activations one token keeps for the backward, all layers (module docstring)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layer = 36 * text.hidden_size + 8 * text.intermediate_size
    if compute == torch.float32:
        layer *= 2
    if checkpointing:
        layer = max(1, layer // 10)
    return text.num_hidden_layers * layer


def micro_batch_tokens(
    setting: int | str,
    model: Any,
    *,
    checkpointing: bool = False,
    chunk_tokens: int = 1024,
    free_bytes: int | None = None,
) -> tuple[int, str]:
    """The micro-batch size `setting` means for `model` (already placed, its trained
    parameters the ones with ``requires_grad``; only ``auto`` reads it: a number needs no
    model), and how it was reached. An int is itself; ``auto`` is sized from the free
    memory of the model's device (`free_bytes` overrides the reading, for tests)."""
    if setting != "auto":
        return int(setting), f"trainer.micro_batch_tokens={setting}"
    device = device_of(model)
    if device.type != "cuda" and free_bytes is None:
        return CPU_TOKENS, f"auto on {device.type}: {CPU_TOKENS}"
    if free_bytes is None:
        free_bytes, _ = torch.cuda.mem_get_info(device)
    trained = [p for p in model.parameters() if p.requires_grad]
    # a gradient and AdamW's two moments, each in the parameter's dtype
    update = sum(3 * p.numel() * p.element_size() for p in trained)
    config = model.config
    vocab = config.get_text_config().vocab_size if hasattr(config, "get_text_config") else 0
    logits = 3 * chunk_tokens * vocab * 4  # a chunk's fp32 logits, log-softmax and gradient
    compute = placement_of(model).compute
    per_token = per_token_bytes(config, compute, checkpointing)
    usable = 0.9 * free_bytes - update - logits
    gib = 2**30
    if usable < STEP * per_token:
        raise MemoryError(
            f"trainer.micro_batch_tokens: auto: {free_bytes / gib:.1f} GiB free on {device} "
            f"cannot hold the update's gradients and AdamW state ({update / gib:.1f} GiB) and "
            f"even {STEP} tokens of activations ({STEP * per_token / gib:.2f} GiB); train "
            "fewer weights (model.lora), turn on trainer.gradient_checkpointing, or use a "
            "larger GPU"
        )
    tokens = min(MOST, int(usable // per_token) // STEP * STEP)
    return tokens, (
        f"auto: {free_bytes / gib:.1f} GiB free - {update / gib:.1f} GiB of gradients and "
        f"AdamW state, ~{per_token / 2**20:.2f} MiB of activations a token -> {tokens}"
    )
