"""The ``judge`` reward component, and the judges a reward spec's parameters describe.

    components:
      - {name: format, fn: answered, layer: constraint, weight: 0.0, gate: 1.0}
      - name: judged
        fn: judge
        layer: outcome
        params:
          rubric: rubrics/answer.yaml     # a file (YAML/JSON), or the rubric inline
          base_url: http://127.0.0.1:8000/v1
          model: Qwen/Qwen2.5-7B-Instruct
          api_key_env: OPENAI_API_KEY     # the key's environment variable, never the key
          mode: pointwise                 # or group: the group's answers ranked in one call
          budget: {calls_per_step: 64, tokens_per_step: 50000}

What the judge sees: the task's text (its ``question``, ``prompt``, ``instruction``,
``input`` or ``query``), the evidence the episode saw (the text of its observations: tool
output, retrieved passages; ``evidence: false`` leaves it out), the task's reference answers
if ``reference: true``, and the final answer. Never the reward history or other components.

An episode that never answered scores 0 without a request (the policy's doing). Everything
else that keeps a verdict from coming (a timeout, an endpoint error, a reply that is not a
verdict, the step's budget spent) raises `JudgeFailed` after the retries, and the composer
makes the episode undecided and the evaluator's, never a reward of 0.

The endpoint client is loaded by import path (``client``, default the OpenAI-compatible
`tracerl.engines.judge_client.OpenAIJudgeClient`): like the rest of `tracerl.rewards`, this
module opens no connection itself, and a user can bring a client of their own.
"""

from __future__ import annotations

import json
import re
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tracerl.rewards.compose import RewardContext, Score, component
from tracerl.rewards.judge.judge import Judge, JudgeBudget, VerdictCache
from tracerl.rewards.judge.rubric import Rubric, VerdictSchema

DEFAULT_CLIENT = "tracerl.engines.judge_client:OpenAIJudgeClient"
TASK_FIELDS = ("question", "prompt", "instruction", "input", "query")
REFERENCE_FIELDS = ("answers", "answer", "target", "targets")

SUPPORTS_RUBRIC = Rubric(
    "citation_supports",
    "You check one citation. EVIDENCE holds a quote from a document; ANSWER is an answer to "
    "TASK. Decide whether the quote, on its own, supports the answer: it states or directly "
    "implies it. A quote that is merely on the same topic does not support the answer.",
    version="1",
    verdict=VerdictSchema("label", labels={"supports": 1.0, "does_not_support": 0.0}),
)
"""The built-in rubric of the citation chain's ``supports`` link (`citations_valid` with a
``judge``): a label, supports or not."""


class JudgeParams(BaseModel):
    """A judge component's ``params`` (and a citation chain's ``judge``)."""

    model_config = ConfigDict(extra="forbid")

    rubric: str | dict[str, Any] | None = None
    """A rubric file (YAML or JSON: name, instructions, version, verdict; a relative path is
    from the working directory), or the rubric inline. Required for ``fn: judge``; the
    citation chain has its own by default."""
    model: str
    """The judge model's name, as the endpoint knows it (part of the cache key)."""
    base_url: str | None = None
    """The endpoint, as the OpenAI SDK calls it: ``http://host:8000/v1`` (a bare
    ``http://host:8000`` gets ``/v1``; a URL with another path is kept as given)."""

    @field_validator("base_url")
    @classmethod
    def _an_http_url(cls, url: str | None) -> str | None:
        if url is not None and not re.match(r"https?://[^/\s?#]+(/\S*)?$", url):
            raise ValueError("expected an http(s) URL, e.g. http://127.0.0.1:8000/v1")
        return url

    api_key_env: str | None = None
    """The environment variable holding the endpoint's key (never the key itself)."""
    client: str = DEFAULT_CLIENT
    """The endpoint client, by import path (a class taking base_url, model, api_key_env,
    timeout_s, max_tokens, temperature and having ``model`` and ``complete(messages)``)."""
    timeout_s: float = Field(60.0, gt=0)
    max_tokens: int = Field(256, ge=1)
    temperature: float | None = Field(0.0, ge=0)
    """Sent with each request (None: the endpoint's own; `tracerl serve` samples at the one
    it was started with and refuses others)."""
    mode: Literal["pointwise", "group"] = "pointwise"
    """``pointwise``: one verdict per episode; ``group``: the group's answers scored against
    one another in one request (RULER's idea; needs a score rubric)."""
    retries: int = Field(2, ge=0)
    """Attempts after the first on a timeout, an endpoint error or a reply that is not a
    verdict."""
    cache: bool | str = True
    """Verdicts on disk: true (``$TRACERL_CACHE/judge``), a folder, or false."""
    budget: JudgeBudget = Field(default_factory=JudgeBudget)
    """Per step (the episodes sampled by one policy version; its evaluation has a budget
    of its own): ``calls_per_step`` (requests) and ``tokens_per_step``."""
    evidence: bool = True
    """Show the judge the episode's observations (tool output, retrieved text)."""
    max_evidence_chars: int = Field(8000, ge=0)
    """The evidence is clipped to this many characters (the latest observations kept; in
    group mode, this many for the whole group)."""
    max_answer_chars: int = Field(4000, ge=1)
    """An answer is clipped to this many characters, and says so (a policy must not escape
    its verdict by writing past the judge's context)."""
    reference: bool = False
    """Show the judge the task's reference answers (``answers``, ``answer``, ``target``)."""
    threshold: float = 0.5
    """A verdict worth at least this counts as "correct" when the judge is compared with
    people (calibration) or decides a citation's support. Set, it must lie above the least a
    verdict is worth and at most the most (a score: 0 to 1 once rescaled), or it decides
    nothing."""


