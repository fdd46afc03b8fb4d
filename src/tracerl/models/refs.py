"""What a model reference names, without loading it: a spec, or a run's checkpoint.

A model (a run's policy, a model to evaluate or serve, a distillation teacher) may be given as

* a model spec: ``smollm2-135m-instruct``, ``tiny-random``, ``hf:<folder>``;
* a run: ``run:runs/NAME`` (its latest checkpoint) or ``run:runs/NAME@7`` (after step 7);
* a checkpoint folder: ``runs/NAME/checkpoints/step_7``.

(`tracerl.models.specs` checks and loads every form.)

A checkpoint holds the trained weights (``model.pt``: the full state dict, or a LoRA run's
adapters only); its run's ``config.yaml`` names the base model spec and the LoRA shape.

Whether two models read token ids alike is asked of their tokenizers alone
(`tokenizer_of`, `teacher_vocabulary`): no weights load.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from tracerl.models.loading import (
    ModelNotFoundError,
    char_tokenizer,
    check_spec,
    folder_tokenizer,
    smollm2_tokenizer,
)

EXPORT_FILE = "tracerl_export.json"
"""What `tracerl export` writes beside the weights: the run, step, base model and parser."""

SPEC_TOKENIZERS: dict[str, Callable[[], Any]] = {
    "smollm2-135m-instruct": smollm2_tokenizer,
    "tiny-random": smollm2_tokenizer,
    "tiny-random-hd64": smollm2_tokenizer,
    "tiny-chars": char_tokenizer,
    "tiny-chars-hd64": char_tokenizer,
}
"""Each spec's tokenizer, loaded without its weights."""


def is_checkpoint_ref(text: str) -> bool:
    """Whether `text` names a run's checkpoint (``run:...`` or a checkpoint folder), not a
    model spec (`parse_model_ref` says whether the checkpoint is there)."""
    if text.startswith("run:"):
        return True
    folder = Path(text).expanduser()
    return (folder / "model.pt").is_file() and (folder / "state.json").is_file()


def tokenizer_of(spec: str) -> Any:
    """`spec`'s tokenizer alone (no weights loaded): to check two models share one. A run's
    checkpoint has its base model's."""
    if is_checkpoint_ref(spec):
        return tokenizer_of(parse_model_ref(spec).spec)
    check_spec(spec)
    if spec.startswith("hf:"):
        return folder_tokenizer(spec[3:])
    return SPEC_TOKENIZERS[spec]()


def vocabulary_size(spec: str, tokenizer: Any = None) -> int:
    """How many token ids `spec`'s model embeds (an id at or above it is out of its
    embedding's range), without its weights: a folder's ``vocab_size`` in config.json (its
    embedding may have more rows than its tokenizer has tokens), else its tokenizer's length
    (`tokenizer`: `spec`'s, when the caller has it already)."""
    if is_checkpoint_ref(spec):
        return vocabulary_size(parse_model_ref(spec).spec, tokenizer)
    if spec.startswith("hf:"):
        import json

        check_spec(spec)
        config = json.loads((Path(spec[3:]).expanduser() / "config.json").read_text())
        for size in (config.get("vocab_size"), (config.get("text_config") or {}).get("vocab_size")):
            if isinstance(size, int) and size > 0:
                return size
    return len(tokenizer if tokenizer is not None else tokenizer_of(spec))


def load_renderer(spec: str) -> Any:
    """`spec`'s chat renderer without its weights (a replay re-renders, it samples nothing):
    seconds less than `load(spec).renderer` for a real model, with the same tokenizer and
    template (a replay checks the template's hash against the receipt)."""
    from tracerl.models.render import ChatRenderer

    return ChatRenderer(tokenizer_of(spec))


def vocabulary_difference(a: Any, b: Any) -> str | None:
    """How tokenizers `a` and `b` differ in what a token id means (None: they agree): the
    vocabulary's size, a token whose id differs, or the special tokens' ids."""
    va, vb = a.get_vocab(), b.get_vocab()
    if len(va) != len(vb):
        return f"{len(va)} tokens against {len(vb)}"
    for token, i in va.items():
        if vb.get(token) != i:
            return f"token {token!r} is id {i} in one and {vb.get(token)} in the other"
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if getattr(a, name, None) != getattr(b, name, None):
            return f"{name} {getattr(a, name, None)} against {getattr(b, name, None)}"
    return None


