"""Budgets, the terminal reserve, and the ledger that accounts for them.

A budget is not just a cap. The ledger records, per step, the action, its cost in
milliseconds, its tokens and the evidence it gained (as the environment judges it; 0 when
unknown), so training data shows what each step bought. The terminal reserve keeps the last
steps (and, for write tasks, the last tool calls) for finishing: when the remaining budget
reaches it, exploration stops and the agent is routed to finalize — summarize, answer, commit
or ask for clarification — instead of being cut off mid-search.

The ledger's JSON follows the design notes' shape (``rollout_id``, ``budgets``, ``events``,
``stop_reason``, ``side_effect_guard``), so a person can read it without knowing tracerl.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tracerl.rollout.context.config import ContextConfig, SubagentConfig
from tracerl.types import StopReason


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)


class Budgets(_Config):
    """Per-episode limits. None means unlimited."""

    steps: int = Field(8, ge=1)
    """Model turns (each turn and the observation answering it is one step)."""
    tool_calls: int | None = Field(8, ge=0)
    """Tool calls the environment executed, over the whole episode (a refused call costs its
    step, not a call)."""
    sampled_tokens: int | None = Field(2048, ge=1)
    """Tokens the policy may sample over the whole episode."""
    context_tokens: int | None = Field(4096, ge=16)
    """The longest the token stream (prompt + everything since) may grow."""
    write_actions: int | None = Field(1, ge=0)
    """Write-tool calls (dry runs included): side effects are counted separately."""
    wall_time_s: float | None = Field(None, gt=0)
    """Wall-clock seconds for the episode; checked before each model turn."""


class TerminalReserve(_Config):
    """What the budget keeps back so the agent can still finish (`terminal_reserve_policy`)."""

    min_steps_for_finalize: int = Field(1, ge=0)
    """When this many steps remain, exploration stops and the agent is asked to finalize."""
    min_tool_calls_for_commit: int = Field(1, ge=0)
    """For write tasks: tool calls kept for the commit; exploration may not spend them. A
    write task whose budget cannot hold this reserve is blocked before it starts."""
    instruction: str = (
        "Budget nearly spent: stop exploring. Using what you found so far, give your final "
        "answer now (commit the action if it is justified, or say what is missing)."
    )
    """Shown to the model as a user turn (environment tokens, never trained on)."""


class MarginalGainStop(_Config):
    """Stop exploring after `patience` consecutive steps that each gained less than
    `threshold` evidence."""

    threshold: float = Field(0.05, ge=0)
    """A tool step whose evidence gain (as the environment judges it; 0 when it reports
    none) is below this counts as low-gain."""
    patience: int = Field(2, ge=1)
    """Consecutive low-gain tool steps that close exploration (with a reserve: the agent is
    asked to finalize; without one: the episode stops)."""


class RetryPolicy(_Config):
    """Retries for retryable infrastructure faults, with exponential backoff."""

    max_retries: int = Field(2, ge=0)
    """Retries of an environment step whose tool calls failed with a retryable
    infrastructure fault (only the failed calls are sent again; a write that timed out never
    is); 0: none. When they run out, the episode is the environment's failure."""
    backoff_s: float = Field(0.05, ge=0)
    """Seconds before the first retry."""
    backoff_factor: float = Field(2.0, ge=1)
    """Each further retry waits this many times longer."""
    max_backoff_s: float = Field(2.0, ge=0)
    """The longest wait between two attempts, in seconds."""

    def delay(self, attempt: int) -> float:
        return min(self.max_backoff_s, self.backoff_s * self.backoff_factor**attempt)