class JudgeSet:
    """Judges, one per distinct set of params: the same params share one judge (its budget,
    its memory of questions asked). A run's reward has its own (`RunReward.judges`);
    `JUDGES` serves a reward composed without one."""

    def __init__(self) -> None:
        self._judges: dict[str, tuple[Judge, JudgeParams]] = {}
        self._lock = threading.Lock()

    def get(
        self, params: dict[str, Any], *, default_rubric: Rubric | None = None
    ) -> tuple[Judge, JudgeParams]:
        key = json.dumps(params, sort_keys=True, default=str)
        with self._lock:
            if key not in self._judges:
                self._judges[key] = _build(params, default_rubric)
            return self._judges[key]


JUDGES = JudgeSet()


def judge_params(params: dict[str, Any], where: str = "judge") -> JudgeParams:
    try:
        return JudgeParams.model_validate(params)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise ValueError(
            f"{where}: params.{loc}: {err['msg']} (got {err.get('input')!r})"
        ) from None


def _build(params: dict[str, Any], default_rubric: Rubric | None) -> tuple[Judge, JudgeParams]:
    from tracerl.cache import cache_dir
    from tracerl.imports import load_object

    p = judge_params(params)
    if p.rubric is None and default_rubric is None:
        raise ValueError("judge: params.rubric is required (a rubric file, or one inline)")
    rubric = load_rubric(p.rubric) if p.rubric is not None else default_rubric
    assert rubric is not None
    if p.mode == "group" and rubric.verdict.kind != "score":
        raise ValueError(f"judge: rubric {rubric.name!r} has labels; mode: group needs scores")
    worth = _verdict_values(rubric.verdict)
    if "threshold" in p.model_fields_set and not min(worth) < p.threshold <= max(worth):
        raise ValueError(
            f"judge: params.threshold {p.threshold:g} is outside what rubric "
            f"{rubric.name!r}'s verdicts are worth ({min(worth):g} to {max(worth):g}): "
            + ("no verdict" if p.threshold > max(worth) else "every verdict")
            + " would count as correct; give a threshold above the lowest, at most the highest"
        )
    if p.client == DEFAULT_CLIENT and p.base_url is None:
        raise ValueError(
            "judge: params.base_url is required (the endpoint, e.g. http://127.0.0.1:8000/v1)"
        )
    cls = load_object(p.client, "judge client")
    kwargs: dict[str, Any] = {"model": p.model, "timeout_s": p.timeout_s}
    kwargs.update(max_tokens=p.max_tokens, temperature=p.temperature)
    if p.base_url is not None:
        kwargs["base_url"] = p.base_url
    if p.api_key_env is not None:
        kwargs["api_key_env"] = p.api_key_env
    client = cls(**kwargs)
    cache = None
    if p.cache is not False:
        folder = cache_dir() / "judge" if p.cache is True else Path(p.cache)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            probe = tempfile.NamedTemporaryFile(dir=folder, prefix=".probe-")  # noqa: SIM115
            probe.close()
        except OSError as e:
            raise ValueError(
                f"judge: params.cache: cannot write verdicts to {folder} ({e.strerror or e}); "
                "give a folder you can write, or cache: false"
            ) from None
        cache = VerdictCache(folder)
    return Judge(rubric, client, cache, p.retries, p.budget), p


def _verdict_values(schema: VerdictSchema) -> list[float]:
    """What a verdict of `schema` can be worth: a score, 0 to 1; a label, its value."""
    return [0.0, 1.0] if schema.kind == "score" else list(schema.labels.values())


