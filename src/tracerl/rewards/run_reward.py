"""The run's reward, once resolved (`tracerl.rewards.resolve`): a layered spec and the
functions of its components, scoring an episode (or a group of them) into its breakdown."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tracerl.rewards.compose import ComponentFn, RewardContext, RewardSpec, compose
from tracerl.rewards.judge.component import JudgeSet
from tracerl.types import RewardBreakdown, Trajectory


@dataclass
class RunReward:
    """The run's reward function: an episode (or its trajectories) -> its breakdown."""

    spec: RewardSpec
    functions: dict[str, ComponentFn]
    source: str
    """Where it came from, for people: ``trainer.reward: search``, ``unitconv's own``."""
    lookup: Callable[[str], str | None] = field(default=lambda _: None, repr=False)
    phase: str = "train"
    """``eval`` for the copy evaluations score with (`evaluating`)."""
    judges: JudgeSet = field(default_factory=JudgeSet, repr=False)
    """This run's model judges (built on first use; their memory and budgets are the run's,
    shared by its `evaluating` copy)."""

    def __call__(self, episode: Any) -> RewardBreakdown:
        return self.score(episode.trajectories)

    def context(self, trajectories: Sequence[Trajectory]) -> RewardContext:
        ctx = RewardContext.from_trajectories(trajectories, self.lookup)
        ctx.phase, ctx.judges = self.phase, self.judges
        return ctx

    def score(self, trajectories: Sequence[Trajectory]) -> RewardBreakdown:
        return compose(self.spec, self.context(trajectories), self.functions)

    def evaluating(self) -> RunReward:
        """The same reward for an evaluation's episodes (a judge's budget keeps them apart
        from the training step's)."""
        return dataclasses.replace(self, phase="eval")

    @property
    def needs_group(self) -> bool:
        """Scored a group at a time (`score_group`): a component ranks the group's members
        against one another (a judge in ``mode: group``)."""
        return any(
            c.fn == "judge" and c.params.get("mode") == "group" for c in self.spec.components
        )

    @property
    def blocking(self) -> bool:
        """Scoring waits on a model (a judge): rollouts score it off their event loop."""
        return any(
            c.fn == "judge" or (c.fn == "citations_valid" and c.params.get("judge"))
            for c in self.spec.components
        )

    def score_group(self, episodes: Sequence[Any]) -> list[RewardBreakdown]:
        """Each of a group's episodes scored, every member's context visible to each."""
        contexts = [self.context(e.trajectories) for e in episodes]
        group = tuple(contexts)
        for ctx in contexts:
            ctx.group = group
        return [compose(self.spec, ctx, self.functions) for ctx in contexts]

    @property
    def component_names(self) -> list[str]:
        return [c.name for c in self.spec.components]
