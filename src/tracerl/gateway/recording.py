"""What a finished gateway session records beyond a runner episode: in the receipt, the
tools as the harness offered them (versions are schema hashes: the harness runs the tools),
their effects unknown and unguarded (``side_effect_guard: unmanaged``), and the agent's
account (requests, history breaks, the request left unanswered, ignored parameters)."""

from __future__ import annotations

import dataclasses
from typing import Any

from tracerl.gateway.chat import tool_version
from tracerl.rollout.episode import Episode


def gateway_episode(
    episode: Episode, first_tools: list[dict[str, Any]] | None, agent: dict[str, Any]
) -> Episode:
    """`episode` (from `finish_episode`) with the gateway's receipt, on each of its own
    samples (a child session's keep theirs: `tracerl.gateway.tree`)."""
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
    episode.trajectories = [  # a child session's samples keep the child's own receipt
        t if t.agent else dataclasses.replace(t, receipt=d, _cache={}) for t in episode.trajectories
    ]
    return episode
