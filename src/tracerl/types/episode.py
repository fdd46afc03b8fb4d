"""How an episode ended and whose fault each failure was.

An environment outage, a crashing verifier and a policy mistake are different things, and
only the last may teach the policy anything. `FaultKind` names each failure, `Attribution`
names its owner, and `StopReason` says why an episode ended (mirrored into metrics as
``stop/<reason>``). The `Receipt` is what every episode carries so it can be audited and
replayed.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from tracerl.types.trajectory import TrajectoryError


class StopReason(StrEnum):
    """Why an episode ended. Exactly one per episode."""

    ANSWERED = "answered"
    """The agent gave its final answer."""
    ENV_TERMINATED = "env_terminated"
    """The environment ended the episode (its task reached an end state after a tool call, or
    it cut the episode short)."""
    MAX_STEPS = "max_steps"
    MAX_TOOL_CALLS = "max_tool_calls"
    MAX_TOKENS = "max_tokens"
    """The sampled-token budget ran out (or a turn hit its token limit with none left)."""
    CONTEXT_OVERFLOW = "context_overflow"
    MARGINAL_GAIN = "marginal_evidence_gain_below_threshold"
    """Several steps in a row added (almost) no evidence, and the agent did not finalize."""
    RESERVE_REACHED = "reserve_reached"
    """The budget reached its terminal reserve and the agent did not finalize in it."""
    WRITE_BLOCKED = "write_blocked"
    """A write task could not start (or go on) without breaking its reserve or the guard."""
    PARSE_ERROR_LIMIT = "parse_error_limit"
    INFRA_FAILURE = "infra_failure"
    """The environment kept failing after retries: not the policy's doing."""
    TIMEOUT = "timeout"
    """The episode's wall-time budget ran out. Wall time measures the machine as much as the
    policy, so such an episode is attributed to the environment."""
    AGENT_ERROR = "agent_error"
    """An agent harness driving the model through the gateway (`tracerl.gateway`) raised,
    or finished without calling the model. Whose fault it is says the attribution: the
    environment's (the harness and its tools are the environment), unless it crashed on
    the model's own unreadable output."""

    @property
    def is_budget(self) -> bool:
        """True for endings where a budget, not the agent, stopped the episode."""
        return self in _BUDGET_STOPS


_BUDGET_STOPS = frozenset(
    {
        StopReason.MAX_STEPS,
        StopReason.MAX_TOOL_CALLS,
        StopReason.MAX_TOKENS,
        StopReason.CONTEXT_OVERFLOW,
        StopReason.MARGINAL_GAIN,
        StopReason.RESERVE_REACHED,
        StopReason.TIMEOUT,
    }
)


class Attribution(StrEnum):
    """Whose doing an outcome (or a failure) is."""

    POLICY = "policy"
    """The environment was healthy: the outcome is the policy's, good or bad."""
    ENVIRONMENT = "environment"
    """An outage or degraded service shaped the outcome: never a signal for the policy."""
    EVALUATOR = "evaluator"
    """The reward code failed: the score means nothing."""
    UNKNOWN = "unknown"
    """Nobody can tell: fix observation and logging before trusting (or scaling) training."""


class FaultKind(StrEnum):
    """A classified failure. Each kind has one owner (`attribution`)."""

    # infrastructure: the environment's fault
    TIMEOUT = "timeout"
    SERVER_ERROR = "server_error"  # a 5xx from a service
    CONNECTION_REFUSED = "connection_refused"
    SANDBOX_FAILED = "sandbox_failed"  # the sandbox did not start
    TRUNCATED_OUTPUT = "truncated_output"  # a service returned a cut-off answer
    # policy: the model's fault
    UNKNOWN_TOOL = "unknown_tool"
    INVALID_ARGUMENTS = "invalid_arguments"
    FORBIDDEN_TOOL = "forbidden_tool"  # a tool or action the task does not permit
    PARSE_ERROR = "parse_error"
    # evaluator: the reward code's fault
    EVALUATOR_CRASHED = "evaluator_crashed"
    UNKNOWN = "unknown"  # an exception nobody classified

    @property
    def attribution(self) -> Attribution:
        if self in _INFRA:
            return Attribution.ENVIRONMENT
        if self in _POLICY:
            return Attribution.POLICY
        if self is FaultKind.EVALUATOR_CRASHED:
            return Attribution.EVALUATOR
        return Attribution.UNKNOWN

    @property
    def retryable_by_default(self) -> bool:
        """Transient infrastructure failures are worth retrying; nothing else is."""
        return self in _RETRYABLE


_INFRA = frozenset(
    {
        FaultKind.TIMEOUT,
        FaultKind.SERVER_ERROR,
        FaultKind.CONNECTION_REFUSED,
        FaultKind.SANDBOX_FAILED,
        FaultKind.TRUNCATED_OUTPUT,
    }
)
_POLICY = frozenset(
    {
        FaultKind.UNKNOWN_TOOL,
        FaultKind.INVALID_ARGUMENTS,
        FaultKind.FORBIDDEN_TOOL,
        FaultKind.PARSE_ERROR,
    }
)
_RETRYABLE = frozenset(
    {
        FaultKind.TIMEOUT,
        FaultKind.SERVER_ERROR,
        FaultKind.CONNECTION_REFUSED,
        FaultKind.SANDBOX_FAILED,
    }
)


