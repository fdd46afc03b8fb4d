"""The learner: PPO-style updates on trajectories, fp32 on CPU, lean on memory.

One `update` = K epochs over length-bucketed micro-batches with gradient accumulation:
the old log-probs are recomputed once before the first epoch (the policy that the ratio is
taken against); each micro-batch's loss is weighted so that the accumulated gradient equals
the whole step's loss under the configured aggregation (token share for ``token-mean``,
sequence share for the ``seq-mean-*`` modes, one constant length for
``seq-mean-token-sum-norm``); then gradient clipping and one AdamW step per epoch.
The model object is shared with the in-process sampler, so weights are "synced" by
construction; the caller bumps the sampler's `policy_version`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from tracerl.algos.losses import ClipConfig, PolicyLossInput, ppo_clip
from tracerl.train.batch import bucketed_batches
from tracerl.train.logprobs import token_logprobs
from tracerl.types import Trajectory


@dataclass
class LearnerConfig:
    lr: float = 1e-5
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    epochs: int = 1
    micro_batch_tokens: int = 4096
    temperature: float = 1.0
    """The sampler's temperature: log-probs are of the distribution it sampled from."""
    chunk_tokens: int = 1024
    clip: ClipConfig = field(default_factory=ClipConfig)


def _micro_batch_weights(batches: list[Any], agg: str, total_tokens: float) -> list[float]:
    """Weights that make the accumulated micro-batch losses equal the whole-step loss:
    token share for ``token-mean``, sequence share for the ``seq-mean-*`` modes, 1 for
    ``seq-mean-token-sum-norm`` (a sum over a constant)."""
    if agg == "token-mean":
        return [float(b.loss_mask_B_T.sum()) / total_tokens for b in batches]
    if agg == "seq-mean-token-sum-norm":
        return [1.0 for _ in batches]
    seqs = [float((b.loss_mask_B_T.sum(-1) > 0).sum()) for b in batches]
    return [n / max(1.0, sum(seqs)) for n in seqs]


class Learner:
    def __init__(self, model: Any, config: LearnerConfig | None = None) -> None:
        self.model = model
        self.cfg = config or LearnerConfig()
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params, lr=self.cfg.lr, weight_decay=self.cfg.weight_decay
        )
        self.updates = 0

    def _logprobs(self, batch: Any) -> torch.Tensor:
        return token_logprobs(
            self.model,
            batch.input_ids_B_T,
            batch.attention_mask_B_T,
            temperature=self.cfg.temperature,
            chunk_tokens=self.cfg.chunk_tokens,
        )

    def update(
        self, trajectories: Sequence[Trajectory], advantages: Sequence[float]
    ) -> dict[str, float]:
        """One policy update on these rows (advantage 0 rows still shape the mean)."""
        batches = bucketed_batches(trajectories, advantages, self.cfg.micro_batch_tokens)
        total = sum(float(b.loss_mask_B_T.sum()) for b in batches)
        if total == 0:
            return {"train/policy_tokens": 0.0}
        with torch.no_grad():
            olds = [self._logprobs(b) for b in batches]
        weights = _micro_batch_weights(batches, self.cfg.clip.agg, total)
        clip = self.cfg.clip
        if clip.agg == "seq-mean-token-sum-norm" and clip.norm_tokens is None:
            # one constant for the whole step (not each micro-batch's padded width)
            width = max(b.input_ids_B_T.shape[1] for b in batches)
            clip = dataclasses.replace(clip, norm_tokens=width)
        sums: dict[str, float] = {}
        grad_norm = 0.0
        for _ in range(self.cfg.epochs):
            self.optimizer.zero_grad(set_to_none=True)
            for b, old, share in zip(batches, olds, weights, strict=True):
                inp = PolicyLossInput(
                    self._logprobs(b), old, b.advantages_B, b.loss_mask_B_T, b.old_logprobs_B_T
                )
                loss, m = ppo_clip(inp, clip)
                (loss * share).backward()
                for k, v in {"loss": loss.item(), **m}.items():
                    sums[k] = sums.get(k, 0.0) + v * share / self.cfg.epochs
            grad_norm = float(
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
            )
            self.optimizer.step()
        self.updates += 1
        out = {f"train/{k}": v for k, v in sums.items()}
        out.update(
            {
                "train/grad_norm": grad_norm,
                "train/policy_tokens": total,
                "train/micro_batches": float(len(batches)),
            }
        )
        return out
