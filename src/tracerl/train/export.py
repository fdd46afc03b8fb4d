"""A trained policy to take away: a run's checkpoint as a Hugging Face folder.

    tracerl export runs/demo-search --out smollm2-search        # the newest checkpoint
    tracerl export runs/demo-search --step 5 --out step5         # after step 5

A checkpoint (``checkpoints/step_<n>/model.pt``) holds the trained weights as a state dict
(a LoRA run's: its adapters only) and the optimizer's state, for `--resume`; it needs
tracerl and the run's ``config.yaml`` to mean anything. The export is the model alone: the
run's base model (``model.spec``) with the checkpoint's weights loaded (LoRA adapters merged
into the base), saved with ``save_pretrained`` (safetensors), the tokenizer beside it, and
``tracerl_export.json`` saying where it came from (run, step, policy version, base model, the
checkpoint's hash, the tool-call format, the stop ids, the chat template's hash).
``model.spec: hf:DIR``, vLLM (``vllm serve DIR``) and
``transformers.AutoModelForCausalLM.from_pretrained(DIR)`` load it.

Served, it sees the prompts it was trained on: its chat template renders
``apply_chat_template(messages, tools=...)``'s tools (and a client's ``tool_calls``) exactly as
the run's renderer did (`tracerl.models.export_template`); ``generation_config.json`` holds
the run's stop ids and sampling; ``README.md`` (its model card, `tracerl.train.export_card`)
the base model, the task, the held-out results, the config and how to serve it; a
``json_list`` run's folder carries the vLLM tool-call parser plugin that reads its calls.

The folder is written under a temporary name and renamed into place: it exists complete or
not at all, and an existing folder is never overwritten.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from tracerl.cache import save_folder_atomically
from tracerl.envs.parsers import run_parser
from tracerl.errors import UserError
from tracerl.models.export_template import export_chat_template
from tracerl.models.refs import EXPORT_FILE, parse_model_ref

# the checkpoint's model loads in the models layer (`tracerl.models.specs`: `model.spec:
# run:...` loads the same way); re-exported here for the callers that import it from here
from tracerl.models.specs import Loaded, load_checkpoint_model  # noqa: F401
from tracerl.train.export_card import (
    PLUGIN_FILE,
    VLLM_PARSERS,
    generation_config,
    model_card,
    plugin_source,
    run_config,
)


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
        "parser": run_parser(ref.text),
    }
    renderer, tokenizer = loaded.bundle.renderer, loaded.bundle.tokenizer
    config_text, cfg = run_config(Path(run))
    template = export_chat_template(renderer, receipt["parser"])
    stop_ids = sorted(renderer.stop_token_ids)
    receipt |= {
        "chat_template_sha256": hashlib.sha256(template.encode()).hexdigest(),
        "run_template_sha256": renderer.template_hash,
        "stop_token_ids": stop_ids,
        "vllm_tool_parser": VLLM_PARSERS.get(receipt["parser"] or ""),
        "vllm_tool_parser_plugin": PLUGIN_FILE if receipt["parser"] == "json_list" else None,
        "tracerl_version": _version(),
    }

    def write(folder: Path) -> None:
        folder.mkdir(parents=True)
        loaded.model.save_pretrained(folder, safe_serialization=True)
        tokenizer.chat_template = template  # renders tools as the run did (export_template)
        tokenizer.save_pretrained(folder)
        saved = folder / "generation_config.json"
        base = json.loads(saved.read_text()) if saved.exists() else {}
        gen = generation_config(base, stop_ids, tokenizer.pad_token_id, cfg)
        saved.write_text(json.dumps(gen, indent=2) + "\n")
        if receipt["vllm_tool_parser_plugin"]:
            (folder / PLUGIN_FILE).write_text(plugin_source())
        (folder / "README.md").write_text(model_card(receipt, config_text, cfg, str(out)))
        (folder / EXPORT_FILE).write_text(json.dumps(receipt, indent=1) + "\n")
        for f in folder.iterdir():  # readable by a server running as another user
            f.chmod(0o644)

    out.parent.mkdir(parents=True, exist_ok=True)
    save_folder_atomically(out, write)
    return receipt


def _version() -> str:
    from tracerl import __version__

    return __version__