class RolloutConfig(_Config):
    """Everything that shapes an episode besides the policy and the environment."""

    budgets: Budgets = Budgets()
    """Per-episode limits: steps, tool calls, tokens, wall time."""
    reserve: TerminalReserve | None = TerminalReserve()
    """None: no reserve; budgets are hard caps that cut the episode off."""
    marginal_gain: MarginalGainStop | None = None
    """Stop exploring when tool steps stop gaining evidence; None: off."""
    retry: RetryPolicy = RetryPolicy()
    """Retries of environment steps that failed for infrastructure reasons."""
    max_turn_tokens: int = Field(256, ge=1)
    """The most tokens sampled in one model turn."""
    context: ContextConfig = ContextConfig()
    """What an episode does when its context fills up: stop (default), compact (a summary
    and the last turns in a new sample) or drop old tool outputs (docs/long-horizon.md)."""
    subagents: SubagentConfig | None = None
    """Let the policy delegate sub-tasks to child episodes of itself (the environment offers
    the tool); None: off (docs/long-horizon.md)."""
    observation_max_tokens: int = Field(512, ge=8)
    """Longer tool outputs are cut to this many tokens, with a visible marker."""
    max_parse_errors: int = Field(3, ge=1)
    """Stop after this many unreadable model turns."""
    unknown_rate_warning: float = Field(0.05, ge=0, le=1)
    """Warn when more than this share of steps fails with an unattributed fault."""
    weight_sync: Literal["none", "between_turns"] = "none"
    """How the weights may change under a running episode: ``none`` (synchronous training:
    never), ``between_turns`` (asynchronous: a turn finishes on the weights it started
    with; later turns may use newer ones, each turn's tokens carry their version). A record
    more than a setting: asynchronous training sets ``between_turns`` itself, and the value is
    kept in each episode's receipt."""

    @model_validator(mode="after")
    def _context_room(self) -> RolloutConfig:
        """A context policy needs room for what it keeps in reserve (docs/long-horizon.md)."""
        c, limit = self.context, self.budgets.context_tokens
        if c.policy == "stop" or limit is None:
            return self
        if c.policy == "compact" and c.summarizer.by == "policy":
            reserve = c.reserve_tokens or self.max_turn_tokens + self.observation_max_tokens
            need, what = reserve + c.summarizer.max_tokens, "the reserve and a summarize turn"
        else:
            need, what = c.reserve_tokens or self.max_turn_tokens, "the reserve"
        if need >= limit:
            raise ValueError(
                f"rollout.context.policy={c.policy}: {what} ({need} tokens) leave no room in "
                f"budgets.context_tokens={limit}: raise context_tokens, or lower "
                "max_turn_tokens, observation_max_tokens, context.reserve_tokens or "
                "context.summarizer.max_tokens"
            )
        return self


