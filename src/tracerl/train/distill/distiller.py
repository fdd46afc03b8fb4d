"""`Distiller`: a step's rows, scored by the teacher, with the advantages they train with.

For each row the update is about to train on (a sample of an eligible episode), the teacher
gives the log-prob of every policy token in the row's own context; the row's advantage
becomes, per token, ``outcome_weight * A_outcome + distill_weight * (teacher - student)``
(`tracerl.algos.distill`), the student's log-probs being the ones recorded when it sampled
(the behaviour policy's, at the run's temperature: the tokens were drawn from it, so the
difference estimates the reverse KL without bias, stale samples included).

A row the teacher could not score (an error, a timeout, the step's `tokens_per_step` spent)
is the evaluator's: it is left out of the update — never trained on a zero — counted, and
said why (`Distilled.unscored`): the update makes its whole episode the evaluator's
(`tracerl.train.distill.attribution`).
Scores are cached on disk by (teacher identity, temperature, token ids, loss mask), so a
resumed run, or a second epoch on the same rows, does not pay twice.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tracerl.algos.distill import mix, teacher_advantages, turn_spans
from tracerl.train.distill.teachers import Scored, Teacher
from tracerl.types import Trajectory


@dataclass
class Distilled:
    """What a step's rows train with: the rows kept (indices into the rows given), their
    advantages (one per token), and the step's distillation metrics; `unscored`: each row
    left out, and why (the teacher's error, or its budget), for the episode's record."""

    keep: list[int]
    advantages: list[list[float]]
    metrics: dict[str, float] = field(default_factory=dict)
    unscored: dict[int, str] = field(default_factory=dict)


@dataclass
class Distiller:
    teacher: Teacher
    temperature: float
    """The run's sampling temperature: the student's recorded log-probs are at it."""
    outcome_weight: float = 1.0
    distill_weight: float = 1.0
    tokens_per_step: int | None = None
    cache: Any = None
    """A `tracerl.rewards.judge.VerdictCache` (get/put JSON by key), or None."""

    def __repr__(self) -> str:
        return (
            f"Distiller(teacher={self.teacher!r}, temperature={self.temperature}, "
            f"outcome_weight={self.outcome_weight}, distill_weight={self.distill_weight}, "
            f"tokens_per_step={self.tokens_per_step}, cache={self.cache is not None})"
        )

    def key(self, t: Trajectory) -> str:
        h = hashlib.sha256(f"{self.teacher.identity}|T={self.temperature!r}|".encode())
        h.update(",".join(map(str, t.token_ids)).encode())
        h.update(bytes(t.loss_mask))
        return h.hexdigest()

    def score(self, rows: Sequence[Trajectory]) -> tuple[list[Scored | None], dict[str, float]]:
        """Each row's teacher log-probs (one per token), why it has none (a string), or None
        (refused: the step's teacher budget was spent); and what it cost."""
        out: list[Scored | None] = [None] * len(rows)
        ask: list[int] = []
        keys = [self.key(t) for t in rows] if self.cache is not None else []
        spent, hits, refused = 0, 0, 0
        for i, t in enumerate(rows):
            n = sum(t.loss_mask)
            cached = self.cache.get(keys[i]) if self.cache is not None else None
            if cached is not None and len(cached.get("policy", ())) == n:
                out[i] = _spread(cached["policy"], t.loss_mask)
                hits += 1
                continue
            if self.tokens_per_step is not None and spent + n > self.tokens_per_step:
                refused += 1  # past the step's cap: not asked (the evaluator's)
                continue
            spent += n
            ask.append(i)
        t0 = time.perf_counter()
        got = self.teacher.logprobs([rows[i] for i in ask], self.temperature) if ask else []
        for i, scored in zip(ask, got, strict=True):
            out[i] = scored
            if not isinstance(scored, str) and self.cache is not None:
                mask = rows[i].loss_mask
                self.cache.put(keys[i], {"policy": _gather(scored, mask)})
        ran = float(sum(len(rows[i]) for i in ask))
        episodes = len({t.episode_id for t in rows}) or 1
        cost = {
            "train/distill/teacher_tokens": ran,
            "train/distill/teacher_tokens_mean": ran / episodes,  # per trained episode
            "train/distill/cache_hit_rate": hits / len(rows) if rows else 0.0,
            "train/distill/budget_refusals": float(refused),
            "time/teacher_s": time.perf_counter() - t0,
        }
        return out, cost

    def apply(
        self,
        rows: Sequence[Trajectory],
        outcome: Sequence[float | Sequence[float]],
        weights: Sequence[float] | None = None,
    ) -> Distilled:
        """The rows' advantages with the teacher's term, per token; `outcome`: each row's
        outcome advantage (a number, or one per token), `weights`: each row's factor on the
        whole (staleness), default 1."""
        scored, metrics = self.score(rows)
        weights = weights if weights is not None else [1.0] * len(rows)
        keep: list[int] = []
        advantages: list[list[float]] = []
        kl_sum, kl_tokens, turn_kls, failures = 0.0, 0, [], 0
        unscored: dict[int, str] = {}
        offered = sum(sum(t.loss_mask) for t in rows)
        for i, (t, s, x, w) in enumerate(zip(rows, scored, outcome, weights, strict=True)):
            if s is None:  # refused: counted in the cost
                unscored[i] = (
                    f"the step's teacher budget (trainer.distill.tokens_per_step: "
                    f"{self.tokens_per_step}) was spent before it"
                )
                continue
            if isinstance(s, str):
                failures += 1
                unscored[i] = s
                continue
            a = teacher_advantages(t.logprobs, s, t.loss_mask)
            mixed = mix(x, a, t.loss_mask, self.outcome_weight, self.distill_weight)
            keep.append(i)
            advantages.append([w * v for v in mixed])
            kl_sum -= sum(a)
            kl_tokens += sum(t.loss_mask)
            turn_kls += [-sum(a[b:e]) for b, e in turn_spans(t.loss_mask)]
        metrics.update(
            {
                "train/distill/reverse_kl": kl_sum / kl_tokens if kl_tokens else 0.0,
                "train/distill/reverse_kl_turn": sum(turn_kls) / len(turn_kls) if turn_kls else 0.0,
                "train/distill/coverage": kl_tokens / offered if offered else 0.0,
                "train/distill/teacher_failures": float(failures),
            }
        )
        return Distilled(keep, advantages, metrics, unscored)


def _gather(values: Sequence[float], mask: Sequence[int]) -> list[float]:
    return [v for v, m in zip(values, mask, strict=True) if m]


def _spread(policy: Sequence[float], mask: Sequence[int]) -> list[float]:
    it = iter(policy)
    return [next(it) if m else 0.0 for m in mask]
