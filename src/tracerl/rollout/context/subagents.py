"""Sub-agents: the policy hands a sub-task to a child episode of itself.

An environment lets the policy delegate by offering a tool named ``rollout.subagents.tool``
(``delegate`` by default; `tracerl.envs.delegation.Delegating` declares one). The runner
never sends that call to the environment: it runs a **child episode** of the same policy
(`Delegation.run`): its own context (a fresh conversation whose prompt is the sub-task),
the environment's other tools (the same world: the child's calls go to the parent's
environment), budgets drawn from what the parent has left, and its final answer returned
to the parent as the tool's observation.

The child belongs to its parent's episode: its samples are samples of the parent episode
(``agent`` names them: ``d0``, ``d1``...), so they train with the parent's advantage and
the episode counts once in its group; where the environment grades children
(``subagent_reward``, recorded in the parent's receipt: `own_reward`), a child trains with
an advantage of its own instead (`tracerl.train.subagent_credit`). The parent pays for the
child in its ledger (its sampled tokens and tool calls). A child the environment failed
(an outage, a crash) fails its parent's call as the environment's (the parent episode is
then the environment's); a child that spends its budget without answering is a policy
outcome: the parent sees that it stopped, and why. Receipts link both ways (the parent's
``children``, the child's ``parent``); replay runs the tree again
(`tracerl.rollout.replay`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from tracerl.envs.base import CallOutcome, Env, Message, StepResult
from tracerl.envs.parsers import Action
from tracerl.envs.tools import ToolResult, ToolSet
from tracerl.types import Attribution, Fault, FaultKind, ToolCall

Spawn = Callable[..., Awaitable[Any]]
"""The runner's `run_episode` (passed in: this package never imports the runner)."""


class ChildEnv(Env):
    """The environment as a child sees it: the parent's tools, its sub-task as the prompt,
    its answer as its end. Its tool calls run on the parent's environment (``step_as``
    names the agent that called, where the environment keeps one record per agent:
    replay's). A delegate call never reaches it: the child's own runner runs (or, past
    ``max_depth``, refuses) it."""

    def __init__(self, parent: Env, agent: str, root_task: dict[str, Any]) -> None:
        self.parent, self.agent, self.root_task = parent, agent, root_task
        self.name, self.version = parent.name, parent.version  # type: ignore[misc]
        self.side_effect_guard = parent.side_effect_guard
        self.tools = ToolSet(list(parent.tools), guard=False)
        self.spec = {**dict(getattr(parent, "spec", None) or {}), "agent": agent}

    async def reset(self, task: dict[str, Any], seed: int) -> list[Message]:
        return [{"role": "user", "content": task["prompt"]}]

    async def step(self, action: Action) -> StepResult:
        if not action.tool_calls:  # the child's answer: its episode ends
            answer = {"text": action.answer or "", "citations": []}
            return StepResult([], terminated=True, info={"answer": answer})
        return await self.step_as(self.agent, action)

    async def step_as(self, agent: str, action: Action) -> StepResult:
        step_as = getattr(self.parent, "step_as", None)
        return await (step_as(agent, action) if step_as else self.parent.step(action))

    def tool_schemas(self) -> list[dict[str, Any]]:
        return self.parent.tool_schemas()

    def tool_versions(self) -> dict[str, str]:
        return self.parent.tool_versions()

    def sample_tasks(self, n: int, *, seed: int = 0, split: str = "train") -> list[dict]:
        raise NotImplementedError("a child environment has its parent's tasks")


