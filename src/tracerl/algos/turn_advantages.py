"""Turn-level advantage estimators: credit per model turn, not one number per episode.

    advantages_T = fn(turns, outcome_B, group_B, eligible_B)

A batch holds B episodes in groups (the episodes of one task); episode ``i`` has turns
``t = 0 .. T_i - 1`` (its model turns, in order). `Turns` gives one row per turn: which
episode, its index, the step's own reward (per-step process components: evidence gained,
a valid call, a cost; 0 when none), whether the turn may carry gradient (a turn whose
environment step failed may not), and a key of the state it acted from (a hash of the
observation history before it). `outcome_B` is each episode's outcome reward (what
it earned beyond its turns' own rewards; the whole reward when there are none),
`eligible_B` whether the episode may enter the gradient at all.

A turn's advantage applies to that turn's policy tokens only. Ineligible turns, and every
turn of an ineligible episode, get 0 and are never a baseline sample.

The return-to-go of turn t of episode i (discount gamma; the outcome arrives with the
last turn)::

    G[i, t] = sum_{k=t}^{T_i - 1} gamma^(k - t) r[i, k]  +  gamma^(T_i - 1 - t) R_i

Why the baselines below stay unbiased. The policy-gradient estimate of a turn,
``grad log pi(a_t | h_t) (G[i, t] - b)``, is unbiased for any baseline ``b`` that does not
depend on the action at t or later in episode i. Each baseline here is built from *other*
episodes only (leave-one-out): they were sampled independently of episode i, so whatever
they are, they cannot depend on its actions; which of them "reached turn t" is a fact about
them, not about episode i. The naive alternative, normalising each turn index by the mean
and standard deviation over the members that reached it *including itself* (and dividing by
a std computed over a different number of members at each index), correlates the baseline
with the turn's own return and scales turns of long and short episodes differently: biased
toward whichever length happens to have the smaller spread (veRL RFC #7244). No estimator
here divides by a standard deviation; scale the learning rate instead (Dr. GRPO's argument,
arXiv:2503.20783).

Pure tensor math: no I/O, no logging.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from tracerl.algos.advantages import get as get_outcome


@dataclass(frozen=True)
class Turns:
    """The batch's turns, one row per model turn."""

    episode_T: torch.Tensor
    """The episode (0 .. B - 1) the turn belongs to."""
    index_T: torch.Tensor
    """The turn's index within its episode (0-based, consecutive)."""
    reward_T: torch.Tensor
    """The step's own reward (per-step components); 0 when none."""
    eligible_T: torch.Tensor
    """Whether the turn may carry gradient (False: its environment step failed)."""
    state_T: torch.Tensor | None = None
    """A key of the state the turn acted from (equal keys: the same state); step groups
    need it."""


TurnAdvantageFn = Callable[..., torch.Tensor]
TURN_ADVANTAGES: dict[str, TurnAdvantageFn] = {}


def register(name: str) -> Callable[[TurnAdvantageFn], TurnAdvantageFn]:
    def add(fn: TurnAdvantageFn) -> TurnAdvantageFn:
        if name in TURN_ADVANTAGES:
            raise ValueError(f"turn advantage estimator {name!r} is already registered")
        TURN_ADVANTAGES[name] = fn
        return fn

    return add


def get(name: str) -> TurnAdvantageFn:
    if name not in TURN_ADVANTAGES:
        valid = ", ".join(TURN_ADVANTAGES)
        raise KeyError(f"unknown turn advantage estimator {name!r}; valid: {valid}")
    return TURN_ADVANTAGES[name]


