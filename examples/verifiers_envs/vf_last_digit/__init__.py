"""A verifiers (0.4) environment, written the way `vf init` scaffolds one: the last digit of a
sum. It knows nothing of tracerl; tracerl's `verifiers` adapter loads it by its taskset id
(``vf-last-digit``) in verifiers' own virtual environment.

Prime's hub environments are installed from Prime's registry, which this machine cannot reach;
this package stands in for one and uses only verifiers' public API.
"""

import random

import verifiers.v1 as vf

SYSTEM_PROMPT = "Reply with the last digit of the sum, and nothing else."


class LastDigitData(vf.TaskData):
    """One question: two numbers and the last digit of their sum."""

    a: int
    b: int
    answer: str


class LastDigitTask(vf.Task[LastDigitData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return 1.0 if trace.last_reply.strip() == self.data.answer else 0.0

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply))


class LastDigitConfig(vf.TasksetConfig):
    num_tasks: int = 200
    """How many questions to build."""
    seed: int = 0


class LastDigitTaskset(vf.Taskset[LastDigitTask, LastDigitConfig]):
    def load(self) -> list[LastDigitTask]:
        rng = random.Random(self.config.seed)
        tasks = []
        for _ in range(self.config.num_tasks):
            a, b = rng.randrange(100), rng.randrange(100)
            data = LastDigitData(
                prompt=f"{a}+{b}=",
                system_prompt=SYSTEM_PROMPT,
                a=a,
                b=b,
                answer=str((a + b) % 10),
            )
            tasks.append(LastDigitTask(data, self.config.task))
        return tasks


__all__ = ["LastDigitTaskset"]
