"""A trained policy to take away: a run's checkpoint as a Hugging Face folder.

    tracerl export runs/demo-search --out smollm2-search        # the newest checkpoint
    tracerl export runs/demo-search --step 5 --out step5         # after step 5

A checkpoint (``checkpoints/step_<n>/model.pt``) holds the trained weights as a state dict
(a LoRA run's: its adapters only) and the optimizer's state, for `--resume`; it needs
tracerl and the run's ``config.yaml`` to mean anything. The export is the model alone: the
run's base model (``model.spec``) with the checkpoint's weights loaded (LoRA adapters merged
into the base), saved with ``save_pretrained`` (safetensors), the tokenizer and its chat
template beside it, and ``tracerl_export.json`` saying where it came from (run, step,
policy version, base model, the checkpoint's hash). ``model.spec: hf:DIR``, vLLM
(``vllm serve DIR``) and ``transformers.AutoModelForCausalLM.from_pretrained(DIR)`` load it.

The folder is written under a temporary name and renamed into place: it exists complete or
not at all, and an existing folder is never overwritten.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tracerl.cache import save_folder_atomically
from tracerl.errors import UserError
from tracerl.models.refs import EXPORT_FILE, ModelRef, parse_model_ref


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
    from tracerl.models import load
    from tracerl.models.loading import file_sha256
    from tracerl.models.placement import place, resolve
    from tracerl.train.lora import apply_lora, trainable_state

    bundle = load(ref.spec)
    model = place(bundle.model, resolve(device, dtype).frozen())
    identity = bundle.model_id
    if ref.checkpoint is not None:
        weights = ref.checkpoint / "model.pt"
        state = torch.load(weights, weights_only=True, map_location="cpu")
        if ref.lora is not None:
            model = apply_lora(model, **ref.lora)
            missing = set(trainable_state(model)) - set(state)
            if missing:
                raise ValueError(
                    f"{ref.text}: the checkpoint lacks adapter weights {sorted(missing)[:3]}"
                )
            model.load_state_dict(state, strict=False)
            model = model.merge_and_unload()
        else:
            model.load_state_dict(state)
        identity += f"+{file_sha256(weights)[:16]}"
    return Loaded(model, bundle, identity)


def export_run(run: Path, out: Path, step: int | None = None) -> dict[str, Any]:
    """Write `run`'s checkpoint (after `step`; None: the newest) to `out` as a Hugging Face
    folder; what `tracerl_export.json` says. `UserError` for a run without that checkpoint
    or an `out` that exists."""
    out = Path(out)
    if out.exists():
        raise UserError(
            f"export: {out} already exists",
            "give a new folder (an export never overwrites one)",
        )
    ref = parse_model_ref(f"run:{run}" + ("" if step is None else f"@{step}"))
    assert ref.checkpoint is not None
    state = json.loads((ref.checkpoint / "state.json").read_text())
    loaded = load_checkpoint_model(ref)
    receipt = {
        "run": str(Path(run).resolve()),
        "step": state["step"],
        "policy_version": state["policy_version"],
        "base_model": ref.spec,
        "lora_merged": ref.lora is not None,
        "model_id": loaded.identity,
        "dtype": str(next(loaded.model.parameters()).dtype).removeprefix("torch."),
        "parser": _run_parser(Path(run), ref.spec),
    }

    def write(folder: Path) -> None:
        folder.mkdir(parents=True)
        loaded.model.save_pretrained(folder, safe_serialization=True)
        loaded.bundle.tokenizer.save_pretrained(folder)  # with its chat template
        (folder / EXPORT_FILE).write_text(json.dumps(receipt, indent=1) + "\n")
        for f in folder.iterdir():  # readable by a server running as another user
            f.chmod(0o644)

    out.parent.mkdir(parents=True, exist_ok=True)
    save_folder_atomically(out, write)
    return receipt


def _run_parser(run: Path, base_spec: str) -> str | None:
    """The tool-call format the run trained its policy in: its config's ``env.parser``, else
    its base model's default (None: neither names one). What evaluating or serving the
    export parses with (`tracerl.envs.parsers.parser_for_model` reads it back)."""
    import yaml

    from tracerl.envs.parsers import NoParserError, parser_for_model

    try:
        env = (yaml.safe_load((run / "config.yaml").read_text()) or {}).get("env") or {}
    except (OSError, yaml.YAMLError):
        env = {}
    if env.get("parser"):
        return str(env["parser"])
    try:
        return parser_for_model(base_spec).name
    except NoParserError:
        return None
