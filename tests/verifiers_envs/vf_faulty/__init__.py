"""A verifiers taskset whose parts fail on demand (`fail` in its config), to test whose
failure each one is: ``rubric`` (a @vf.reward that raises: the evaluator's), ``setup`` (the
task's own setup raises: the environment's), ``deadline`` (verifiers' own agent deadline
expires), ``none``. Its `in_the_box` reward needs the task's runtime: verifiers skips it
when it scores without one."""

import verifiers.v1 as vf


class FaultyData(vf.TaskData):
    answer: str


class FaultyConfig(vf.TaskConfig):
    fail: str = "none"


class FaultyTask(vf.Task[FaultyData, vf.State, FaultyConfig]):
    async def setup(self, trace, runtime) -> None:
        if self.config.fail == "setup":
            raise ConnectionError("the task's database is down")

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        if self.config.fail == "rubric":
            raise ZeroDivisionError("the rubric divided by zero")
        return 1.0 if trace.last_reply.strip() == self.data.answer else 0.0

    @vf.reward(weight=0.0)
    async def in_the_box(self, trace: vf.Trace, runtime: vf.Runtime) -> float:
        return 1.0


class FaultyTasksetConfig(vf.TasksetConfig):
    task: FaultyConfig = FaultyConfig()


class FaultyTaskset(vf.Taskset[FaultyTask, FaultyTasksetConfig]):
    def load(self) -> list[FaultyTask]:
        deadline = vf.TaskTimeout(agent=0.05 if self.config.task.fail == "deadline" else None)
        return [
            FaultyTask(
                FaultyData(prompt=f"Say {i}.", answer=str(i), timeout=deadline), self.config.task
            )
            for i in range(10)
        ]


__all__ = ["FaultyTaskset"]