@dataclass(frozen=True)
class Fault:
    """One failure, as a value.

    Attributes:
        kind: what failed (its owner follows from it).
        message: for the model (policy faults are shown to it) and for people.
        retryable: whether trying again may succeed; defaults from the kind.
        exception_type: the Python exception behind it, if any ("TimeoutError").
        injected: True when a `FaultInjector` made it (tests, adversarial eval, benchmarks).
    """

    kind: FaultKind
    message: str
    retryable: bool | None = None
    exception_type: str | None = None
    injected: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", FaultKind(self.kind))
        if self.retryable is None:
            object.__setattr__(self, "retryable", self.kind.retryable_by_default)

    @property
    def attribution(self) -> Attribution:
        return self.kind.attribution

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["kind"] = self.kind.value
        d["attribution"] = self.attribution.value
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Fault:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


@dataclass
class Receipt:
    """What every episode carries: enough to audit it and to replay it.

    `to_dict()` is what lands in the run directory (`Trajectory.receipt`).
    """

    replay_id: str
    """Unique id of this rollout (``ro_<hex>``); `tracerl replay RUN ID` finds it."""
    episode_id: str
    env: dict[str, Any]
    """``{"name", "version", "kwargs"}``: how to rebuild the environment with `make`."""
    tool_versions: dict[str, str]
    tool_schemas: list[dict[str, Any]]
    """The env's tool schemas (and each tool's effect under ``x-effect``)."""
    task_id: str
    task: dict[str, Any]
    """The task as given to `reset` (JSON), so a live replay can run it again."""
    seed: int
    policy_version: int | None
    model_id: str
    template_hash: str
    template_kwargs: dict[str, Any]
    """Values the chat template saw (e.g. the frozen date), so replay renders identically."""
    parser: str
    side_effect_guard: str
    rollout: dict[str, Any]
    """The rollout settings that shaped the episode (budgets, reserve, retries...)."""
    tools_in_prompt: bool = True
    """Whether the prompt rendered `tool_schemas` (a tag protocol such as Search-R1's
    describes its tools in words instead), so replay renders the same prompt."""
    reset_messages: list[dict[str, Any]] = field(default_factory=list)
    """What `reset` returned: the recorded start of the tool I/O."""
    error: str | None = None
    """What crashed the episode, if anything (a failed reset, a runner or env exception)."""
    steps: list[dict[str, Any]] = field(default_factory=list)
    """Per step: ``{"step", "latency_ms", "exception"}`` (exception type name or None)."""
    ledger: dict[str, Any] = field(default_factory=dict)
    stop_reason: str | None = None
    attribution: str | None = None
    gradient_eligible: bool = True
    evidence: dict[str, Any] | None = None
    """Filled by the reward stage: what the verifier checked and found."""
    final_state: dict[str, Any] | None = None
    """What the environment's world looked like when the episode ended, read before it
    closed (`Env.final_state`; an MCP server's ``final_state`` calls): what a reward
    compares with the gold state. None: the environment reads none."""
    started_at: str | None = None
    wall_time_s: float | None = None
    agent: dict[str, Any] | None = None
    """For an episode an agent harness drove through the gateway (`tracerl.gateway`): the
    agent's import path, its session, requests, history breaks, what it returned or raised
    (and whose fault that was); None: tracerl's own episode runner."""
    compactions: list[dict[str, Any]] = field(default_factory=list)
    """Each time the context was compacted (``rollout.context``): the step, the tokens
    before and after, who wrote the summary (and its text), which of the old sample's
    messages were kept, dropped or replaced, the new sample's index."""
    children: list[dict[str, Any]] = field(default_factory=list)
    """The sub-agents it delegated to (``rollout.subagents``): per child its agent name
    (``d0``...), the step and call, its replay id, stop reason, owner, samples, sampled
    tokens, tool calls and answer."""
    parent: dict[str, Any] | None = None
    """A sub-agent's: the episode, replay id and step of the call that started it."""
    worker: dict[str, Any] | None = None
    """Where it ran when not in the training process (``{"backend": "ray", "worker",
    "node", "pid", "failed_attempts": [{"worker", "error"}]}``: rollout workers that died
    with it in flight, before the one that ran it); None: in process."""

    def to_dict(self) -> dict[str, Any]:
        """The receipt as plain data, a copy sharing nothing with it (what
        `dataclasses.asdict` gives, at a seventh of its cost: every episode makes one)."""
        return {f.name: _plain_copy(getattr(self, f.name)) for f in _RECEIPT_FIELDS}

    @classmethod
    def from_dict(cls, d: Any, where: str = "receipt") -> Receipt:
        if not isinstance(d, dict):
            raise TrajectoryError(f"{where}: expected a JSON object, got {type(d).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise TrajectoryError(f"{where}: unknown keys {sorted(unknown)}")
        required = {
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
        missing = required - set(d)
        if missing:
            raise TrajectoryError(
                f"{where}: missing {sorted(missing)}; was this episode written by tracerl's "
                "episode runner?"
            )
        return cls(**d)


_RECEIPT_FIELDS = dataclasses.fields(Receipt)
_ATOMS = (str, int, float, bool, type(None))


def _plain_copy(value: Any) -> Any:
    """A deep copy of JSON-like data (dicts, lists, tuples of atoms), as `dataclasses.asdict`
    copies a field's value; anything else as `asdict` does (a dataclass as a dict, the rest
    through `copy.deepcopy`)."""
    if isinstance(value, _ATOMS):
        return value
    kind = type(value)
    if kind is dict:
        return {k: _plain_copy(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return kind(_plain_copy(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return copy.deepcopy(value)