@dataclass(frozen=True)
class ModelRef:
    text: str
    """The reference as given."""
    spec: str
    """The base model's spec (a run's: its ``model.spec``)."""
    checkpoint: Path | None = None
    """The checkpoint folder whose ``model.pt`` loads on the base (None: the spec as is)."""
    lora: dict[str, Any] | None = None
    """The run's ``model.lora`` (its checkpoint then holds adapters only)."""

    @property
    def run_dir(self) -> Path | None:
        """The run the checkpoint belongs to (None: a plain spec)."""
        return None if self.checkpoint is None else self.checkpoint.parent.parent


def checkpoint_steps(run_dir: Path) -> list[int]:
    """The steps of `run_dir`'s complete checkpoints (``checkpoints/step_<n>/state.json``),
    oldest first."""
    folder = Path(run_dir) / "checkpoints"
    if not folder.is_dir():
        return []
    return sorted(
        int(p.name.split("_")[1])
        for p in folder.iterdir()
        if p.name.startswith("step_") and (p / "state.json").is_file()
    )


def parse_model_ref(text: str) -> ModelRef:
    """`text` resolved to a base spec and a checkpoint, or `ModelNotFoundError` saying what is
    missing. Nothing is loaded (a run's ``config.yaml`` is read)."""
    if text.startswith("run:"):
        where, _, step = text[4:].partition("@")
        run_dir = Path(where).expanduser()
        if not run_dir.is_dir():
            raise ModelNotFoundError(
                f"{text}: there is no run at {run_dir} (no such folder)",
                "give a run's folder (runs/NAME: the out_dir and name it was trained with)",
            )
        steps = checkpoint_steps(run_dir)
        if not steps:
            raise ModelNotFoundError(
                f"{text}: no checkpoint under {run_dir / 'checkpoints'}",
                "train the run first, or name a model spec or a checkpoint folder",
            )
        if step:
            if not step.lstrip("-").isdigit() or int(step) not in steps:
                raise ModelNotFoundError(
                    f"{text}: the run has no checkpoint after step {step!r}",
                    f"its checkpoints: {', '.join(map(str, steps))}",
                )
            n = int(step)
        else:
            n = steps[-1]
        return _from_run(text, run_dir, run_dir / "checkpoints" / f"step_{n}")
    folder = Path(text).expanduser()
    if is_checkpoint_ref(text):
        return _from_run(text, folder.parent.parent, folder)
    if folder.parent.name == "checkpoints" and folder.name.startswith("step_"):
        steps = checkpoint_steps(folder.parent.parent)
        raise ModelNotFoundError(
            f"{text}: no checkpoint there (expected {folder / 'model.pt'} and state.json)",
            f"its run's checkpoints: {', '.join(map(str, steps))}"
            if steps
            else f"{folder.parent} holds no complete checkpoint; train the run first",
        )
    check_spec(text)
    return ModelRef(text, text)


def _from_run(text: str, run_dir: Path, checkpoint: Path) -> ModelRef:
    import yaml

    config = run_dir / "config.yaml"
    try:
        model = (yaml.safe_load(config.read_text()) or {}).get("model") or {}
    except (OSError, yaml.YAMLError) as e:
        raise ModelNotFoundError(
            f"{text}: cannot read the run's {config} ({e})",
            "a checkpoint's run directory holds the config.yaml it was trained with",
        ) from e
    spec = model.get("spec")
    if not isinstance(spec, str):
        raise ModelNotFoundError(f"{text}: {config} names no model.spec")
    if spec.startswith("run:") and Path(spec[4:].partition("@")[0]).resolve() == run_dir.resolve():
        raise ModelNotFoundError(f"{text}: {config} names the run itself as its model.spec")
    parse_model_ref(spec)  # a run trained from another run's checkpoint: that one too
    return ModelRef(text, spec, checkpoint, model.get("lora"))


def teacher_vocabulary(student_spec: str, teacher: str) -> tuple[ModelRef, str | None]:
    """`teacher` resolved, and how its tokenizer differs from `student_spec`'s (None: it is
    the same). Only tokenizers load; `ModelNotFoundError` where a reference names nothing."""
    ref = parse_model_ref(teacher)
    return ref, _difference(student_spec, ref.spec)


@lru_cache(maxsize=16)
def _difference(a: str, b: str) -> str | None:
    return None if a == b else vocabulary_difference(tokenizer_of(a), tokenizer_of(b))
