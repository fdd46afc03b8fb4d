"""bf16 copies of a mixed-precision model's matmul weights, for a sampler that decodes through
a compiled (CUDA graph) step.

Under ``bf16-mixed`` the trained weights are fp32 and every forward runs in
``torch.autocast``: each ``nn.Linear`` casts its fp32 weight to bf16 when it runs. An eager
sampler keeps one autocast region per batch, so the cast happens once per batch (autocast
caches it). A compiled decode step cannot keep that cache: the casts are part of the
captured graph and run again at every replay, so every step would read each weight in fp32,
write it in bf16 and read it again (about 4x the traffic of a bf16 model's step).

`CastWeights` keeps a view of the model whose ``nn.Linear`` weights (and biases) are bf16
copies and whose other parameters and buffers (embeddings, norms) are the model's own
tensors; it runs under the same autocast, so it computes exactly what the model computes
(autocast's cast and ``copy_`` round fp32 to bf16 the same way). `refresh` copies the master
weights into the copies in place (their addresses stay, so a captured graph stays valid):
the sampler calls it at the start of every batch, under the weights' lock, which costs one
read of the fp32 weights per batch, what autocast's per-batch cast cost before. A tied
output layer (SmolLM2 ties it to the input embedding) gets its own bf16 copy; the
embedding stays the model's fp32 tensor.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from tracerl.models.placement import placement_of


class CastWeights:
    """The bf16 view of a ``bf16-mixed`` model (see the module docstring)."""

    def __init__(self, model: Any) -> None:
        placement = placement_of(model)
        if not castable(model):
            raise ValueError(
                f"CastWeights is for a bf16-mixed model with fp32 weights; this one is "
                f"{placement.describe()}"
            )
        shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
        self.view = copy.deepcopy(model, memo=shared)  # every tensor shared, modules new
        for name in ("_compiled_call", "_last_compile_config", "_tracerl_compiled_call"):
            self.view.__dict__.pop(name, None)  # the model's compiled call runs the model
        self.pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        linears = zip(_linears(model), _linears(self.view), strict=True)
        for master, mine in linears:
            for name in ("weight", "bias"):
                tensor = getattr(master, name, None)
                if tensor is None:
                    continue
                cast = torch.nn.Parameter(
                    torch.empty_like(tensor, dtype=placement.compute), requires_grad=False
                )
                setattr(mine, name, cast)
                self.pairs.append((tensor, cast))
        self.view.requires_grad_(False)
        self.view.eval()  # it only samples (the learner's train() on the model is not its)
        self.refresh()

    def refresh(self) -> None:
        """Copy the master weights into the bf16 copies, in place."""
        with torch.no_grad():
            for master, cast in self.pairs:
                cast.copy_(master)

    def nbytes(self) -> int:
        """The memory the copies take."""
        return sum(cast.numel() * cast.element_size() for _, cast in self.pairs)


def castable(model: Any) -> bool:
    """Is `model` a ``bf16-mixed`` model whose matmul weights a sampler may copy: fp32
    master weights computed in bf16, not a LoRA base (already bf16), not sharded."""
    p = placement_of(model)
    if not p.mixed or p.lora or p.weights != torch.float32:
        return False
    return not any(hasattr(t, "to_local") for t in model.parameters())  # a DTensor shard


def _linears(model: Any) -> list[torch.nn.Linear]:
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
