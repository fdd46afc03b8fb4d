"""Teachers: who scores the student's tokens, and how.

A teacher answers one question per trajectory: the log-prob of each token the student wrote,
given every token before it (the same ids the student saw: prompts, tool output, earlier
turns, a compacted sample's summary), at the run's sampling temperature. It returns one
value per token (0 off the policy tokens, which are never scored) or, for a trajectory it
could not score, why (a string): that sample is then the evaluator's, and trains on nothing.

`ModelTeacher` runs a model in this process (a spec, an ``hf:`` folder, a run's checkpoint:
`load_teacher`); `tracerl.train.distill.server.ServerTeacher` asks an OpenAI-compatible
server for prompt log-probs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from tracerl.errors import UserError
from tracerl.models.placement import device_of
from tracerl.models.refs import ModelRef
from tracerl.train.batch import bucketed_batches
from tracerl.train.logprobs import token_logprobs
from tracerl.types import Trajectory

Scored = list[float] | str
"""A trajectory's teacher log-probs (one per token), or why it has none."""


class Teacher(Protocol):
    identity: str
    """What the cache keys on: the teacher's weights (or server and model), never a path."""
    label: str
    """What the run's facts name."""

    def logprobs(self, rows: Sequence[Trajectory], temperature: float) -> list[Scored]:
        """Per row: the teacher's log-prob of each of its tokens, or why there are none."""
        ...


class ModelTeacher:
    """A teacher model in this process, frozen, scored in micro-batches without gradients;
    the LM head runs on the policy tokens only."""

    def __init__(
        self, model: Any, identity: str, label: str, micro_batch_tokens: int = 4096
    ) -> None:
        self.model = model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.identity, self.label = identity, label
        self.micro_batch_tokens = micro_batch_tokens

    def __repr__(self) -> str:
        return f"ModelTeacher({self.label!r}, {self.identity!r})"

    def logprobs(self, rows: Sequence[Trajectory], temperature: float) -> list[Scored]:
        out: list[Scored] = [[0.0] * len(t) for t in rows]  # a row without tokens: nothing
        device = device_of(self.model)
        for b in bucketed_batches(rows, [0.0] * len(rows), self.micro_batch_tokens):
            b = b.to(device)
            try:
                with torch.no_grad():
                    lp_B_T = token_logprobs(
                        self.model,
                        b.input_ids_B_T,
                        b.attention_mask_B_T,
                        temperature=temperature,
                        only_B_T=b.loss_mask_B_T,
                    )
            except Exception as e:  # the teacher's failure: these rows go unscored
                for i in b.rows:
                    out[i] = f"{type(e).__name__}: {e}"
                continue
            for k, i in enumerate(b.rows):
                out[i] = lp_B_T[k, : len(rows[i])].tolist()
        return out


class Deferred:
    """A teacher loaded when first asked (a command that never trains never loads it); its
    `label` is known before."""

    def __init__(self, make: Callable[[], Teacher], label: str) -> None:
        self._make, self.label = make, label
        self._teacher: Teacher | None = None

    @property
    def loaded(self) -> Teacher:
        if self._teacher is None:
            try:
                self._teacher = self._make()
            except UserError:
                raise
            except Exception as e:  # a damaged checkpoint, weights of another shape
                raise UserError(
                    f"trainer.distill.teacher: {self.label} did not load: {type(e).__name__}: {e}",
                    "check the checkpoint (a run's checkpoints/step_N/model.pt and its "
                    "config.yaml's model.spec), or name another teacher",
                ) from e
        return self._teacher

    @property
    def identity(self) -> str:
        return self.loaded.identity

    def logprobs(self, rows: Sequence[Trajectory], temperature: float) -> list[Scored]:
        return self.loaded.logprobs(rows, temperature)

    def __repr__(self) -> str:
        return f"teacher({self.label!r})"


def load_teacher(ref: ModelRef, device: str, dtype: str, micro_batch_tokens: int) -> ModelTeacher:
    """The model `ref` names, loaded and placed like the student (`device`, `dtype`): its base
    spec, then its checkpoint's weights (a LoRA run's adapters merged into the base)."""
    from tracerl.models.specs import load_checkpoint_model

    loaded = load_checkpoint_model(ref, device, dtype)
    return ModelTeacher(loaded.model, loaded.identity, ref.text, micro_batch_tokens)