class Delegation:
    """One episode's sub-agents: which calls delegate, running them, the records."""

    def __init__(self, rollout: Any, depth: int = 0) -> None:
        self.rollout = rollout
        self.cfg = rollout.subagents  # None: nobody delegates
        self.depth = depth
        self.children: list[Any] = []  # the child episodes, in the order they ran
        self.records: list[dict[str, Any]] = []  # the receipt's ``children``

    def split(self, env: Env, calls: list[ToolCall]) -> tuple[list[ToolCall], list[ToolCall]]:
        """(delegated calls, calls for the environment)."""
        if self.cfg is None or self.cfg.tool not in env.tools:
            return [], calls
        mine = [c for c in calls if c.name == self.cfg.tool]
        return mine, [c for c in calls if c.name != self.cfg.tool]

    async def run(
        self, run: Any, step: int, call: ToolCall, spawn: Spawn, pending: int = 1
    ) -> CallOutcome:
        """Run `call` as a child episode; its outcome as the parent's tool call. `pending`:
        the step's tool calls the parent's ledger has not counted yet (this one included):
        the child's tool calls come out of what is left after them."""
        cfg, t0 = self.cfg, time.perf_counter()
        text = call.arguments.get("task")
        if not isinstance(text, str) or not text.strip():
            fault = Fault(FaultKind.INVALID_ARGUMENTS, f"{cfg.tool}: give the sub-task as 'task'")
            return CallOutcome(call, ToolResult.failure(fault))
        if self.depth >= cfg.max_depth:
            why = f"{cfg.tool}: a sub-agent cannot delegate further (max_depth {cfg.max_depth})"
            return CallOutcome(call, ToolResult.failure(Fault(FaultKind.FORBIDDEN_TOOL, why)))
        k = len(self.children)
        prefix = run.agent + "/" if run.agent else ""
        agent = f"{prefix}d{k}"
        root_task = getattr(run.env, "root_task", run.task)
        child_env = ChildEnv(run.env, agent, root_task)
        child_cfg = self._budgets(run, pending)
        task = {"id": f"{run.task.get('id')}/{agent}", "prompt": text.strip()}
        replayed = (run.children_replay or {}).get(agent, {})  # replay: the child's records
        child = await spawn(
            child_env,
            task,
            run.policy,
            child_cfg,
            seed=run.seed,
            episode_id=f"{run.root_episode_id}/{agent}",
            sleep=run.sleep,
            template_kwargs=dict(run.conv.template_kwargs),  # the parent's date, say
            clock=replayed.get("clock"),
            summarize=replayed.get("summarize"),
            agent=agent,
            depth=self.depth + 1,
            parent={"episode_id": run.episode_id, "replay_id": run.replay_id, "step": step},
            children_replay=run.children_replay,
        )
        self.children.append(child)
        used = child.receipt.ledger.get("used", {})
        run.ledger.used["sampled_tokens"] += used.get("sampled_tokens", 0)
        run.ledger.used["tool_calls"] += used.get("tool_calls", 0)
        answer = (child.steps[-1].get("info") or {}).get("answer") if child.steps else None
        record = {
            "agent": agent,
            "step": step,
            "call_id": call.id,
            "replay_id": child.receipt.replay_id,
            "stop_reason": child.stop_reason.value,
            "attribution": child.attribution.value,
            "samples": len(child.trajectories),
            "sampled_tokens": used.get("sampled_tokens", 0),
            "tool_calls": used.get("tool_calls", 0),
            "answer": answer["text"] if answer else None,
        }
        if child.attribution is Attribution.POLICY and self.cfg.own_reward:
            record.update(own_reward(run.env, root_task, text.strip(), record["answer"]))
        self.records.append(record)
        ms = (time.perf_counter() - t0) * 1000
        if child.attribution in (Attribution.ENVIRONMENT, Attribution.UNKNOWN):
            kind = FaultKind.SERVER_ERROR
            if child.attribution is Attribution.UNKNOWN:
                kind = FaultKind.UNKNOWN
            why = child.receipt.error or child.stop_reason.value
            return CallOutcome(
                call, ToolResult.failure(Fault(kind, f"sub-agent {agent}: {why}"), ms)
            )
        if answer is None:  # the child's own outcome: it stopped without answering
            note = f"(the sub-agent stopped without an answer: {child.stop_reason.value})"
            return CallOutcome(call, ToolResult(note, latency_ms=ms))
        if "result" in replayed:  # exact replay: what the parent was shown, as recorded
            shown: str | Fault = replayed["result"]
        else:
            shown = child_result(run.env, root_task, text.strip(), answer["text"])
        if isinstance(shown, Fault):  # the environment's hook failed: its fault, not the child's
            return CallOutcome(call, ToolResult.failure(shown, ms))
        if shown != answer["text"]:
            record["result"] = shown  # the environment's words around the answer
        return CallOutcome(call, ToolResult(shown, latency_ms=ms))

    def _budgets(self, run: Any, pending: int) -> Any:
        """The child's rollout settings: its own steps and context; what the parent has left
        of tool calls (after this step's `pending` calls), of sampled tokens (less a final
        turn of the parent's) and of wall time."""
        b = self.rollout.budgets
        left_calls = run.ledger.remaining("tool_calls")
        left_tokens = run.ledger.remaining("sampled_tokens")
        if left_tokens is not None:
            left_tokens = max(1, left_tokens - self.rollout.max_turn_tokens)
        wall = b.wall_time_s
        if wall is not None and run.ledger.elapsed_s:
            wall = max(0.001, wall - run.ledger.elapsed_s[-1])
        budgets = b.model_copy(
            update={
                "steps": self.cfg.steps,
                "tool_calls": None if left_calls is None else max(0, left_calls - pending),
                "sampled_tokens": left_tokens,
                "wall_time_s": wall,
            }
        )
        return self.rollout.model_copy(update={"budgets": budgets})


def child_result(env: Env, task: dict[str, Any], subtask: str, answer: str) -> str | Fault:
    """What the parent sees of a child's answer: the answer itself, or what the environment
    makes of it where it defines ``subagent_result(task, subtask, answer) -> str`` (say, the
    range of articles the answer covers, as its own tools would name it). Its words are the
    environment's, so they carry no loss. A hook that raises or returns something that is not
    a string fails the call as `FaultKind.UNKNOWN` (the episode trains on nothing), never as
    the policy's."""
    while isinstance(env, ChildEnv):
        env = env.parent
    fn = getattr(env, "subagent_result", None)
    if fn is None:
        return answer
    try:
        value = fn(task, subtask, answer)
    except Exception as e:
        kind = type(e).__name__
        return Fault(FaultKind.UNKNOWN, f"subagent_result raised {kind}: {e}", False, kind)
    if not isinstance(value, str):
        why = f"subagent_result returned {type(value).__name__} {value!r}, not a string"
        return Fault(FaultKind.UNKNOWN, why, False)
    return value


def own_reward(env: Env, task: dict[str, Any], subtask: str, answer: str | None) -> dict:
    """The child's own reward, where the environment defines one (``subagent_reward``):
    ``{"reward": x}``; nothing where it defines none or returns None (the child trains with
    its parent's advantage); ``{"reward": None, "reward_error": ...}`` where it raised or
    returned something that is not a number (the evaluator's: the child's samples train on
    nothing). The grade comes from the environment's record of the task, never from what
    the child wrote about itself."""
    while isinstance(env, ChildEnv):
        env = env.parent
    fn = getattr(env, "subagent_reward", None)
    if fn is None:
        return {}
    try:
        value = fn(task, subtask, answer)
    except Exception as e:
        return {"reward": None, "reward_error": f"{type(e).__name__}: {e}"}
    if value is None:
        return {}
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        why = f"subagent_reward returned {type(value).__name__} {value!r}, not a number"
        return {"reward": None, "reward_error": why}
    return {"reward": float(value)}
