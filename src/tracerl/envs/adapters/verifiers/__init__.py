"""`verifiers`: an environment written for Prime Intellect's verifiers (0.4: taskset, harness,
rubric), trained as it ships.

    env:
      name: verifiers
      kwargs:
        taskset: vf-last-digit          # the taskset's id: an installed package (hub ids too)
        taskset_config: {num_tasks: 200}
        harness: null                   # verifiers' tool-using chat loop (the default)
        heldout: 0.2                    # or a mapping: the taskset's config for held-out tasks
        path: [envs]                    # folders put on the worker's sys.path (optional)

verifiers pins packages tracerl cannot share (``mcp==2.0.0``), so it runs in a virtual
environment of its own (``make verifiers``: ``.venv-verifiers``; or ``env.kwargs.python``), in
one worker process per configuration (`process`), started before the first episode. Its
taskset's package must be installed there (or be on `path`).

Episodes are verifiers' own: its harness runs its chat program and the taskset's tool
servers, and every model call goes to tracerl's gateway (`tracerl.gateway`), which samples
from the run's policy and records each token's author. So this environment comes with its
agent (`agent`: the run's ``agent`` is set to it unless the config names another): nothing
of verifiers' is rewritten and every token the policy sampled is recorded verbatim.

The reward is the taskset's own rubric (its ``@vf.reward`` functions, weighted as verifiers
weighs them), computed by verifiers in the worker, out of the policy's reach: a rubric that
raises is the evaluator's failure (never a 0); the harness, its program or tool servers
failing, or the worker dying, is the environment's; what the model wrote is the policy's.

`tracerl check-env` plays this environment natively (`reset` gives the task's system prompt
and prompt, the reply ends the episode, verifiers scores it offline): that checks the tasks,
splits and rubric; the harness runs under `tracerl train` and `tracerl eval`. The scripted
reply is the task data's `gold_field` (``answer`` by default).
"""

from __future__ import annotations

import concurrent.futures
import copy
import json
import random
from typing import Any

from tracerl.envs.adapters.verifiers.process import running_worker, spec_key, worker_for
from tracerl.envs.base import Message, StepResult, ToolEnv
from tracerl.envs.parsers import Action
from tracerl.errors import UserError
from tracerl.rewards.compose import RewardContext, Score

AGENT = "tracerl.envs.adapters.verifiers.agent:solve"
"""The agent that plays this environment under training (verifiers' harness, through the
gateway)."""
SPLITS = ("train", "heldout")
SCORE_TIMEOUT_S = 30.0
VERIFIERS_REWARD = """
components:
  - {name: attribution, fn: attribution_label, layer: attribution, weight: 0.0}
  - {name: rubric, fn: reward, layer: outcome, weight: 1.0}
"""
"""The environment's own reward: verifiers' rubric (its weighted sum) as the one outcome."""


