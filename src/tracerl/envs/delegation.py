"""`Delegating`: a tool environment whose policy may hand sub-tasks to sub-agents.

Mix it into a `ToolEnv` (``class Desk(Delegating, ToolEnv)``) and set
``rollout.subagents`` (its ``tool`` is ``delegate``, the name declared here): a call
``delegate(task=...)`` then runs a child episode of the same policy with a fresh context
and this environment's other tools, and its answer is the call's observation
(`tracerl.rollout.context.subagents`, docs/long-horizon.md). The environment never runs
the call itself: without ``rollout.subagents`` it answers that delegation is off.

Two optional hooks an environment may define beside it: ``subagent_reward(task, subtask,
answer)`` grades a child on its own, and ``subagent_result(task, subtask, answer)`` says what
the parent sees of the child's answer (by default the answer itself).
"""

from __future__ import annotations

from tracerl.envs.tools import PolicyError, tool


class Delegating:
    @tool(name="delegate", version="1")
    def delegate(self, task: str) -> str:
        """Hand a sub-task to a sub-agent with a fresh context; its answer comes back.

        Args:
            task: the sub-task in words: what to find or do, and what to answer with.
        """
        raise PolicyError("delegation is off in this run (rollout.subagents is not set)")
