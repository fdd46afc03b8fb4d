"""A verifiers taskset with a tool, written the way `vf init --add-tool` scaffolds one (the
tool server in its own module, which verifiers runs as ``python -m vf_lookup.tools``): the
model must look a code up and reply with it."""

import verifiers.v1 as vf

from vf_lookup.tools import CODES, LookupToolset


class LookupData(vf.TaskData):
    name: str
    answer: str


class LookupTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class LookupTask(vf.Task[LookupData, vf.State, LookupTaskConfig]):
    @classmethod
    def toolsets(cls, config: LookupTaskConfig) -> list[vf.Toolset]:
        return [LookupToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return 1.0 if trace.last_reply.strip() == self.data.answer else 0.0


class LookupConfig(vf.TasksetConfig):
    task: LookupTaskConfig = LookupTaskConfig()


class LookupTaskset(vf.Taskset[LookupTask, LookupConfig]):
    def load(self) -> list[LookupTask]:
        return [
            LookupTask(
                LookupData(
                    prompt=f"What is the code of {name}? Look it up, then reply with the code.",
                    name=name,
                    answer=code,
                ),
                self.config.task,
            )
            for name, code in CODES.items()
        ]


__all__ = ["LookupTaskset"]
