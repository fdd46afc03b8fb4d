"""Where a model lives and in which precision it computes: one place decides, everyone asks.

``model.device`` (auto | cpu | cuda), ``model.dtype`` (auto | float32 | bfloat16: the dtype
the forward computes in) and ``trainer.precision`` (how a trained model keeps its weights)
resolve here, once, into a `Placement`:

===============  ============  ===============  ========================================
precision        weights       forward          memory per parameter (+ activations)
===============  ============  ===============  ========================================
``fp32``         fp32          fp32             4 weights + 4 grad + 8 AdamW = 16 bytes
``bf16-mixed``   fp32 master   bf16 (autocast)  16 bytes, activations in bf16
``bf16``         bf16          bf16             2 + 2 + 4 = 8 bytes; small updates vanish
===============  ============  ===============  ========================================

``auto`` (the default) is ``fp32`` where the forward is fp32 (a CPU: bf16 matmul is several
times slower there than fp32) and ``bf16-mixed`` where it is bf16 (a GPU): bf16 compute
with fp32 master weights and optimizer state, `torch.autocast` around every forward (the
learner's, the reference's and the in-process sampler's, which shares the weights) — the
standard recipe. Pure ``bf16`` halves the weights' memory but rounds every update to 8 bits of
mantissa: at ``lr`` 1e-6 most updates of weights near 1 are below half a unit in the last place and
vanish (tests/unit/test_precision.py shows it).

A frozen model (a distillation teacher, an evaluation-only copy) needs no master weights:
`Placement.frozen` keeps its weights in the compute dtype.

Callers never write ``.to('cuda')``: they `place` a model, build tensors with
``device=device_of(model)``, and run forwards under `computing(model)`.
`check_device` fails loudly, naming the tensor, when inputs and a model disagree (rather
than a CUDA error deep inside torch).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from tracerl.models.precision import precision_conflict

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
_MARK = "_tracerl_placement"


class DeviceMismatch(ValueError):
    """Tensors handed to a model live on another device than its weights."""


@dataclass(frozen=True)
class Placement:
    device: torch.device
    weights: torch.dtype
    """The parameters' dtype (the master weights the optimizer updates)."""
    compute: torch.dtype
    """The dtype the forward computes in (autocast when it differs from `weights`)."""
    precision: str
    """``fp32``, ``bf16-mixed`` or ``bf16``."""
    lora: bool = False
    """A LoRA run's frozen base (`for_lora_base`): `weights` are the base's; peft keeps the
    adapters, the only weights that train, in fp32."""

    @property
    def mixed(self) -> bool:
        return self.compute != self.weights

    def frozen(self) -> Placement:
        """The same device and compute dtype for a model that never trains: weights in the
        compute dtype (no master copy to keep)."""
        pure = "fp32" if self.compute == torch.float32 else "bf16"
        return Placement(self.device, self.compute, self.compute, pure)

    def for_lora_base(self) -> Placement:
        """The placement of a LoRA run's base model: its weights never train, so they need
        no fp32 master copy and are kept in the compute dtype (bf16 on a GPU: half the
        memory); peft upcasts the adapters it adds to fp32, and each LoRA layer computes its
        adapter in the adapter's dtype. On a CPU in fp32 nothing changes."""
        return Placement(self.device, self.compute, self.compute, self.precision, lora=True)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """`torch.autocast` to the compute dtype when mixed; else nothing."""
        if not self.mixed:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute)

    def describe(self) -> str:
        name = {torch.float32: "fp32", torch.bfloat16: "bf16"}
        w, c = name[self.weights], name[self.compute]
        if self.lora:
            return f"{self.device} {self.precision} (base {w}, LoRA adapters fp32, compute {c})"
        return f"{self.device} {self.precision} (weights {w}, compute {c})"