def load_rubric(source: str | dict[str, Any]) -> Rubric:
    """A rubric from a file (YAML or JSON) or a mapping."""
    if isinstance(source, dict):
        return Rubric.from_dict(source)
    path = Path(source).expanduser()
    if not path.is_file():
        raise ValueError(f"judge: rubric file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ValueError(f"judge: rubric file {str(path)!r} is not YAML: {e}") from None
    return Rubric.from_dict(data, where=f"rubric file {path}")


def task_text(task: dict[str, Any]) -> str:
    """What the task asks, as text: its first text field of `TASK_FIELDS`, else the task
    without its reference answers and bookkeeping."""
    for name in TASK_FIELDS:
        if isinstance(task.get(name), str) and task[name].strip():
            return task[name]
    rest = {k: v for k, v in task.items() if k not in (*REFERENCE_FIELDS, "id", "split")}
    return json.dumps(rest, ensure_ascii=False, sort_keys=True, default=str)


def reference_answers(task: dict[str, Any]) -> list[str]:
    for name in REFERENCE_FIELDS:
        value = task.get(name)
        if value is not None:
            return [str(v) for v in value] if isinstance(value, list | tuple) else [str(value)]
    return []


def observations(ctx: RewardContext, max_chars: int) -> list[str]:
    """The text of what the episode observed (environment segments), latest kept when the
    whole is longer than `max_chars`."""
    from tracerl.types import Source

    seen: dict[tuple[int, str | None, str], None] = {}
    for t in ctx.trajectories:
        for s in t.segments:
            if s.source is Source.ENVIRONMENT and s.text:
                seen.setdefault((s.step, s.tool_call_id, s.text), None)
    out: list[str] = []
    left = max_chars
    for _, _, text in reversed(list(seen)):
        if left <= 0:
            break
        out.append(text[-left:])
        left -= len(out[-1])
    return out[::-1]


def _step(ctx: RewardContext) -> Any:
    """Whose budget a request spends: the policy version's training step, or its
    evaluation's (kept apart)."""
    return ctx.policy_version if ctx.phase == "train" else (ctx.phase, ctx.policy_version)


def _judges(ctx: RewardContext) -> JudgeSet:
    return ctx.judges if isinstance(ctx.judges, JudgeSet) else JUDGES


def clip_answer(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]} [... {len(text) - limit} more characters, not shown]"


@component("judge")
def judge(ctx: RewardContext, **params: Any) -> Score:
    """A model's verdict on the episode's answer, by a rubric (see the module docstring);
    value in [0, 1] (a score rescaled, or a label's value)."""
    j, p = _judges(ctx).get(params)
    if not ctx.answer_text.strip():
        # the policy's doing, decided, and no verdict: not a judged component (no "judge")
        return Score(0.0, {"rubric": j.rubric.name, "not_asked": "no answer"})
    task = task_text(ctx.task)
    reference = reference_answers(ctx.task) if p.reference else None
    if p.mode == "group":
        members = [c for c in (ctx.group or (ctx,)) if c.answer_text.strip()]
        index = next((i for i, c in enumerate(members) if c is ctx), None)
        if index is None:  # a group that does not hold this episode: judge it alone
            members, index = [ctx], 0
        share = p.max_evidence_chars // len(members)
        judged = j.group_verdict(
            task,
            [clip_answer(c.answer_text, p.max_answer_chars) for c in members],
            [observations(c, share) if p.evidence else [] for c in members],
            reference=reference,
            step=_step(ctx),
        )[index]
        return Score(
            judged.verdict.value,
            {**judged.evidence(), "threshold": p.threshold, "group": len(members)},
        )
    evidence = observations(ctx, p.max_evidence_chars) if p.evidence else []
    answer = clip_answer(ctx.answer_text, p.max_answer_chars)
    judged = j.verdict(task, answer, evidence, reference=reference, step=_step(ctx))
    return Score(judged.verdict.value, {**judged.evidence(), "threshold": p.threshold})


def validate_judge(params: dict[str, Any], where: str) -> None:
    """Build the judge now (a bad rubric, a missing key, an unknown client fail when the
    run starts, not at its first episode); the run builds its own on first use."""
    JudgeSet().get(params)


judge.validate = validate_judge  # type: ignore[attr-defined]


def supports_judge(params: dict[str, Any], ctx: RewardContext) -> tuple[Any, list[Any]]:
    """For the citation chain: ``(quote, answer) -> bool`` asking the judge of `params`
    (default rubric `SUPPORTS_RUBRIC`) about `ctx`'s task, and the list its verdicts are
    appended to."""
    j, p = _judges(ctx).get(params, default_rubric=SUPPORTS_RUBRIC)
    question, step = task_text(ctx.task), _step(ctx)
    verdicts: list[Any] = []

    def supports(quote: str, answer: str) -> bool:
        answer = clip_answer(answer, p.max_answer_chars)
        quote = clip_answer(quote, p.max_evidence_chars or 1)
        judged = j.verdict(question, answer, [quote], step=step)
        verdicts.append(judged)
        return judged.verdict.value >= p.threshold

    return supports, verdicts


def judged_cost(verdicts: Sequence[Any]) -> dict[str, Any]:
    """Summed cost of several verdicts (the citation chain's), as evidence."""
    return {
        "judge": verdicts[0].rubric if verdicts else "",
        "prompt_tokens": sum(v.prompt_tokens for v in verdicts),
        "completion_tokens": sum(v.completion_tokens for v in verdicts),
        "tokens": sum(v.prompt_tokens + v.completion_tokens for v in verdicts),
        "latency_s": sum(v.latency_s for v in verdicts),
        "attempts": sum(v.attempts for v in verdicts),
        "cached": all(v.cached for v in verdicts),
        "judged": len(verdicts),
    }
