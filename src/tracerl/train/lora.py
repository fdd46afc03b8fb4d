"""LoRA adapters and the reference policy for the training model (where it lives and in
which precision it computes: `tracerl.models.placement`).

* `apply_lora` wraps the model with `peft` LoRA adapters: only the adapters train, so the
  optimizer holds a few MB instead of two fp32 copies of every weight. The same object is
  shared with the in-process sampler, which therefore samples from the adapted policy.
* `reference` is the frozen reference policy for a KL term: with LoRA it is the same model
  with its adapters disabled (no second copy in memory); without LoRA it is a frozen copy
  of the weights as they were when training began.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import torch

from tracerl.config import LORA_TARGETS
from tracerl.models.lora import is_lora  # re-exported: `tracerl.train.lora.is_lora`


def apply_lora(
    model: Any,
    *,
    r: int = 16,
    alpha: int = 32,
    dropout: float = 0.0,
    target_modules: tuple[str, ...] | list[str] = LORA_TARGETS,
    seed: int = 0,
) -> Any:
    """The model with LoRA adapters (extra ``lora``: `pip install peft`); base weights frozen.

    The adapters' initial weights (peft draws A at random; B starts at 0) are drawn from
    `seed`, outside the global random state: two runs with one seed start from the same
    adapters, so their updates, and everything sampled after them, are the same."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("model.lora needs the 'peft' package: pip install 'tracerl[lora]'") from e
    cfg = LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=list(target_modules),
        task_type="CAUSAL_LM",
    )
    cuda = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)
        return get_peft_model(model, cfg)


class Reference:
    """The reference policy for KL: `with ref.active() as m:` yields a model to run under
    `torch.no_grad()`. LoRA: the training model with adapters disabled; otherwise a frozen
    copy made when the `Reference` is created (costs one more copy of the weights)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self._copy = None
        if not is_lora(model):
            self._copy = copy.deepcopy(model).eval()
            for p in self._copy.parameters():
                p.requires_grad_(False)

    @contextlib.contextmanager
    def active(self) -> Iterator[Any]:
        if self._copy is not None:
            yield self._copy
            return
        with self.model.disable_adapter():
            yield self.model


def trainable_state(model: Any) -> dict[str, torch.Tensor]:
    """What a checkpoint must hold: every weight, or (LoRA) only the adapters."""
    state = model.state_dict()
    if not is_lora(model):
        return state
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    return {k: v for k, v in state.items() if k in names}
