"""Credit per model turn: a step's episodes as `Turns`, a turn-level estimator
(`tracerl.algos.turn_advantages`), and per-token advantages for the learner.

Each model turn of an episode is one row: its episode, its index (turn order), the step's
own reward (what ``per: step`` reward components paid it, recorded on the step as
``step_reward``; 0 without any), whether the step may carry gradient (not when its
environment step failed), and its state: a hash of every token before the turn's policy
tokens (the prompt, the earlier turns and the observations), so two episodes are in the
same state exactly when everything they saw and did so far is identical. A turn's advantage
goes on that turn's policy tokens only; every other token of the row gets 0 (and has loss
mask 0 anyway).

The estimator's outcome of an episode is its reward minus what its turns were paid per
step, so that with no discount a turn's return from the first turn is the episode's whole
reward, nothing counted twice.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import torch

from tracerl.algos.turn_advantages import Turns
from tracerl.algos.turn_advantages import get as get_turn_advantage
from tracerl.types import Source


def episode_turns(episode: Any) -> list[dict[str, Any]]:
    """The episode's model turns in order: sample, token offset and length, step, state key
    and eligibility of each policy segment. The state key hashes every token before the
    turn (one running hash per sample, not a rehash of each prefix)."""
    steps = {s["step"]: s for s in episode.steps}
    # a sub-agent's turns count as the episode's turns at the step that delegated to it
    delegated = {c["agent"]: c["step"] for c in getattr(episode.receipt, "children", ())}
    turns, paid = [], set()
    for k, t in enumerate(episode.trajectories):
        offset, history = 0, hashlib.blake2b(digest_size=8)
        for seg in t.segments:
            if seg.source is Source.POLICY:
                own = not t.agent
                step = seg.step if own else delegated.get(t.agent.split("/")[0], seg.step)
                record = steps.get(step, {})
                # a step's reward is paid once, to its first turn (a step sampled twice:
                # a harness that rewrote its history), never to a sub-agent's turns
                first = own and step not in paid
                if own:
                    paid.add(step)
                turns.append(
                    {
                        "sample": k,
                        "offset": offset,
                        "length": len(seg.token_ids),
                        "step": step,
                        # a non-negative int64
                        "state": int.from_bytes(history.copy().digest(), "big") >> 1,
                        "eligible": not record.get("infra_error", False),
                        "reward": float(record.get("step_reward") or 0.0) if first else 0.0,
                    }
                )
            history.update(b"".join(i.to_bytes(4, "little") for i in seg.token_ids))
            offset += len(seg.token_ids)
    return sorted(turns, key=lambda x: (x["step"], x["sample"]))


def turn_level_advantages(
    episodes: Sequence[Any],
    rewards: Sequence[float],
    group_B: torch.Tensor,
    eligible: Sequence[bool],
    estimator: str,
    **params: Any,
) -> list[list[list[float]]]:
    """Per episode, per trajectory (sample): one advantage per token, the turn's on its
    policy tokens, 0 elsewhere."""
    rows: list[dict[str, Any]] = []
    outcome = [float(r) for r in rewards]
    for i, e in enumerate(episodes):
        for index, turn in enumerate(episode_turns(e)):
            rows.append({**turn, "episode": i, "index": index})
            outcome[i] -= turn["reward"]
    turns = Turns(
        episode_T=torch.tensor([r["episode"] for r in rows], dtype=torch.long),
        index_T=torch.tensor([r["index"] for r in rows], dtype=torch.long),
        reward_T=torch.tensor([r["reward"] for r in rows], dtype=torch.float64),
        eligible_T=torch.tensor([r["eligible"] for r in rows], dtype=torch.bool),
        state_T=torch.tensor([r["state"] for r in rows], dtype=torch.long),
    )
    adv_T = get_turn_advantage(estimator)(
        turns,
        torch.tensor(outcome, dtype=torch.float64),
        group_B,
        torch.tensor(list(eligible), dtype=torch.bool),
        **params,
    )
    out = [[[0.0] * len(t) for t in e.trajectories] for e in episodes]
    for r, a in zip(rows, adv_T.tolist(), strict=True):
        row = out[r["episode"]][r["sample"]]
        row[r["offset"] : r["offset"] + r["length"]] = [a] * r["length"]
    return out
