"""Sub-agents with rewards of their own: their advantages.

A child episode (``rollout.subagents``) is part of its parent's episode: by default its
samples train with the parent's advantage. Where the environment grades children
(``subagent_reward``, recorded as ``reward`` in the receipt's ``children``), a child's
samples train with an advantage of its own instead, taken the way the run takes the
episode's (``trainer.advantage``) over a group of its peers: the children at the same place
(``d0``, ``d1``, ``d0/d0``...) in the eligible episodes of the same group. The parent's
baseline is untouched (each episode still counts once in its group), and the parent's own
samples keep the parent's advantage.

A peer group of one has nothing to compare with: its child gets the advantage 0, as a
group of one does in GRPO. A child whose grading failed (``reward_error``: the evaluator's
fault) trains on nothing: its samples are left out of the update.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tracerl.algos.advantages import get as get_advantage

LEFT_OUT = None
"""The advantage of a child whose grading failed: its samples are left out."""


def child_rewards(episode: Any) -> dict[str, float | None]:
    """Each graded child of `episode` (every depth): its agent path and its own reward (None:
    the grading failed). Children the environment did not grade are absent."""
    found: dict[str, float | None] = {}
    seen: set[str] = set()
    for t in getattr(episode, "trajectories", ()):  # a bare outcome has no samples
        receipt = t.receipt or {}
        key = str(receipt.get("replay_id") or id(receipt))
        if key in seen:
            continue
        seen.add(key)
        for record in receipt.get("children") or ():
            if "reward" in record:
                found[record["agent"]] = record["reward"]
    return found


def child_advantages(
    groups: Sequence[Sequence[Any]], eligible: Sequence[bool], advantage: str
) -> dict[tuple[int, str], float | None]:
    """(episode index in the batch, agent path) -> the child's advantage (None: left out),
    for every graded child of an eligible episode."""
    out: dict[tuple[int, str], float | None] = {}
    i = 0
    for group in groups:
        peers: dict[str, list[tuple[int, float]]] = {}
        for e in group:
            if eligible[i]:
                for agent, r in child_rewards(e).items():
                    if r is None:
                        out[(i, agent)] = LEFT_OUT
                    else:
                        peers.setdefault(agent, []).append((i, r))
            i += 1
        for agent, members in peers.items():
            rewards_B = torch.tensor([r for _, r in members], dtype=torch.float32)
            zeros = torch.zeros(len(members), dtype=torch.long)
            ok = torch.ones(len(members), dtype=torch.bool)
            adv = get_advantage(advantage)(rewards_B, zeros, ok).tolist()
            out.update({(j, agent): a for (j, _), a in zip(members, adv, strict=True)})
    return out


def child_reward_metrics(groups: Sequence[Sequence[Any]]) -> dict[str, float]:
    """``train/subagent_reward_mean`` (over graded children) and
    ``train/subagent_reward_errors`` (children whose grading failed); none without any."""
    rewards = [r for g in groups for e in g for r in child_rewards(e).values()]
    if not rewards:
        return {}
    ok = [r for r in rewards if r is not None]
    out = {"train/subagent_reward_errors": float(len(rewards) - len(ok))}
    if ok:
        out["train/subagent_reward_mean"] = sum(ok) / len(ok)
    return out
