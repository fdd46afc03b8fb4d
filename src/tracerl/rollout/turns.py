"""Before each model turn: which budget (if any) stops the episode, and the turn's sample
request. Shared by tracerl's episode runner and the gateway's sessions
(`tracerl.gateway.session`), so an episode is budgeted and seeded the same either way."""

from __future__ import annotations

from typing import Any

from tracerl.rollout.budget import Budgets, Ledger, RolloutConfig
from tracerl.rollout.episode import episode_seed
from tracerl.rollout.sampler import SampleRequest
from tracerl.types import StopReason


def budget_stop(budgets: Budgets, ledger: Ledger, elapsed: float) -> StopReason | None:
    """Which budget (if any) stops the episode before its next model turn: wall time,
    model turns, sampled tokens, context (`ledger.context_tokens` up to date)."""
    used = ledger.used
    if budgets.wall_time_s is not None and elapsed >= budgets.wall_time_s:
        return StopReason.TIMEOUT
    if used["steps"] >= budgets.steps:
        return StopReason.MAX_STEPS
    if budgets.sampled_tokens is not None and used["sampled_tokens"] >= budgets.sampled_tokens:
        return StopReason.MAX_TOKENS
    if budgets.context_tokens is not None and ledger.context_tokens >= budgets.context_tokens - 1:
        return StopReason.CONTEXT_OVERFLOW
    return None


def context_room(cfg: RolloutConfig, ledger: Ledger) -> int | None:
    """The tokens the context budget leaves for the next turn (None: no context budget)."""
    room = cfg.budgets.context_tokens
    return None if room is None else room - ledger.context_tokens


def turn_request(
    conv: Any,
    cfg: RolloutConfig,
    ledger: Ledger,
    seed: int,
    episode_id: str,
    *,
    asked: int | None = None,
    turn_tokens: int | None = None,
) -> SampleRequest:
    """The next model turn's request: the token stream so far, at most
    `cfg.max_turn_tokens` (or `turn_tokens`: a summarize turn's own limit; and `asked`, a
    client's own max_tokens) within what the sampled-
    token and context budgets leave, the turn's own seed (so the episode is reproducible
    under any batching)."""
    b, used = cfg.budgets, ledger.used
    limit = turn_tokens or cfg.max_turn_tokens  # a summarize turn has its own limit
    limit = limit if asked is None else min(limit, asked)
    if b.sampled_tokens is not None:
        limit = min(limit, b.sampled_tokens - used["sampled_tokens"])
    room = context_room(cfg, ledger)
    if room is not None:
        limit = min(limit, room)
    return SampleRequest(
        conv.token_ids,
        max_tokens=max(1, limit),
        stop_token_ids=conv.renderer.stop_token_ids,
        seed=episode_seed(seed, episode_id, "turn", conv.step),
        episode_id=episode_id,
        turn=conv.step,
        last=b.steps - used["steps"] <= 1,  # the step budget's last model turn
    )
