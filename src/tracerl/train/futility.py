"""Runs that stop when nothing can be learned: `Futility`.

An episode the environment failed (an outage, a reset that raised, a tool server that died)
or whose reward the evaluator could not decide (it crashed, or returned no number) never
trains the policy. A run in which *every* episode of several steps in a row is ineligible
for the same owner is spending compute on nothing: the environment or the reward is
broken, not the policy. After ``trainer.stop_unlearnable_steps`` such steps (default 3)
the run stops with a two-line error (exit 2 from the command) naming the owner and the
most common fault, after the step's metrics line and a checkpoint are written, so
``--resume`` continues where it stopped once the fault is fixed.

A step with any eligible episode, or whose ineligible episodes are split between owners,
starts the count again: a flaky service that fails some episodes is counted in the
attribution curves, not stopped.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from tracerl.errors import UserError
from tracerl.rollout.runner import Episode
from tracerl.train.metrics import gradient_eligible, owner
from tracerl.types import Attribution

WATCHED = (Attribution.ENVIRONMENT, Attribution.EVALUATOR)

_WHAT_TO_DO = {
    Attribution.ENVIRONMENT: (
        "the environment failed every episode: fix it (`tracerl check-env` runs one "
        "episode; `tracerl triage {run}` lists the faults), then continue with --resume"
    ),
    Attribution.EVALUATOR: (
        "the reward or the teacher decided nothing: fix it (`tracerl triage {run}` shows "
        "why, for a reward and for a distillation teacher), then continue with --resume"
    ),
}


TEACHER_FAULT = (
    "the distillation teacher scored no sample (it failed, or the step's teacher budget "
    "refused them: train/distill/teacher_failures, train/distill/budget_refusals)"
)


def teacher_scored_nothing(metrics: Mapping[str, float]) -> bool:
    """A step with a teacher (``trainer.distill``) that graded none of the policy tokens it
    was given: every sample was left out, so nothing trained."""
    left_out = metrics.get("train/distill/teacher_failures", 0.0) + metrics.get(
        "train/distill/budget_refusals", 0.0
    )
    return left_out > 0 and metrics.get("train/distill/coverage", 1.0) == 0.0


class UnlearnableRun(UserError):
    """Every episode of `steps` consecutive steps was ineligible for one owner."""

    def __init__(self, message: str, hint: str, owner: Attribution, fault: str) -> None:
        super().__init__(message, hint)
        self.owner, self.fault = owner, fault


def fault_of(e: Episode) -> str:
    """The fault that made `e` ineligible, in a few words: the reward's error for the
    evaluator's episodes, else the receipt's error, else how the episode stopped."""
    if owner(e) is Attribution.EVALUATOR and e.reward is not None:
        text = e.reward.error or "the reward could not decide"
    else:
        text = getattr(e.receipt, "error", None) or f"stopped: {e.stop_reason.value}"
    text = " ".join(str(text).split())
    return text if len(text) <= 160 else text[:157] + "..."


class Futility:
    """Counts consecutive steps whose every episode is ineligible for one owner; `observe`
    returns the error to raise once `limit` such steps came in a row (None: go on)."""

    def __init__(self, limit: int | None, run_dir: object = "RUN_DIR") -> None:
        self.limit, self.run_dir = limit, run_dir
        self.streak = 0
        self.owner: Attribution | None = None
        self.faults: Counter[str] = Counter()

    def observe(
        self, step: int, episodes: Sequence[Episode], metrics: Mapping[str, float] | None = None
    ) -> UnlearnableRun | None:
        """`metrics`: the step's, where a distillation teacher that scored no sample makes
        the step the evaluator's too (`teacher_scored_nothing`)."""
        if not self.limit:
            return None
        owners = {owner(e) for e in episodes}
        dead = (
            bool(episodes)
            and not any(gradient_eligible(e) for e in episodes)
            and len(owners) == 1
            and next(iter(owners)) in WATCHED
        )
        teacher = teacher_scored_nothing(metrics or {})
        if not dead and not teacher:
            self.streak, self.owner, self.faults = 0, None, Counter()
            return None
        who = next(iter(owners)) if dead else Attribution.EVALUATOR
        if who is not self.owner:
            self.streak, self.owner, self.faults = 0, who, Counter()
        self.streak += 1
        if dead:
            self.faults.update(fault_of(e) for e in episodes)
        else:  # every episode could train, and the teacher graded none of their samples
            self.faults[TEACHER_FAULT] += len(episodes)
        if self.streak < self.limit:
            return None
        fault, count = self.faults.most_common(1)[0]
        total = sum(self.faults.values())
        first = step - self.streak + 1
        return UnlearnableRun(
            f"nothing can be learned: every episode of steps {first}-{step} was the "
            f"{who.value}'s failure ({count} of {total}: {fault}); the run stopped after "
            "writing its checkpoint",
            _WHAT_TO_DO[who].format(run=self.run_dir),
            who,
            fault,
        )