def returns_to_go(turns: Turns, outcome_B: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """``G[i, t]`` for every turn (see the module docstring), in float64 and rounded to
    1e-9: two episodes with the same reward reached by different sums (step rewards in
    another order) get the same return, not two a rounding error apart, which a std in the
    denominator would blow up into an advantage."""
    r = turns.reward_T.double()
    out = torch.zeros_like(r)
    for i in torch.unique(turns.episode_T):
        rows = (turns.episode_T == i).nonzero().flatten()
        rows = rows[torch.argsort(turns.index_T[rows])]
        g = outcome_B[i].double()
        for pos in range(rows.numel() - 1, -1, -1):
            row = rows[pos]
            g = r[row] + (g if pos == rows.numel() - 1 else gamma * g)
            out[row] = g
    return torch.round(out, decimals=9)


def episode_returns(turns: Turns, outcome_B: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """Each episode's whole return, ``G[i, 0]`` (its outcome when it has no turns): what
    the episode-level estimators compare, so per-step rewards count there too."""
    out = outcome_B.double().clone()
    g = returns_to_go(turns, outcome_B, gamma)
    first = turns.index_T == 0
    out[turns.episode_T[first]] = g[first]
    return out


def _usable(turns: Turns, eligible_B: torch.Tensor) -> torch.Tensor:
    """Turns that may carry gradient and be baseline samples."""
    return turns.eligible_T.bool() & eligible_B.bool()[turns.episode_T]


def _ids(*columns: torch.Tensor) -> torch.Tensor:
    """One id per distinct row of `columns` (a composite key, without arithmetic that a
    64-bit state hash could overflow)."""
    if columns[0].numel() == 0:
        return columns[0].long()
    stacked = torch.stack([c.long() for c in columns], dim=1)
    return torch.unique(stacked, dim=0, return_inverse=True)[1]


def _loo(
    values_T: torch.Tensor, usable_T: torch.Tensor, key_T: torch.Tensor, episode_T: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per turn: the mean of `values_T` over usable turns with the same key from *other*
    episodes, and how many there were (0: no baseline). Sums per key, minus the turn's own
    episode's share of them: one pass, however many turns."""
    use = usable_T.to(values_T.dtype)
    by_key, by_own = key_T, _ids(key_T, episode_T)

    def totals(ids: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        n = int(ids.max()) + 1 if ids.numel() else 0
        return torch.zeros(n, dtype=v.dtype).index_add_(0, ids, v)[ids]

    count = totals(by_key, use) - totals(by_own, use)
    total = totals(by_key, values_T * use) - totals(by_own, values_T * use)
    count = torch.where(usable_T, count, torch.zeros_like(count))
    base = torch.where(count > 0, total / count.clamp(min=1), torch.zeros_like(total))
    return base, count


@register("outcome")
def outcome(
    turns: Turns,
    outcome_B: torch.Tensor,
    group_B: torch.Tensor,
    eligible_B: torch.Tensor,
    base: str = "grpo",
) -> torch.Tensor:
    """Outcome broadcast (what every episode got before per-turn credit): the advantage
    (`tracerl.algos.advantages`, `base`) of the episode's whole return (outcome plus its
    turns' own rewards) on each of its usable turns."""
    adv_B = get_outcome(base)(episode_returns(turns, outcome_B), group_B, eligible_B)
    usable = _usable(turns, eligible_B)
    return torch.where(usable, adv_B[turns.episode_T], torch.zeros_like(turns.reward_T.float()))


@register("turn_returns")
def turn_returns(
    turns: Turns,
    outcome_B: torch.Tensor,
    group_B: torch.Tensor,
    eligible_B: torch.Tensor,
    gamma: float = 1.0,
) -> torch.Tensor:
    """Per-turn returns against a leave-one-out baseline by turn index::

        A[i, t] = G[i, t] - mean { G[j, t] : j != i in i's group, j has a usable turn t }

    Turn t of episode i is compared with turn t of the other members that reached it. A
    turn no other member reached has no baseline and gets 0 (an indicator that depends on
    the other episodes only: the estimate stays unbiased, it just drops the term). Episodes
    of different lengths need no padding and no per-index normalisation."""
    g = returns_to_go(turns, outcome_B, gamma)
    usable = _usable(turns, eligible_B)
    key = _ids(group_B[turns.episode_T], turns.index_T)
    base, count = _loo(g, usable, key, turns.episode_T)
    return torch.where(usable & (count > 0), g - base, torch.zeros_like(g))


@register("step_groups")
def step_groups(
    turns: Turns,
    outcome_B: torch.Tensor,
    group_B: torch.Tensor,
    eligible_B: torch.Tensor,
    omega: float = 1.0,
    gamma: float = 1.0,
    base: str = "rloo",
) -> torch.Tensor:
    """Step groups in the manner of GiGPO (Feng et al. 2025, arXiv:2505.10978): the
    advantage of the episode's whole return plus a step advantage among turns of the same
    group that acted from the same state::

        A[i, t] = A_episode[i]  +  omega * (G[i, t] - mean { G[j, s] : j != i, same group,
                                                             state[j, s] == state[i, t] })

    The step baseline is leave-one-out over other episodes' turns from the same state (a
    state met by one episode only adds nothing). Because those turns share the state, the
    comparison is between actions from one state: the credit a per-index baseline cannot
    give when episodes drift apart. `base` is the outcome estimator (RLOO by default, so
    the whole estimate is leave-one-out)."""
    if turns.state_T is None:
        raise ValueError("step_groups needs each turn's state key (Turns.state_T)")
    g = returns_to_go(turns, outcome_B, gamma)
    usable = _usable(turns, eligible_B)
    adv_B = get_outcome(base)(episode_returns(turns, outcome_B, gamma), group_B, eligible_B)
    # the same state in two groups (two tasks) is not the same state
    key = _ids(group_B[turns.episode_T], turns.state_T)
    step_base, count = _loo(g, usable, key, turns.episode_T)
    step = torch.where(count > 0, g - step_base, torch.zeros_like(g))
    total = adv_B[turns.episode_T] + omega * step
    return torch.where(usable, total, torch.zeros_like(g))