def resolve_device(device: str) -> torch.device:
    """``auto``: this process's GPU if one is visible, else the CPU; ``cuda`` with no GPU
    visible is refused. This process's GPU: ``cuda:LOCAL_RANK`` under ``torchrun`` (each
    rank its own), else the current one."""
    if device == "auto" and not torch.cuda.is_available():
        return torch.device("cpu")
    if device in ("auto", "cuda"):
        if not torch.cuda.is_available():
            raise ValueError("model.device: 'cuda' was asked for but no GPU is visible; use auto")
        local = os.environ.get("LOCAL_RANK")
        index = int(local) if local is not None else torch.cuda.current_device()
        return torch.device("cuda", index)
    return torch.device(device)


def resolve(device: str = "auto", dtype: str = "auto", precision: str = "auto") -> Placement:
    """The placement these settings mean here (see the module docstring)."""
    why = precision_conflict(dtype, precision)
    if why:
        raise ValueError(why)
    dev = resolve_device(device)
    if dtype == "auto":
        if precision in ("bf16-mixed", "bf16"):
            compute = torch.bfloat16
        elif precision == "fp32":
            compute = torch.float32
        else:
            compute = torch.bfloat16 if dev.type == "cuda" else torch.float32
    else:
        compute = DTYPES[dtype]
    if precision == "auto":
        precision = "fp32" if compute == torch.float32 else "bf16-mixed"
    weights = torch.bfloat16 if precision == "bf16" else torch.float32
    return Placement(dev, weights, compute, precision)


def place(model: Any, placement: Placement) -> Any:
    """Move `model` to the placement's device and weight dtype, and remember the placement
    (what `computing` and `placement_of` read; a deep copy and a peft wrapper keep it)."""
    model = model.to(device=placement.device, dtype=placement.weights)
    setattr(model, _MARK, placement)
    return model


def for_inference(model: Any, device: str = "auto") -> Any:
    """`model` placed to sample only (a server, an evaluation without a config): on the GPU
    when there is one, its weights in the compute dtype (bf16 there, fp32 on a CPU)."""
    return place(model, resolve(device).frozen())


def placement_of(model: Any) -> Placement:
    """The placement `place` gave `model`, or the one its weights show (no autocast)."""
    mark = getattr(model, _MARK, None)
    if isinstance(mark, Placement):
        return mark
    param = next(iter(model.parameters()), None)
    if param is None:
        return Placement(torch.device("cpu"), torch.float32, torch.float32, "fp32")
    pure = "fp32" if param.dtype == torch.float32 else "bf16"
    return Placement(param.device, param.dtype, param.dtype, pure)


def device_of(model: Any) -> torch.device:
    """Where `model`'s inputs must be: the device of its input embeddings (of this rank's
    shard under FSDP2), else of its first parameter."""
    try:
        weight = model.get_input_embeddings().weight
    except (AttributeError, NotImplementedError):
        weight = next(iter(model.parameters()), None)
    if weight is None:
        return torch.device("cpu")
    local = getattr(weight, "to_local", None)  # a DTensor shard
    return local().device if callable(local) else weight.device


@contextlib.contextmanager
def computing(model: Any) -> Iterator[None]:
    """Run `model`'s forward in its compute precision (autocast when mixed)."""
    with placement_of(model).autocast():
        yield


def check_device(model: Any, where: str, **tensors: torch.Tensor | None) -> None:
    """Raise `DeviceMismatch` naming the first tensor that is not on `model`'s device."""
    want = device_of(model)
    for name, t in tensors.items():
        if t is None or not isinstance(t, torch.Tensor) or _same(t.device, want):
            continue
        raise DeviceMismatch(
            f"{where}: {name} is on {t.device} but the model's weights are on {want}; build "
            f"it with device=tracerl.models.placement.device_of(model) (or move it with "
            f".to(device)) before the forward"
        )


def _same(a: torch.device, b: torch.device) -> bool:
    if a.type != b.type:
        return False
    return a.index is None or b.index is None or a.index == b.index
