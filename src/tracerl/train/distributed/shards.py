"""Micro-batches to ranks, balanced by cost.

A micro-batch's cost is its padded token count (rows x width, the shared prompt once): what
its forward and backward take. Counting micro-batches instead would give one rank the 30
short episodes and another the 2 long ones. `balance` is the greedy longest-first rule: each
micro-batch, costliest first, goes to the rank with the least cost so far (ties: the lower
rank; equal costs: the lower index first). Every rank computes the same assignment from the
same costs, so nothing is communicated.
"""

from __future__ import annotations

from collections.abc import Sequence


def balance(costs: Sequence[int | float], ranks: int) -> list[list[int]]:
    """For each rank, the indices of its micro-batches (ascending). Its largest load is at
    most 4/3 of the best possible (Graham's bound for longest-first)."""
    if ranks < 1:
        raise ValueError(f"balance: ranks must be at least 1, got {ranks}")
    loads = [0.0] * ranks
    out: list[list[int]] = [[] for _ in range(ranks)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        r = min(range(ranks), key=lambda r: (loads[r], r))
        out[r].append(i)
        loads[r] += float(costs[i])
    return [sorted(o) for o in out]