class Verifiers(ToolEnv):
    """A verifiers taskset's tasks and rubric; its harness plays it (`agent`)."""

    name = "verifiers"
    version = "1.0"
    """The adapter's own version; an instance's names verifiers' and the taskset's too, once
    its worker has started."""
    splits = SPLITS
    reward_components = VERIFIERS_REWARD

    def __init__(
        self,
        taskset: str | None = None,
        taskset_config: dict[str, Any] | None = None,
        *,
        harness: str | None = None,
        harness_config: dict[str, Any] | None = None,
        heldout: float | dict[str, Any] = 0.2,
        path: list[str] | None = None,
        python: str | None = None,
        gold_field: str = "answer",
        allow_local_execution: bool = False,
        side_effect_guard: str = "dry_run",
    ) -> None:
        """
        Args:
            taskset: the taskset's id (``vf-last-digit``, a hub id ``owner/name``): an
                installed package in verifiers' environment, exporting its Taskset.
            taskset_config: that taskset's config fields (``--env.taskset.*`` in vf-eval).
            harness: verifiers' harness id (default ``null``: its chat loop, with the
                taskset's tools over MCP); one that runs the model's commands is refused
                unless `allow_local_execution` (it would run them on this machine).
            harness_config: the harness's config fields.
            heldout: the share of tasks held out (by a fixed hash of verifiers' task key), or
                a mapping: the taskset config of the held-out tasks (``{split: test}``).
            path: folders put first on the worker's ``sys.path``.
            python: the Python with verifiers (default ``.venv-verifiers``).
            gold_field: the task data's field check-env's scripted reply is read from.
            allow_local_execution: let a harness run the model's commands here, unsandboxed.
            side_effect_guard: as every `ToolEnv`'s (verifiers' tools are its harness's).
        """
        super().__init__(side_effect_guard=side_effect_guard)
        if not isinstance(taskset, str) or not taskset:
            raise UserError(
                "env.kwargs.taskset: name the verifiers taskset (its id, an installed package)",
                "e.g. env: {name: verifiers, kwargs: {taskset: vf-last-digit}}",
            )
        for key, value in (("taskset_config", taskset_config), ("harness_config", harness_config)):
            if value is not None and not isinstance(value, dict):
                raise UserError(f"env.kwargs.{key}: a mapping of config fields, got {value!r:.80}")
        if isinstance(heldout, bool) or not (
            isinstance(heldout, dict) or (isinstance(heldout, int | float) and 0 < heldout < 1)
        ):
            raise UserError(
                f"env.kwargs.heldout: a share between 0 and 1, or the held-out taskset's "
                f"config, got {heldout!r:.80}",
                "e.g. heldout: 0.2, or heldout: {split: test}",
            )
        if path is not None and not (
            isinstance(path, list) and all(isinstance(p, str) for p in path)
        ):
            raise UserError(f"env.kwargs.path: a list of folders, got {path!r:.80}")
        self.worker_spec: dict[str, Any] = {
            "taskset": taskset,
            "taskset_config": dict(taskset_config or {}),
            "harness": harness or "null",
            "harness_config": dict(harness_config or {}),
            "heldout": heldout,
            "path": list(path or []),
            "allow_local_execution": bool(allow_local_execution),
        }
        self.key = spec_key(self.worker_spec)
        self.python, self.gold_field = python, gold_field
        self.messages: list[Message] = []

    # ---- the worker, its tasks ------------------------------------------------------------
    def worker(self) -> Any:
        """The running worker (started on first use: tasks drawn, or `prepare`)."""
        worker = worker_for(self.worker_spec, self.python)
        versions = worker.versions
        self.version = (  # type: ignore[misc]
            f"{type(self).version}/verifiers-{versions.get('verifiers')}/"
            f"{versions.get('taskset')}/{versions.get('harness')}"
        )
        return worker

    def prepare(self) -> None:
        self.worker()

    def pool(self, split: str) -> list[dict[str, Any]]:
        if split not in SPLITS:
            raise ValueError(f"verifiers: unknown split {split!r}; valid: {', '.join(SPLITS)}")
        return [self._task(split, t) for t in self.worker().tasks[split]]

    def _task(self, split: str, t: dict[str, Any]) -> dict[str, Any]:
        data = t["data"]
        prompt = data.get("prompt")
        return {
            "id": f"{split}-{t['index']}-{t['key'][:8]}",
            "split": split,
            "index": t["index"],
            "key": t["key"],
            "worker": self.key,
            "prompt": prompt if isinstance(prompt, str) else json.dumps(prompt)[:2000],
            "data": data,
        }

    def sample_tasks(self, n: int, *, seed: int = 0, split: str = "train") -> list[dict[str, Any]]:
        """`n` tasks of the split (at most its size), in an order fixed by `seed`."""
        pool = self.pool(split)
        if not pool:
            raise UserError(
                f"verifiers: the {split} split of {self.worker_spec['taskset']} has no tasks",
                "raise the taskset's size, or set env.kwargs.heldout",
            )
        order = random.Random(f"verifiers:{self.key}:{split}:{seed}")
        return [copy.deepcopy(pool[i]) for i in order.sample(range(len(pool)), min(n, len(pool)))]

    # ---- a native episode (check-env, rehearsals): the task's prompt, one reply ------------
    async def setup(self, task: dict[str, Any], seed: int) -> list[Message]:
        self.messages = prompt_messages(task["data"])
        return copy.deepcopy(self.messages)

    async def step(self, action: Action) -> StepResult:
        return await self.finish(action)

    async def finish(self, action: Action) -> StepResult:
        self.done = True
        reply = action.text or action.answer or ""
        self.answer = {
            "reply": reply,
            "messages": [*self.messages, {"role": "assistant", "content": reply}],
        }
        return StepResult([], terminated=True, info={"answer": self.answer})

    def check_script(self, task: dict[str, Any]) -> list[Action]:
        gold = task["data"].get(self.gold_field)
        text = "done" if gold is None else str(gold)
        return [Action(text=text, answer=text)]

    # ---- the verifier ---------------------------------------------------------------------
    def reward(self, ctx: RewardContext) -> Score:
        """verifiers' rubric: the scores verifiers computed in the episode's rollout (however
        the episode ended: a reply the token limit cut is scored as verifiers saw it), else,
        for a native episode (check-env, a rehearsal), verifiers scoring its messages now."""
        for found in (ctx.answer, ctx.agent.get("returned")):
            if isinstance(found, dict) and "rewards" in found:
                return rubric_score(found)
        messages = (ctx.answer or {}).get("messages")
        if not messages:
            raise RuntimeError("verifiers computed no scores for this episode (no rollout)")
        worker = running_worker(self.key)  # never started here: scoring must not wait on it
        if worker is None:
            raise RuntimeError("verifiers' worker is not running: the rubric cannot score")
        task = ctx.task
        future = worker.request(
            "score", split=task["split"], index=task["index"], key=task["key"], messages=messages
        )
        try:
            return rubric_score(future.result(SCORE_TIMEOUT_S))
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"verifiers did not score within {SCORE_TIMEOUT_S:g} s") from None


def prompt_messages(data: dict[str, Any]) -> list[Message]:
    """A verifiers task's opening messages: its system prompt and its prompt (a text, or
    messages)."""
    messages: list[Message] = []
    if data.get("system_prompt"):
        messages.append({"role": "system", "content": data["system_prompt"]})
    prompt = data.get("prompt")
    if isinstance(prompt, str):
        messages.append({"role": "user", "content": prompt})
    elif isinstance(prompt, list):
        messages += [
            {"role": m.get("role", "user"), "content": m.get("content") or ""} for m in prompt
        ]
    return messages


def rubric_score(result: dict[str, Any]) -> Score:
    """The rubric's reward from a worker's answer; raises (the evaluator's failure) when the
    rubric crashed or left a reward unscored."""
    crashed = [e for e in result.get("errors") or [] if e.get("owner") == "evaluator"]
    if crashed:
        raise RuntimeError(f"verifiers' rubric raised: {crashed[0]['message'][:500]}")
    if result.get("unscored"):
        raise RuntimeError(f"verifiers left rewards unscored: {', '.join(result['unscored'])}")
    value = result.get("reward")
    if value is None:
        raise RuntimeError("verifiers computed no reward (the taskset declares no @vf.reward?)")
    evidence = {
        "rewards": result.get("rewards") or {},
        "metrics": result.get("metrics") or {},
        "reply": str(result.get("reply") or "")[-200:],
    }
    return Score(float(value), evidence)
