"""``trainer.distill``: on-policy distillation (`tracerl.train.distill`, docs/distillation.md).

The student samples its own episodes; a teacher scores every policy token the student wrote,
in the exact context the student saw, and the per-token advantage becomes

    outcome_weight * A_outcome + distill_weight * (log p_teacher - log p_student)

(the second term: the negative of the per-token reverse-KL estimate), both log-probs at the
run's sampling temperature (``model.temperature``: the student's were recorded at it).
``outcome_weight: 0`` is pure distillation."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from tracerl.config.base import _Config
from tracerl.rollout.endpoints import openai_base_url


class TeacherServer(_Config):
    """A teacher behind an OpenAI-compatible completions endpoint that returns prompt
    log-probs for given token ids (vLLM's ``prompt_logprobs``; ``tracerl serve`` too)."""

    base_url: str
    """The server's OpenAI base URL (``http://127.0.0.1:8000/v1``; a bare
    ``http://127.0.0.1:8000`` gets ``/v1``)."""

    @field_validator("base_url")
    @classmethod
    def _a_server(cls, url: str) -> str:
        return openai_base_url(url)

    model: str
    """The served model's name, as the server lists it (``/v1/models``)."""
    api_key_env: str | None = None
    """The environment variable holding its API key (None: no key)."""
    timeout_s: float = Field(120.0, gt=0)
    """The most one scoring request may take; past it the sample is unscored (the
    evaluator's: it trains on nothing)."""
    retries: int = Field(2, ge=0)
    """Further attempts after a failed request (timeouts, refused connections, 5xx)."""


class DistillConfig(_Config):
    """A teacher and how its per-token grade mixes with the outcome advantage."""

    teacher: str | None = None
    """The teacher, loaded in this process: a model spec (``smollm2-135m-instruct``), an
    ``hf:`` folder, a run (``run:runs/NAME``: its latest checkpoint, LoRA adapters
    included; ``run:runs/NAME@7``: after step 7), or a checkpoint folder
    (``runs/NAME/checkpoints/step_7``). Its tokenizer must be the student's (checked when
    the config loads; only tokenizers load). Exactly one of `teacher` and `server`."""
    server: TeacherServer | None = None
    """The teacher behind a server instead. Before its first scores it is asked for a probe:
    the tokens it says it scored must decode as the student's tokenizer decodes the same ids,
    and its log-probs must follow the temperature."""
    outcome_weight: float = Field(1.0, ge=0)
    """The weight of the outcome advantage (the run's estimator and credit). 0: pure
    distillation (the reward is still computed and logged, and decides nothing)."""
    distill_weight: float = Field(1.0, gt=0)
    """The weight of the teacher's per-token advantage, log p_teacher - log p_student."""
    tokens_per_step: int | None = Field(None, ge=1)
    """The most policy tokens the teacher scores per step (cached ones are free); samples
    past it are left out of the update (the evaluator's, counted as budget refusals).
    None: no cap."""
    cache: bool = True
    """Keep the teacher's log-probs on disk (``$TRACERL_CACHE/teacher``), keyed by the
    teacher's identity, the temperature and the token ids: a resumed run does not pay
    twice."""
    micro_batch_tokens: int = Field(4096, ge=16)
    """An in-process teacher's padded tokens per forward pass."""

    @model_validator(mode="after")
    def _one_teacher(self) -> DistillConfig:
        if (self.teacher is None) == (self.server is None):
            raise ValueError(
                "trainer.distill: give exactly one teacher: `teacher` (a model spec, hf: "
                "folder, run:runs/NAME or a checkpoint folder) or `server` (an endpoint)"
            )
        return self


def vocabulary_mismatch(teacher: str, base: str, student: str, differs: str) -> str:
    """The error for a teacher whose tokenizer is not the student's."""
    return (
        f"trainer.distill.teacher: {teacher!r} (base {base}) does not share model.spec "
        f"{student!r}'s tokenizer ({differs}); the teacher scores the student's token ids, "
        "so both must mean the same tokens; pick a teacher of the student's family "
        "(cross-tokenizer distillation is not supported)"
    )