class Ledger:
    """Budget accounting for one episode."""

    def __init__(
        self, rollout_id: str, task_id: str, budgets: Budgets, reserve: TerminalReserve | None
    ) -> None:
        self.rollout_id, self.task_id = rollout_id, task_id
        self.budgets, self.reserve = budgets, reserve
        self.used = {"steps": 0, "tool_calls": 0, "sampled_tokens": 0, "write_actions": 0}
        # what keeping the context in budget cost (`tracerl.rollout.context`)
        self.used.update(compactions=0, summary_tokens=0, summarizer_calls=0)
        self.context_tokens = 0
        self.events: list[dict[str, Any]] = []
        self.elapsed_s: list[float] = []  # wall time before each model turn (replay reuses it)
        self.low_gain_streak = 0
        self.finalize: str | None = None  # why exploration was closed, once it is

    def remaining(self, key: str) -> int | None:
        limit = getattr(self.budgets, key)
        return None if limit is None else limit - self.used[key]

    def record(
        self, step: int, action: str, cost_ms: float, tokens: int, evidence_gain: float | None
    ) -> None:
        self.events.append(
            {
                "step": step,
                "action": action,
                "cost_ms": round(cost_ms, 1),
                "tokens": tokens,
                "evidence_gain": round(evidence_gain or 0.0, 4),
            }
        )

    def write_reserve_fits(self) -> bool:
        """Can a write task start with its commit reserve and a finalize step intact?"""
        r, b = self.reserve, self.budgets
        need_calls = max(1, r.min_tool_calls_for_commit if r else 1)
        if b.write_actions is not None and b.write_actions < 1:
            return False
        if b.tool_calls is not None and b.tool_calls < need_calls:
            return False
        return r is None or b.steps > r.min_steps_for_finalize

    def gate(
        self, calls: Sequence[Any], write_tools: set[str], write_task: bool
    ) -> tuple[list[Any], dict[str, str], str | None]:
        """Which tool calls of a step may run: (allowed calls, refusal reason per call id, a
        stop reason if one refusal ends the episode). Refusing a read that would eat into the
        commit reserve closes exploration (`finalize`)."""
        allowed, reasons, stop = [], {}, None
        calls_left = self.remaining("tool_calls")
        writes_left = self.remaining("write_actions")
        commit_reserve = self.reserve.min_tool_calls_for_commit if self.reserve else 0
        for call in calls:
            is_write = call.name in write_tools
            reason = None
            if is_write and not write_task:
                reason = "this task permits no write actions"
            elif is_write and writes_left is not None and writes_left <= 0:
                reason, stop = "the write budget is spent", "write_blocked"
            elif calls_left is not None and calls_left <= 0:
                reason = "the tool-call budget is spent; answer now"
            elif not is_write and self.finalize:
                reason = "exploration is closed (budget reserve); give your final answer"
            elif not is_write and write_task and _below(calls_left, 1 + commit_reserve):
                reason = "the remaining tool calls are reserved for committing; finalize now"
                self.finalize = self.finalize or "reserve_reached"
            if reason is not None:
                reasons[call.id] = reason
                continue
            allowed.append(call)
            calls_left = None if calls_left is None else calls_left - 1
            writes_left = None if writes_left is None or not is_write else writes_left - 1
        return allowed, reasons, stop

    def after_tool_step(self, cfg: RolloutConfig, write_task: bool) -> StopReason | None:
        """After a tool step: close exploration when the reserve (or low evidence gain) says
        so (`finalize`); without a reserve, the budget is a hard cap and the episode stops
        instead (the stop reason returned)."""
        gain = self.events[-1]["evidence_gain"]
        mg = cfg.marginal_gain
        if mg is not None:
            self.low_gain_streak = self.low_gain_streak + 1 if gain < mg.threshold else 0
        if self.finalize:
            return None
        trigger = None
        r = cfg.reserve
        steps_left = cfg.budgets.steps - self.used["steps"]
        calls_left = self.remaining("tool_calls")
        if mg is not None and self.low_gain_streak >= mg.patience:
            trigger = StopReason.MARGINAL_GAIN
        elif r is not None and steps_left <= r.min_steps_for_finalize:
            trigger = StopReason.RESERVE_REACHED
        elif calls_left is not None and calls_left <= (
            r.min_tool_calls_for_commit if r and write_task else 0
        ):
            trigger = StopReason.RESERVE_REACHED if r else StopReason.MAX_TOOL_CALLS
        if trigger is None or steps_left <= 0:
            return None  # out of steps: the next turn's budget check stops the episode
        if r is None:
            return trigger
        self.finalize = trigger.value
        return None

    def to_dict(self, stop_reason: str | None, side_effect_guard: str) -> dict[str, Any]:
        return {
            "rollout_id": self.rollout_id,
            "task": self.task_id,
            "budgets": self.budgets.model_dump(),
            "reserve": self.reserve.model_dump(exclude={"instruction"}) if self.reserve else None,
            "used": {**self.used, "context_tokens": self.context_tokens},
            "events": self.events,
            "finalize": self.finalize,
            "elapsed_s": self.elapsed_s,
            "stop_reason": stop_reason,
            "side_effect_guard": side_effect_guard,
        }


def _below(left: int | None, need: int) -> bool:
    return left is not None and left < need
