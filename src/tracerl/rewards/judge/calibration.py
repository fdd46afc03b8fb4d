"""Does the judge agree with people? Its verdicts beside the review pool's human verdicts.

A judged answer is an episode's final answer with a judge's decided verdict on it (from the
reward breakdown the run directory keeps). Where the review pool (``review.sqlite``) holds a
person's verdict on the same answer to the same task, the two are a pair: the judge says
"correct" when its verdict is worth at least its ``threshold``. Per judge and rubric version
(a reworded rubric is another judge), `agreement` counts the pairs and reports accuracy and
Cohen's kappa (agreement beyond what two raters saying "correct" at their own rates would
reach by chance; None when that chance agreement is certain, e.g. every verdict alike).

`queue_for_review` feeds the pool the judged answers a person should look at next: those
where the judge and another outcome verifier of the same episode disagree first (exact
match said no where the judge said yes, or the reverse), then those whose verdict sits
closest to the judge's threshold. The reviewer is not shown the judge's verdict.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tracerl.rewards.review import ReviewPool, key
from tracerl.types import Layer, RewardBreakdown


@dataclass(frozen=True)
class JudgedAnswer:
    episode_id: str
    task: dict[str, Any]
    answer: str
    judge: str
    rubric_version: str
    model: str
    value: float
    threshold: float
    other: bool | None = None
    """What another decided outcome component of the episode said (correct or not), if any."""

    @property
    def says_correct(self) -> bool:
        return self.value >= self.threshold


@dataclass(frozen=True)
class Agreement:
    judge: str
    rubric_version: str
    model: str
    pairs: int
    both_correct: int
    both_wrong: int
    judge_only: int
    """The judge said correct, the person wrong."""
    person_only: int
    """The person said correct, the judge wrong."""

    @property
    def accuracy(self) -> float:
        return (self.both_correct + self.both_wrong) / self.pairs if self.pairs else 0.0

    @property
    def kappa(self) -> float | None:
        n = self.pairs
        if not n:
            return None
        judge_yes = (self.both_correct + self.judge_only) / n
        person_yes = (self.both_correct + self.person_only) / n
        chance = judge_yes * person_yes + (1 - judge_yes) * (1 - person_yes)
        if chance >= 1.0:
            return None
        return (self.accuracy - chance) / (1 - chance)


def review_task(task: dict[str, Any]) -> dict[str, Any]:
    """The task as the review pool keeps it (a question's text, whatever the task calls
    it): adding and looking up must agree on this."""
    from tracerl.rewards.judge.component import reference_answers, task_text

    out = dict(task)
    out.setdefault("id", str(task.get("id", "")))
    out["question"] = task_text(task)
    out["answers"] = reference_answers(task)
    return out


def judged_answers(
    episodes: Iterable[tuple[str, dict[str, Any], str, RewardBreakdown]],
) -> list[JudgedAnswer]:
    """Every decided judge verdict of `episodes` (``(episode id, task, answer, reward)``);
    one per judge, task and answer (the first seen), as the review pool keys them."""
    seen: dict[tuple[str, str, str, str], JudgedAnswer] = {}
    for episode_id, task, answer, reward in episodes:
        if not answer.strip():
            continue
        outcomes = [
            c
            for c in reward.components
            if c.layer is Layer.OUTCOME
            and c.decided
            and not c.gated
            and "judge" not in (c.evidence or {})
        ]
        other = outcomes[0].value >= 1.0 if outcomes else None
        for c in reward.components:
            e = c.evidence or {}
            if c.gated or not c.decided or "verdict" not in e or "judge" not in e:
                continue
            judged = JudgedAnswer(
                episode_id,
                task,
                answer,
                str(e["judge"]),
                str(e.get("rubric_version", "")),
                str(e.get("model", "")),
                float(c.value),
                float(e.get("threshold", 0.5)),
                other,
            )
            once = (
                judged.judge,
                judged.rubric_version,
                judged.model,
                key(review_task(task), answer),
            )
            seen.setdefault(once, judged)
    return list(seen.values())


def agreement(judged: Iterable[JudgedAnswer], pool: ReviewPool | None) -> list[Agreement]:
    """Per judge and rubric version: the judge's verdicts against people's, where both
    exist (judges with no reviewed answer, or no pool at all, are listed with 0 pairs)."""
    counts: dict[tuple[str, str, str], list[int]] = {}
    for j in judged:
        c = counts.setdefault((j.judge, j.rubric_version, j.model), [0, 0, 0, 0])
        person = None if pool is None else pool.verdict(review_task(j.task), j.answer)
        if person is None:
            continue
        c[(0 if person else 1) if j.says_correct == person else (2 if j.says_correct else 3)] += 1
    return [
        Agreement(name, version, model, sum(c), *c)
        for (name, version, model), c in sorted(counts.items())
    ]


def queue_for_review(
    judged: Iterable[JudgedAnswer], pool: ReviewPool, n: int
) -> list[JudgedAnswer]:
    """Add up to `n` judged answers no person has seen to the pool, the most telling first
    (see the module docstring); returns those added."""

    def order(j: JudgedAnswer) -> tuple[int, float]:
        disagrees = j.other is not None and j.other != j.says_correct
        return (0 if disagrees else 1, abs(j.value - j.threshold))

    added: list[JudgedAnswer] = []
    for j in sorted(judged, key=order):
        if len(added) >= n:
            break
        task = review_task(j.task)
        if pool.verdict(task, j.answer) is not None:
            continue
        evidence = {"source": "judge", "judge": j.judge, "rubric_version": j.rubric_version}
        if pool.add(episode_id=j.episode_id, task=task, answer=j.answer, evidence=evidence):
            added.append(j)
    return added
