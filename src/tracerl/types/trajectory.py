"""The nouns of tracerl: who wrote each token, and the trajectory that carries them.

A trajectory is an ordered list of segments. Each segment has exactly one author (its
`Source`). The loss mask is *derived* from those authors — it is 1 exactly on tokens the
policy sampled — so it can never drift from the tokens it describes. Segments are produced by
whoever produces the tokens (the renderer, the sampler) and only ever concatenated.

Shape suffixes follow CONVENTIONS.md: `_T` is the token axis.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from tracerl.errors import UserError

SCHEMA = "tracerl.trajectory/1"


class TrajectoryError(UserError, ValueError):
    """A trajectory, a message list or a rendering broke an invariant.

    The message always names what was wrong and where (segment, message or token index) and
    what to do about it.
    """


class Source(StrEnum):
    """Who authored a token."""

    PROMPT = "prompt"
    """The task's initial messages (system, user, tool schemas): context, never loss."""
    POLICY = "policy"
    """Sampled by the policy: the sampler's own token ids. The only source that carries loss."""
    ENVIRONMENT = "environment"
    """Tool output, retrieved text, later user/system turns: observations, never loss."""
    ECHO = "echo"
    """A tool message repeating the model's own call: the action already counted once."""
    TEMPLATE = "template"
    """Scaffold the chat template adds (role headers, turn ends, generation prompts)."""


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call the policy made, as parsed from its sampled text.

    `raw` is the exact text span the model sampled for this call (used to recognise echoes);
    the tokens themselves live in the policy segment and carry loss, arguments included.
    """

    id: str
    name: str
    arguments: dict[str, Any]
    raw: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise TrajectoryError(f"tool call: id must be a non-empty string, got {self.id!r}")
        if not isinstance(self.name, str) or not isinstance(self.arguments, dict):
            raise TrajectoryError(
                f"tool call {self.id!r}: name must be a string and arguments a dict"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "arguments": copy.deepcopy(self.arguments),
            "raw": self.raw,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ToolCall:
        """From ours (`id, name, arguments, raw`) or the OpenAI shape
        (`id, type, function: {name, arguments}` with arguments as a JSON string or dict)."""
        if not isinstance(d, dict):
            raise TrajectoryError(f"tool call: expected a dict, got {type(d).__name__}")
        fn = d.get("function") if isinstance(d.get("function"), dict) else d
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError as e:
                raise TrajectoryError(
                    f"tool call {d.get('id')!r}: arguments are not valid JSON ({e.msg})"
                ) from None
        if "id" not in d or "name" not in fn:
            raise TrajectoryError(f"tool call: needs 'id' and a name, got keys {sorted(d)}")
        return cls(id=d["id"], name=fn["name"], arguments=args, raw=d.get("raw"))


@dataclass(frozen=True, slots=True)
class Segment:
    """A run of consecutive tokens with one author.

    Attributes:
        source: who wrote these tokens.
        token_ids: the token ids, exactly as produced (for the policy: as sampled).
        logprobs: one log-probability per token for `policy` segments (of the sampling
            distribution actually used, temperature applied); None for every other source.
        step: the agent turn this segment belongs to (0 for the initial prompt; turn k's
            policy tokens and the observation answering them have step k).
        tool_call_id: for observation tokens answering a tool call, that call's id.
        text: a human-readable rendering of the tokens, for viewers only. Never parsed to
            recover tokens or masks.
        policy_version: for policy segments, the version of the weights that sampled them.
        finish_reason: for policy segments, why sampling stopped ("stop" or "length").
    """

    source: Source
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] | None = None
    step: int = 0
    tool_call_id: str | None = None
    text: str | None = None
    policy_version: int | None = None
    finish_reason: str | None = None

    def __post_init__(self) -> None:
        # Accept lists (and plain strings for the source) but store immutable values.
        if not isinstance(self.source, Source):
            object.__setattr__(self, "source", _source(self.source, "segment"))
        object.__setattr__(self, "token_ids", tuple(self.token_ids))
        if self.logprobs is not None:
            object.__setattr__(self, "logprobs", tuple(float(x) for x in self.logprobs))
        self.validate()

    def validate(self, where: str = "segment") -> None:
        for i, t in enumerate(self.token_ids):
            if not isinstance(t, int) or isinstance(t, bool) or t < 0:
                raise TrajectoryError(
                    f"{where}: token {i} is {t!r}; token ids must be non-negative ints"
                )
        if self.source is Source.POLICY:
            if self.logprobs is None:
                raise TrajectoryError(
                    f"{where}: policy segment of {len(self.token_ids)} tokens has no logprobs; "
                    "pass the sampler's per-token logprobs"
                )
            if len(self.logprobs) != len(self.token_ids):
                raise TrajectoryError(
                    f"{where}: policy segment has {len(self.token_ids)} tokens but "
                    f"{len(self.logprobs)} logprobs; the sampler must return one per token"
                )
            for i, lp in enumerate(self.logprobs):
                if math.isnan(lp) or lp > 0.0:
                    raise TrajectoryError(
                        f"{where}: logprob {i} is {lp!r}; a log-probability is a number <= 0"
                    )
            if not self.token_ids:
                raise TrajectoryError(
                    f"{where}: policy segment is empty; a model turn has at least its stop token"
                )
        elif self.logprobs is not None:
            raise TrajectoryError(
                f"{where}: a {self.source.value} segment carries logprobs; only policy tokens "
                "have sampling logprobs"
            )

    @property
    def loss_mask(self) -> tuple[int, ...]:
        bit = 1 if self.source is Source.POLICY else 0
        return (bit,) * len(self.token_ids)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"source": self.source.value, "token_ids": list(self.token_ids)}
        if self.logprobs is not None:
            d["logprobs"] = list(self.logprobs)
        d["step"] = self.step
        for key in ("tool_call_id", "text", "policy_version", "finish_reason"):
            value = getattr(self, key)
            if value is not None:
                d[key] = value
        return d

    @classmethod
    def from_dict(cls, d: Any, where: str = "segment") -> Segment:
        if not isinstance(d, dict):
            raise TrajectoryError(f"{where}: expected a JSON object, got {type(d).__name__}")
        unknown = set(d) - _SEGMENT_KEYS
        if unknown:
            raise TrajectoryError(f"{where}: unknown keys {sorted(unknown)}")
        if "source" not in d or "token_ids" not in d:
            raise TrajectoryError(f"{where}: needs 'source' and 'token_ids'")
        _expect(d["token_ids"], list, where, "token_ids")
        logprobs = d.get("logprobs")
        if logprobs is not None:
            _expect(logprobs, list, where, "logprobs")
            for i, lp in enumerate(logprobs):
                if isinstance(lp, bool) or not isinstance(lp, int | float):
                    raise TrajectoryError(f"{where}: logprobs[{i}] is {lp!r}, not a number")
        _expect(d.get("step", 0), int, where, "step")
        for key in ("tool_call_id", "text", "finish_reason"):
            _expect(d.get(key), str | None, where, key)
        _expect(d.get("policy_version"), int | None, where, "policy_version")
        try:
            return cls(
                source=_source(d["source"], where),
                token_ids=d["token_ids"],
                logprobs=logprobs,
                step=d.get("step", 0),
                tool_call_id=d.get("tool_call_id"),
                text=d.get("text"),
                policy_version=d.get("policy_version"),
                finish_reason=d.get("finish_reason"),
            )
        except TrajectoryError as e:
            raise TrajectoryError(str(e).replace("segment:", f"{where}:", 1)) from None


def _expect(value: Any, types: Any, where: str, key: str) -> None:
    if isinstance(value, bool) or not isinstance(value, types):
        want = getattr(types, "__name__", str(types))
        raise TrajectoryError(f"{where}: '{key}' is {value!r}; expected {want}")


_SEGMENT_KEYS = {
    "source",
    "token_ids",
    "logprobs",
    "step",
    "tool_call_id",
    "text",
    "policy_version",
    "finish_reason",
}


def _source(value: Any, where: str) -> Source:
    try:
        return Source(value)
    except ValueError:
        valid = ", ".join(s.value for s in Source)
        raise TrajectoryError(f"{where}: unknown source {value!r}; valid: {valid}") from None


@dataclass(frozen=True)
class Trajectory:
    """One sample: the token sequence a learner trains on, with provenance per token.

    An episode is usually one trajectory. When a chat template is not prefix-preserving (it
    re-renders earlier turns differently once later messages arrive), the renderer closes the
    current trajectory and starts a new one rather than train on tokens the model never saw;
    `sample_index` numbers them within the episode.

    `steps`, `receipt` and `reward` are filled by the rollout and reward stages; they are plain
    JSON-able values so the run directory stays readable by any tool.
    """

    segments: tuple[Segment, ...]
    steps: tuple[dict[str, Any], ...] = ()
    receipt: dict[str, Any] | None = None
    reward: dict[str, Any] | None = None
    episode_id: str | None = None
    sample_index: int = 0
    agent: str = ""
    """Which agent of the episode sampled it: "" for the episode's own, ``d0``, ``d1``...
    for its sub-agents (`tracerl.rollout.context.subagents`): their samples are the
    episode's too."""
    # Memoised derived arrays (not part of equality or serialization).
    _cache: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "segments", tuple(self.segments))
        object.__setattr__(self, "steps", tuple(self.steps))
        for i, seg in enumerate(self.segments):  # each Segment validated itself when built
            if not isinstance(seg, Segment):
                raise TrajectoryError(f"segment {i}: expected a Segment, got {type(seg).__name__}")
        self.check()

    # ---- derived views (computed once; each access returns a fresh list) -----------------
    def _derived(self, key: str) -> tuple[Any, ...]:
        if key not in self._cache:
            segs = self.segments
            if key == "token_ids":
                value: tuple[Any, ...] = tuple(t for s in segs for t in s.token_ids)
            elif key == "loss_mask":
                value = tuple(m for s in segs for m in s.loss_mask)
            elif key == "sources":
                value = tuple(s.source for s in segs for _ in s.token_ids)
            else:
                value = tuple(
                    lp
                    for s in segs
                    for lp in (s.logprobs if s.logprobs is not None else (0.0,) * len(s.token_ids))
                )
            self._cache[key] = value
        return self._cache[key]

    @property
    def token_ids(self) -> list[int]:
        return list(self._derived("token_ids"))

    @property
    def loss_mask(self) -> list[int]:
        return list(self._derived("loss_mask"))

    @property
    def sources(self) -> list[Source]:
        return list(self._derived("sources"))

    @property
    def logprobs(self) -> list[float]:
        """Per-token sampling logprobs, 0.0 where the token was not sampled (mask 0)."""
        return list(self._derived("logprobs"))

    def __len__(self) -> int:
        return len(self._derived("token_ids"))

    def count(self, source: Source | str) -> int:
        """Number of tokens authored by `source`."""
        source = _source(source, "count")
        return sum(len(s.token_ids) for s in self.segments if s.source is source)

    def policy_segments(self) -> list[Segment]:
        return [s for s in self.segments if s.source is Source.POLICY]

    # ---- invariants ----------------------------------------------------------------------
    def check(self) -> None:
        """Raise TrajectoryError unless every provenance invariant holds."""
        ids, mask, sources = self.token_ids, self.loss_mask, self.sources
        if not (len(ids) == len(mask) == len(sources) == len(self.logprobs)):
            raise TrajectoryError(
                f"trajectory: {len(ids)} tokens but {len(mask)} mask bits, "
                f"{len(sources)} sources and {len(self.logprobs)} logprobs"
            )
        for i, (m, src) in enumerate(zip(mask, sources, strict=True)):
            if m != (1 if src is Source.POLICY else 0):
                raise TrajectoryError(
                    f"trajectory: token {i} ({src.value}) has loss_mask {m}; "
                    "loss_mask must be 1 exactly on policy tokens"
                )
        sampled = sum(len(s.token_ids) for s in self.policy_segments())
        if sum(mask) != sampled:
            raise TrajectoryError(
                f"trajectory: {sum(mask)} loss tokens but {sampled} sampled tokens"
            )

    # ---- serialization -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "episode_id": self.episode_id,
            "sample_index": self.sample_index,
            **({"agent": self.agent} if self.agent else {}),
            "segments": [s.to_dict() for s in self.segments],
            "steps": list(self.steps),
            "receipt": self.receipt,
            "reward": self.reward,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "trajectory") -> Trajectory:
        if d.get("schema") != SCHEMA:
            raise TrajectoryError(
                f"{where}: schema is {d.get('schema')!r}, expected {SCHEMA!r}; "
                "was this file written by another tool or a newer tracerl?"
            )
        segs = d.get("segments")
        _expect(segs, list, where, "segments")
        steps = d.get("steps") or []
        _expect(steps, list, where, "steps")
        for i, step in enumerate(steps):
            _expect(step, dict, f"{where}, step {i}", "step")
        _expect(d.get("sample_index", 0), int, where, "sample_index")
        _expect(d.get("episode_id"), str | None, where, "episode_id")
        _expect(d.get("agent", ""), str, where, "agent")
        for key in ("receipt", "reward"):
            _expect(d.get(key), dict | None, where, key)
        return cls(
            segments=tuple(
                Segment.from_dict(s, where=f"{where}, segment {i}") for i, s in enumerate(segs)
            ),
            steps=tuple(steps),
            receipt=d.get("receipt"),
            reward=d.get("reward"),
            episode_id=d.get("episode_id"),
            sample_index=d.get("sample_index", 0),
            agent=d.get("agent", ""),
        )
