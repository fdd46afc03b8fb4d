"""What a model with LoRA adapters looks like, for every layer that meets one: the trainer
(`tracerl.train.lora` adds them), the weight sync and the in-process server (which hot-load
them). Needs neither torch nor peft to ask."""

from __future__ import annotations

from typing import Any


def is_lora(model: Any) -> bool:
    """Whether `model` carries peft LoRA adapters (a `peft` model)."""
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")
