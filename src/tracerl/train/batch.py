"""Trajectories to tensors, without padding waste.

A training row is one trajectory: its token ids, its loss mask (straight from provenance —
1 exactly on policy tokens), the sampler's log-probs (0 where not sampled) and its episode's
advantage. Rows are bucketed by length: sorted, then cut into micro-batches whose padded size
(rows x longest row) stays under a token budget, so a 2,000-token episode does not pad thirty
60-token ones to its length. `padded_batch` is the plain version the equivalence test compares
against.

Log-probs of next tokens are aligned the usual way: position t's log-prob is of token t given
tokens < t, so a row's first token has none (its mask bit is 0: prompts never carry loss).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tracerl.types import Trajectory


@dataclass
class Batch:
    input_ids_B_T: torch.Tensor
    attention_mask_B_T: torch.Tensor
    loss_mask_B_T: torch.Tensor  # 1 on policy tokens
    old_logprobs_B_T: torch.Tensor  # the sampler's log-probs on policy tokens, else 0
    advantages_B: torch.Tensor
    """One per row, or (turn-level credit) one per token: ``[B, T]``."""
    rows: list[int]  # which input trajectories, in this order
    prefix_len: int = 0
    weights_B: torch.Tensor | None = None
    """Each row's weight in the loss's aggregation (`tracerl.algos.losses.aggregate`): its
    episode's share, ``trainer.sample_weighting``. None: 1 each."""
    """Leading tokens every row shares and none trains on (a group's prompt): the learner
    runs them once for the whole batch (see `token_logprobs`). 0: no shared prefix."""

    def to(self, device: torch.device | str) -> Batch:
        """The same batch with every tensor on `device` (the model's: batches are built on
        the CPU, then moved once, just before their forward)."""

        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device, non_blocking=True)

        return dataclasses.replace(
            self,
            input_ids_B_T=move(self.input_ids_B_T),
            attention_mask_B_T=move(self.attention_mask_B_T),
            loss_mask_B_T=move(self.loss_mask_B_T),
            old_logprobs_B_T=move(self.old_logprobs_B_T),
            advantages_B=move(self.advantages_B),
            weights_B=move(self.weights_B),
        )

    @property
    def tokens(self) -> int:
        return int(self.attention_mask_B_T.sum())

    @property
    def padded_tokens(self) -> int:
        return self.input_ids_B_T.numel()

    @property
    def cost(self) -> int:
        """Token positions the decoder runs (the shared prefix once): what a rank's share of
        a step is balanced on."""
        b, t = self.input_ids_B_T.shape
        return self.prefix_len + b * (t - self.prefix_len)


def padded_batch(
    trajectories: Sequence[Trajectory],
    advantages: Sequence[float],
    rows: Sequence[int] | None = None,
    pad_id: int = 0,
    weights: Sequence[float] | None = None,
) -> Batch:
    """Right-padded tensors for the given rows (all of them by default); `weights`, one per
    trajectory, become the rows' `weights_B`."""
    rows = list(range(len(trajectories))) if rows is None else list(rows)
    width = max(len(trajectories[i]) for i in rows)
    shape = (len(rows), width)
    ids = torch.full(shape, pad_id, dtype=torch.long)
    attn = torch.zeros(shape, dtype=torch.long)
    mask = torch.zeros(shape, dtype=torch.float32)
    old = torch.zeros(shape, dtype=torch.float32)
    for b, i in enumerate(rows):
        t = trajectories[i]
        n = len(t)
        ids[b, :n] = torch.tensor(t.token_ids)
        attn[b, :n] = 1
        mask[b, :n] = torch.tensor(t.loss_mask, dtype=torch.float32)
        old[b, :n] = torch.tensor(t.logprobs, dtype=torch.float32)
    if mask[:, 0].any():
        raise ValueError("a trajectory starts with a policy token; it needs a prompt before it")
    if any(isinstance(advantages[i], Sequence) for i in rows):  # per token (turn credit)
        adv = torch.zeros(shape, dtype=torch.float32)
        for b, i in enumerate(rows):
            a = advantages[i]
            adv[b, : len(trajectories[i])] = (
                torch.tensor(a, dtype=torch.float32) if isinstance(a, Sequence) else float(a)
            )
    else:
        adv = torch.tensor([float(advantages[i]) for i in rows], dtype=torch.float32)
    w = None if weights is None else torch.tensor([float(weights[i]) for i in rows])
    return Batch(ids, attn, mask, old, adv, rows, weights_B=w)


def bucketed_batches(
    trajectories: Sequence[Trajectory],
    advantages: Sequence[float],
    max_tokens: int = 4096,
    pad_id: int = 0,
    weights: Sequence[float] | None = None,
) -> list[Batch]:
    """Micro-batches of similar-length rows, each at most `max_tokens` padded tokens (a row
    longer than the budget gets a batch of its own)."""
    # rows without tokens (an episode whose reset failed) teach nothing and are dropped
    rows = [i for i in range(len(trajectories)) if len(trajectories[i]) > 0]
    return [
        padded_batch(trajectories, advantages, cut, pad_id, weights)
        for cut in _cuts(trajectories, rows, max_tokens)
    ]


def _cuts(
    trajectories: Sequence[Trajectory], rows: list[int], max_tokens: int, prefix: int = 0
) -> list[list[int]]:
    """`rows` sorted by length and cut into runs whose cost stays under `max_tokens`: a
    shared `prefix` once, plus each row's padded length past it (a row over the budget
    gets a run of its own)."""
    cuts: list[list[int]] = []
    current: list[int] = []
    for i in sorted(rows, key=lambda i: len(trajectories[i])):
        rest = len(trajectories[i]) - prefix  # the longest so far: rows are sorted
        if current and prefix + rest * (len(current) + 1) > max_tokens:
            cuts.append(current)
            current = []
        current.append(i)
    if current:
        cuts.append(current)
    return cuts


def _prompt_len(t: Trajectory) -> int:
    """Tokens before the first policy token (the whole row if it has none)."""
    return next((i for i, m in enumerate(t.loss_mask) if m), len(t))


def shared_prefix_batches(
    trajectories: Sequence[Trajectory],
    advantages: Sequence[float],
    max_tokens: int = 4096,
    pad_id: int = 0,
    min_prefix: int = 16,
    weights: Sequence[float] | None = None,
) -> list[Batch]:
    """Micro-batches of rows that start with the same prompt (a GRPO group's members), with
    `prefix_len` set so the learner runs that prompt once per batch instead of once per row;
    a row's cost is its length past the prompt. Rows whose prompt no other row shares fall
    back to length bucketing."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, t in enumerate(trajectories):
        if len(t) > 0:
            groups.setdefault(tuple(t.token_ids[: _prompt_len(t)]), []).append(i)
    batches, single = [], []
    for prompt, members in groups.items():
        p = len(prompt)
        if len(members) < 2 or p < min_prefix:
            single += members
            continue
        for cut in _cuts(trajectories, members, max_tokens, prefix=p):
            batches.append(padded_batch(trajectories, advantages, cut, pad_id, weights))
            batches[-1].prefix_len = p if len(cut) > 1 else 0
    batches += [
        padded_batch(trajectories, advantages, cut, pad_id, weights)
        for cut in _cuts(trajectories, single, max_tokens)
    ]
    return batches
