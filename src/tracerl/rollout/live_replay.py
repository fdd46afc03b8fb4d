"""Live replay: send a recorded episode's actions to the live environment (rebuilt from the
receipt, with the side-effect guard on) and report, step by step, which observations
drifted from the recorded ones: an infra regression check. It does not judge the policy:
the actions are the recorded ones. A sub-agent's steps are sent where they ran (before the
step that delegated to it), and a drift in one is named by its agent (``d0:1``).

An episode an agent harness drove is replayed by the gateway, a layer up
(`tracerl.gateway.replay.replay_live`, passing its own as `agent`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tracerl.envs.base import Env, Message, StepResult
from tracerl.envs.parsers import Action
from tracerl.envs.registry import make_from_spec
from tracerl.rollout.replay import (
    ReplayError,
    _action,
    _no_agent_replay,
    _receipt,
    _receipt_of,
    _steps,
)
from tracerl.types import Receipt, Trajectory

AgentLiveReplay = Callable[[Sequence[Trajectory]], Awaitable["LiveReport"]]
"""The live replay of an agent harness's episode (`tracerl.gateway.replay`)."""


@dataclass
class Drift:
    step: int | str
    status: str  # "same", "drifted", "failed"
    detail: str = ""


@dataclass
class LiveReport:
    episode_id: str
    steps: list[Drift] = field(default_factory=list)

    @property
    def drifted(self) -> list[Drift]:
        return [d for d in self.steps if d.status != "same"]


async def replay_live(
    trajectories: Sequence[Trajectory],
    env: Env | None = None,
    *,
    agent: AgentLiveReplay | None = None,
) -> LiveReport:
    """Send the recorded actions to the live env; report per step what drifted.

    The env is rebuilt from the receipt with the side-effect guard on: a live replay never
    writes for real, whatever the recorded run was allowed to do. An episode an agent
    harness drove is replayed by `agent` (`tracerl.gateway.replay` passes its own); without
    one it raises `ReplayError`.
    """
    receipt = _receipt(trajectories)
    if receipt.agent is not None:  # the agent is the environment: run it again
        if env is not None:
            await env.close()
        if agent is None:
            raise _no_agent_replay(receipt)
        return await agent(trajectories)
    if env is None:
        try:
            env = make_from_spec(receipt.env, side_effect_guard="dry_run")
        except TypeError:  # an env without the guard argument: checked below
            env = make_from_spec(receipt.env)
    if getattr(env, "real_writes", False) or env.side_effect_guard != "dry_run":
        raise ReplayError("live replay runs only with side_effect_guard='dry_run'")
    report = LiveReport(receipt.episode_id)
    try:
        report.steps.append(await _live_reset(env, receipt))
        report.steps.append(_tool_drift(env, receipt))
        for agent, k, rec in _in_order(trajectories, receipt):
            attempts = [a for a in rec.get("attempts", []) if "calls" in a]
            if not attempts:
                continue
            label: int | str = f"{agent}:{k}" if agent else k
            final = attempts[-1]
            executed = {c["call_id"] for c in final["calls"]}
            action = _action(rec)
            calls = tuple(c for c in action.tool_calls if c.id in executed)
            try:
                live = await env.step(Action("", calls, action.answer))
            except Exception as e:  # an infra regression is a finding, not a crash
                report.steps.append(Drift(label, "failed", f"{type(e).__name__}: {e}"))
                continue
            report.steps.append(_compare(label, final, live))
    finally:
        await env.close()
    return report


def _in_order(
    trajectories: Sequence[Trajectory], receipt: Receipt
) -> list[tuple[str, int, dict[str, Any]]]:
    """Every agent's steps as they reached the environment: a step's sub-agents (which the
    runner runs before the step's own calls), then the step."""
    return _agent_steps(trajectories, receipt, "")


def _agent_steps(
    trajectories: Sequence[Trajectory], receipt: Receipt, agent: str
) -> list[tuple[str, int, dict[str, Any]]]:
    children: dict[int, list[str]] = {}
    for c in receipt.children:
        children.setdefault(c["step"], []).append(c["agent"])
    out: list[tuple[str, int, dict[str, Any]]] = []
    for k, rec in sorted(_steps(trajectories, agent).items()):
        for child in children.get(k, []):
            out += _agent_steps(trajectories, _receipt_of(trajectories, child), child)
        out.append((agent, k, rec))
    return out


async def _live_reset(env: Env, receipt: Receipt) -> Drift:
    try:
        messages = await env.reset(receipt.task, receipt.seed)
    except Exception as e:
        return Drift("reset", "failed", f"{type(e).__name__}: {e}")
    same = _contents(messages) == _contents(receipt.reset_messages)
    return Drift("reset", "same" if same else "drifted")


def _tool_drift(env: Env, receipt: Receipt) -> Drift:
    """The tools as the live env offers them (after its reset: an MCP server's listing)
    against the recorded versions: a server upgrade or a changed schema shows here."""
    live, recorded = env.tool_versions(), receipt.tool_versions
    changed = [
        f"{name}: recorded {recorded.get(name, 'absent')}, live {live.get(name, 'absent')}"
        for name in sorted({*live, *recorded})
        if live.get(name) != recorded.get(name)
    ]
    return Drift("tools", "drifted" if changed else "same", "; ".join(changed))


def _contents(messages: Sequence[Message]) -> list[tuple[Any, Any]]:
    return [(m.get("role"), m.get("content")) for m in messages]


def _compare(step: int | str, recorded: dict[str, Any], live: StepResult) -> Drift:
    faults = [f.kind.value for f in live.faults()]
    if _contents(live.messages) == _contents(recorded["messages"]):
        return Drift(step, "same")
    for (_, want), (_, got) in zip(
        _contents(recorded["messages"]), _contents(live.messages), strict=False
    ):
        if want != got:
            detail = f"recorded {str(want)[:80]!r}, live {str(got)[:80]!r}"
            break
    else:
        detail = f"recorded {len(recorded['messages'])} messages, live {len(live.messages)}"
    if faults:
        detail += f" (live faults: {', '.join(faults)})"
    return Drift(step, "drifted", detail)
