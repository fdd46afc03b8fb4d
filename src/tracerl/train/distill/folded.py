"""A teacher for a server that cannot apply a temperature to prompt log-probs (vLLM).

vLLM's prompt log-probs skip the sampling processors: they are the model's log-softmax at
temperature 1 whatever the request asks (vllm v1, ``_get_prompt_logprobs_dict``). The
student's log-probs are at the run's temperature T, so the teacher's must be too. The exact
way to get them from such a server is to serve a model whose logits are already divided by
T: `folded_teacher_folder` writes the teacher with its output layer scaled by 1/T (untied
from the input embeddings, which keep their weights), so the server's log-softmax at 1 is
the teacher's at T, to the server's dtype. A `ServerTeacher` over it is told so
(``folded=T``): it asks at temperature 1 and skips the temperature probe.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch


def folded_teacher_folder(model: Any, tokenizer: Any, target: Path, temperature: float) -> Path:
    """Write `model` (a causal LM) to `target` as a Hugging Face folder whose logits are its
    own divided by `temperature`; returns `target`."""
    from safetensors.torch import save_file

    if temperature <= 0:
        raise ValueError(f"fold a positive temperature, not {temperature}")
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = base.get_output_embeddings()
    if getattr(head, "bias", None) is not None:
        raise ValueError("folding a temperature needs an output layer without a bias")
    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(base.config)
    config.tie_word_embeddings = False  # the embeddings keep their weights; the head is scaled
    config.save_pretrained(target)
    tokenizer.save_pretrained(target)
    tensors = {
        k: v.detach().to("cpu", torch.float32).clone().contiguous()
        for k, v in base.state_dict().items()
        if "lora_" not in k
    }
    tensors["lm_head.weight"] = (
        head.weight.detach().to("cpu", torch.float32) / temperature
    ).contiguous()
    save_file(tensors, str(target / "model.safetensors"))
    return target
