"""What this process's rollouts have sampled so far: turns and tokens, for progress bars.

A batched engine serves a phase's episodes together, so they finish together: a bar that
counts finished episodes sits at 0/N for most of the phase. The turns and tokens sampled
meanwhile are the sign of life. Every model turn of tracerl's runner and of the gateway
goes through `sample`; episodes on Ray workers sample in their own processes and are not
counted here.
"""

from __future__ import annotations

from dataclasses import dataclass

from tracerl.rollout.sampler import Sampler, SampleRequest, SampleResult


@dataclass
class Activity:
    turns: int = 0
    tokens: int = 0

    def totals(self) -> tuple[int, int]:
        """(turns, tokens) sampled in this process so far."""
        return self.turns, self.tokens


ACTIVITY = Activity()


async def sample(sampler: Sampler, request: SampleRequest) -> SampleResult:
    """One model turn from `sampler`, counted in `ACTIVITY`."""
    result = await sampler.sample(request)
    ACTIVITY.turns += 1
    ACTIVITY.tokens += len(result.token_ids)
    return result
