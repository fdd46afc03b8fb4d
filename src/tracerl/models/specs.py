"""Every form a model spec takes, checked and loaded: what ``model.spec`` accepts.

* a model tracerl ships or a Hugging Face folder (`tracerl.models.loading`):
  ``smollm2-135m-instruct``, ``tiny-random``, ``hf:<folder>`` (an export named anything);
* a run's checkpoint (`tracerl.models.refs`): ``run:runs/NAME`` (its newest checkpoint),
  ``run:runs/NAME@7`` (after step 7), or the folder ``runs/NAME/checkpoints/step_7``.

A run's checkpoint loads as its base model (the run's ``model.spec``, itself any of these
forms) with the checkpoint's weights: the full state dict, or a LoRA run's adapters merged
into the base (plain weights, faster to run). Its tokenizer and chat renderer are the
base's; its id (`PolicyBundle.model_id`) is the base's followed by ``+<sha of the
checkpoint's weights>``. `tracerl export`, distillation teachers, `tracerl eval` and training
from a checkpoint all load it through `load_checkpoint_model`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from tracerl.models.loading import PolicyBundle, file_sha256
from tracerl.models.loading import load as load_base
from tracerl.models.refs import ModelRef, is_checkpoint_ref, parse_model_ref
from tracerl.models.render import ChatRenderer


def check_spec(spec: str) -> None:
    """Raise `ModelNotFoundError` (what is missing, what to do) if `spec` names no model, in
    any of its forms; nothing loads (a run's ``config.yaml`` is read)."""
    parse_model_ref(spec)


def load(spec: str) -> PolicyBundle:
    """The policy `spec` names (any form: see the module docstring), on the CPU in fp32."""
    if not is_checkpoint_ref(spec):
        return load_base(spec)
    ref = parse_model_ref(spec)
    t0 = time.perf_counter()
    loaded = load_checkpoint_model(ref)
    base = loaded.bundle
    assert ref.checkpoint is not None
    return PolicyBundle(
        model=loaded.model,
        tokenizer=base.tokenizer,
        renderer=ChatRenderer(base.tokenizer),
        model_id=loaded.identity,
        spec=spec,
        origin="checkpoint",
        load_seconds=time.perf_counter() - t0,
        info={
            "base": ref.spec,
            "checkpoint": str(ref.checkpoint),
            "lora_merged": ref.lora is not None,
            "import_s": base.info.get("import_s", 0.0),
        },
    )


@dataclass
class Loaded:
    model: Any
    bundle: Any
    """The base model's bundle (its tokenizer and renderer)."""
    identity: str
    """The base model's id, then ``+<sha of the checkpoint's weights>``."""


def load_checkpoint_model(ref: ModelRef, device: str = "cpu", dtype: str = "float32") -> Loaded:
    """The model `ref` names: its base spec, then its checkpoint's weights (a LoRA run's
    adapters, merged into the base: plain weights, faster to run), placed on `device` for
    inference: its weights in the compute dtype `dtype` means there (`Placement.frozen`)."""
    import torch

    from tracerl.models.placement import place, resolve

    bundle = load(ref.spec)
    model = place(bundle.model, resolve(device, dtype).frozen())
    identity = bundle.model_id
    if ref.checkpoint is not None:
        weights = ref.checkpoint / "model.pt"
        state = torch.load(weights, weights_only=True, map_location="cpu")
        if ref.lora is not None:
            model = _merge_lora(model, state, ref)
        else:
            model.load_state_dict(state)
        identity += f"+{file_sha256(weights)[:16]}"
    return Loaded(model, bundle, identity)


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""``model.lora.target_modules``'s default (`tracerl.config.LORA_TARGETS`), for a run's
config that does not name them."""


def _merge_lora(model: Any, state: dict[str, Any], ref: ModelRef) -> Any:
    """`model` with the run's LoRA adapters (``ref.lora``: its ``model.lora``) wrapped around
    it, the checkpoint's adapter weights loaded, and merged into plain weights."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            f"{ref.text} is a LoRA run's checkpoint; merging its adapters needs the 'peft' "
            "package: pip install 'tracerl[lora]'"
        ) from e
    lora = ref.lora or {}
    cfg = LoraConfig(
        r=int(lora.get("r", 16)),
        lora_alpha=int(lora.get("alpha", 32)),
        lora_dropout=float(lora.get("dropout", 0.0)),
        target_modules=list(lora.get("target_modules") or LORA_TARGETS),
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(model, cfg)
    adapters = {n for n, p in model.named_parameters() if p.requires_grad}
    missing = adapters - set(state)
    if missing:
        raise ValueError(f"{ref.text}: the checkpoint lacks adapter weights {sorted(missing)[:3]}")
    model.load_state_dict(state, strict=False)
    return model.merge_and_unload()
