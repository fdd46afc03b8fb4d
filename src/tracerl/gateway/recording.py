"""How a gateway session ends and what it records beyond a runner episode: in the receipt, the
tools as the harness offered them (versions are schema hashes: the harness runs the tools),
their effects unknown and unguarded (``side_effect_guard: unmanaged``), and the agent's
account (requests, history breaks, the request left unanswered, ignored parameters)."""

from __future__ import annotations

import dataclasses
from typing import Any

from tracerl.gateway.chat import tool_version
from tracerl.rollout.episode import Episode, finish_episode
from tracerl.types import StopReason


def finish_session(
    session: Any, stop: StopReason, answer: Any, agent: dict[str, Any] | None
) -> Episode:
    """Close `session` (`GatewaySession.finish`): the episode it recorded, ended by `stop`.
    `answer` goes into the last step's ``info`` (what rewards read); `agent` into the
    receipt, with the session's own account."""
    session.closed = True
    if session.unanswered is not None and "why" not in session.unanswered:
        session.unanswered["why"] = "in_flight"  # the episode ended while it was sampled
    if answer is not None and session.records:
        session.records[max(session.records)]["info"] = {"answer": answer}
    session.delegation.finish()  # child sessions first: their samples join this episode
    episode = finish_episode(session, stop)
    account = {
        **(agent or {}),
        "session": session.episode_id,
        "requests": session.requests,
        "history_breaks": session.breaks,
        "unanswered": session.unanswered,
        "ignored_params": sorted(session.ignored),
        "protocols": sorted(session.protocols),
    }
    return gateway_episode(episode, session.first_tools, account, own=session.agent)


def session_summary(session: Any, *, tokens: bool = False) -> dict[str, Any]:
    """What `session` holds (`GatewaySession.summary`)."""
    samples = session.conv.samples() if session.conv is not None else []
    return {
        "session": session.episode_id,
        "requests": session.requests,
        "model_turns": session.ledger.used["steps"],
        "samples": [t.to_dict() for t in samples] if tokens else len(samples),
        "history_breaks": session.breaks,
        "closed": session.closed,
        "stop": session.stop.value if session.stop else None,
    }


def gateway_episode(
    episode: Episode,
    first_tools: list[dict[str, Any]] | None,
    agent: dict[str, Any],
    *,
    own: str = "",
) -> Episode:
    """`episode` (from `finish_episode`) with the gateway's receipt, on each of the
    session's own samples: those tagged `own` (``""`` for a root session, the child's name
    for a child session's, `tracerl.gateway.tree`). A root's episode also holds its
    children's samples, finished first: they keep the receipt their own session gave them
    (their tools, their breaks, the same ``unmanaged`` guard)."""
    receipt = dataclasses.replace(
        episode.receipt,
        tool_versions={t["function"]["name"]: tool_version(t) for t in first_tools or ()},
        tool_schemas=[{**t, "x-effect": "unknown"} for t in first_tools or ()],
        tools_in_prompt=bool(first_tools),
        side_effect_guard="unmanaged",
        agent=agent,
    )
    receipt.ledger["side_effect_guard"] = "unmanaged"
    d = receipt.to_dict()
    episode.receipt = receipt
    episode.trajectories = [
        dataclasses.replace(t, receipt=d, _cache={}) if t.agent == own else t
        for t in episode.trajectories
    ]
    return episode
