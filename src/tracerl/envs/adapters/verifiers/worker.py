"""The verifiers side of tracerl's `verifiers` adapter: a program run by verifiers' own Python.

verifiers 0.4 pins packages tracerl cannot share (``mcp==2.0.0``), so it lives in a virtual
environment of its own (``.venv-verifiers``, as vLLM does) and this file runs there, started
by `tracerl.envs.adapters.verifiers.process`. It imports only the standard library and
verifiers; nothing of tracerl.

    python worker.py '{"taskset": "vf-last-digit", "harness": "null", ...}'

It loads the taskset once, starts verifiers' serving resources (its interception server, the
taskset's shared tool servers), then answers JSON lines on stdin, one JSON line each on
stdout (anything a library prints goes to stderr). Requests carry an ``id``; the answers
come back in any order, so rollouts run concurrently:

* ``{"op": "rollout", "split", "index", "base_url", "session"}``: one episode of
  verifiers' own (`Env.run_episode`: the harness, its program and tools, the task's rewards),
  every model call sent to ``base_url`` (tracerl's gateway) with the header
  ``X-Tracerl-Session: <session>``. The answer: its rewards, metrics, last reply, messages,
  errors (each tagged with whose it is) and verifiers' stop condition.
* ``{"op": "score", "split", "index", "messages"}``: the task's rewards and metrics, computed
  by verifiers (`Task.score`) on a trace holding `messages` (no runtime: offline scoring).

The first line written is ``{"ready": true, "tasks": {...}, "versions": {...}}`` (or
``{"ready": false, "error": ...}``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import importlib.metadata
import inspect
import json
import logging
import os
import re
import signal
import sys
import traceback
from typing import Any

SESSION_HEADER = "X-Tracerl-Session"
KEY_VAR = "TRACERL_VERIFIERS_KEY"
"""The env var verifiers' client reads its API key from: the gateway finds the episode by
the session header, so the key is only a placeholder."""

if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]  # this folder (tracerl's agent.py, process.py) must not shadow a taskset's

_out = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)  # a library's print goes to stderr, never into the protocol


def send(message: dict[str, Any]) -> None:
    _out.write(json.dumps(message, default=str) + "\n")
    _out.flush()


def jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def heldout_by_key(key: str, fraction: float) -> bool:
    """Whether the task with `key` is held out: a fixed hash of its key, so the splits are
    the same in every process and on every machine."""
    digest = hashlib.sha256(f"tracerl-heldout:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


class Worker:
    def __init__(self, spec: dict[str, Any]) -> None:
        import verifiers.v1 as vf
        from verifiers.v1.utils.loaders import load_environment, resolve_env_config

        self.vf = vf
        self.spec = spec
        os.environ.setdefault(KEY_VAR, "tracerl")
        harness = {"id": spec.get("harness") or "null", **(spec.get("harness_config") or {})}
        agent = {"harness": harness, "runtime": {"type": "subprocess"}}
        self.envs: dict[str, Any] = {}
        self.tasks: dict[str, list[Any]] = {}
        heldout = spec.get("heldout", 0.2)
        base = {"id": spec["taskset"], **(spec.get("taskset_config") or {})}
        if isinstance(heldout, dict):  # the held-out split is another config of the taskset
            configs = {"train": base, "heldout": {**base, **heldout}}
        else:
            configs = {"all": base}
        for split, taskset in configs.items():
            config = resolve_env_config(
                {
                    "taskset": taskset,
                    "agent": agent,
                    "max_concurrent_agents": 1,
                }
            )
            self.envs[split] = env = load_environment(config)
            self.tasks[split] = list(env.taskset)
        if "all" in self.envs:
            everything = self.tasks.pop("all")
            self.envs["train"] = self.envs["heldout"] = self.envs.pop("all")
            held = [heldout_by_key(t.key, float(heldout)) for t in everything]
            self.tasks["train"] = [t for t, h in zip(everything, held, strict=True) if not h]
            self.tasks["heldout"] = [t for t, h in zip(everything, held, strict=True) if h]
        env = self.envs["train"]
        if len(env._agent_specs) != 1:
            raise ValueError(
                f"{type(env).__name__} seats {len(env._agent_specs)} agents "
                f"({', '.join(env._agent_specs)}); tracerl trains environments with one: every "
                "seat's model calls would be recorded as the policy's"
            )
        self.harness = next(iter(env._harnesses.values()))
        if self.harness.EXECUTES_CODE and not spec.get("allow_local_execution"):
            raise PermissionError(
                f"harness {harness['id']!r} runs the model's commands, and here it would run "
                "them on this machine (verifiers' subprocess runtime, no sandbox); choose a "
                "harness that does not (null), or set allow_local_execution: true if this "
                "machine is a disposable sandbox"
            )

    def described(self) -> dict[str, Any]:
        """The tasks, as tracerl keeps them: JSON, each with verifiers' key and its data."""
        out: dict[str, list[dict[str, Any]]] = {}
        for split, tasks in self.tasks.items():
            out[split] = [
                {
                    "index": i,
                    "key": task.key,
                    "type": type(task).__name__,
                    "data": task.data.model_dump(mode="json", exclude_none=True),
                }
                for i, task in enumerate(tasks)
            ]
        return out

    def versions(self) -> dict[str, str]:
        import verifiers

        out = {"verifiers": verifiers.__version__, "harness": self.harness.config.id}
        module = type(self.envs["train"].taskset).__module__.split(".")[0]
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out["taskset"] = f"{module} {importlib.metadata.version(module)}"
        out.setdefault("taskset", module)
        return out

    async def serving(self, stack: contextlib.AsyncExitStack) -> None:
        for env in {id(e): e for e in self.envs.values()}.values():
            await stack.enter_async_context(env.serving())
        await self.warm()

    async def warm(self) -> None:
        """The harness's set-up once, now: the first builds its program's environment (uv
        resolves and installs the program's packages), which must not happen inside the
        first episode's time budget; later episodes find it built."""
        from verifiers.v1.runtimes import SubprocessConfig, make_runtime

        runtime = make_runtime(SubprocessConfig(), name="tracerl-warm-up")
        await runtime.start()
        try:
            await self.harness.setup(runtime)
        finally:
            await runtime.stop()

    def task(self, request: dict[str, Any]) -> Any:
        """The task a request names by split and index, checked against its key (a task
        drawn from another configuration or release of the taskset is refused)."""
        task = self.tasks[request["split"]][request["index"]]
        if request.get("key") not in (None, task.key):
            raise LookupError(
                f"task {request['split']}/{request['index']} is not the one this worker loaded "
                "(another version or config of the taskset)"
            )
        return task

    async def rollout(self, request: dict[str, Any]) -> dict[str, Any]:
        from verifiers.v1.clients import EvalClientConfig

        split = request["split"]
        task = self.task(request)
        client = EvalClientConfig(
            base_url=request["base_url"],
            api_key_var=KEY_VAR,
            headers={SESSION_HEADER: request["session"]},
        )
        # No sampling settings: the run's own (temperature, the turn's token limit) apply
        ctx = self.vf.ModelContext(model=request.get("model") or "policy", client=client)
        episode = await self.envs[split].run_episode(task, ctx)
        errors = [_error(e) for e in episode.errors]
        if len(episode.traces) != 1:
            errors.append(_failure(f"the episode has {len(episode.traces)} traces, not one"))
            return {"ok": False, "errors": errors, "reward": None}
        trace = episode.traces[0]
        errors += [_error(e) for e in trace.errors]
        if trace.is_timeout or episode.is_timeout:  # a stage deadline: not the model's doing
            errors.append(_failure(f"verifiers' deadline expired ({trace.stop_condition})"))
        return {**_scores(trace), "ok": episode.ok, "errors": errors, **_transcript(trace)}

    async def score(self, request: dict[str, Any]) -> dict[str, Any]:
        from verifiers.v1.graph import MessageNode
        from verifiers.v1.state import state_cls
        from verifiers.v1.trace import AgentInfo, Trace, TraceTask

        task = self.task(request)
        nodes = []
        for i, message in enumerate(request["messages"]):
            # the assistant's messages are the model's replies: verifiers reads a reply from
            # sampled nodes only
            sampled = message.get("role") == "assistant"
            node = MessageNode.model_validate(
                {"parent": i - 1 if i else None, "message": message, "sampled": sampled}
            )
            nodes.append(node)
        trace = Trace(
            task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
            state=state_cls(type(task))(),
            agent=AgentInfo(config=self.vf.AgentConfig(), name="tracerl", trainable=False),
            nodes=nodes,
        )
        try:
            await task.score(trace)
        except Exception as e:  # the rubric raised (verifiers' TaskError, "task X scoring: ...")
            trace.errors.append(self.vf.Error(type=type(e).__name__, message=str(e)))
        errors = [_error(e) for e in trace.errors]
        scores = _scores(trace)
        # rewards that need the task's runtime are skipped offline: unscored, never dropped
        missing = [fn.__name__ for fn in task.hooks("reward") if _needs_runtime(fn)]
        missing += [j.reward_name for j in task.plugged_judges() if _needs_runtime(j.score)]
        if missing:
            scores["unscored"] = [*scores["unscored"], *missing]
            scores["reward"] = None
        return {**scores, "ok": not errors, "errors": errors, **_transcript(trace)}


SCORING = re.compile(r"task \w+ scoring(:| timed out)")
"""How verifiers names a crash in a task's scoring (`boundary(TaskError, "task X scoring")`)."""


def _error(error: Any) -> dict[str, Any]:
    """verifiers' error record, with whose it is: a crash in the task's scoring (its rewards
    and metrics) is the evaluator's; a model call that failed is the gateway's to explain
    (tracerl's session knows why: a budget spent, the sampler down); anything else (the
    harness, its program, the tools, the runtime, the task's set-up) the environment's."""
    kind = getattr(error, "type", "") or ""
    message = getattr(error, "message", "") or ""
    if kind == "TaskError" and SCORING.match(message):
        owner = "evaluator"
    elif kind in ("ProviderError", "InterceptionError"):
        owner = "model_call"
    else:
        owner = "environment"
    return {"type": kind, "message": message[:2000], "owner": owner}


def _needs_runtime(fn: Any) -> bool:
    """Whether verifiers skips this reward when it scores without a runtime (as it decides)."""
    parameter = inspect.signature(fn).parameters.get("runtime")
    return parameter is not None and parameter.default is inspect.Parameter.empty


def _failure(message: str) -> dict[str, Any]:
    return {"type": "RolloutError", "message": message, "owner": "environment"}


def _scores(trace: Any) -> dict[str, Any]:
    rewards = {
        name: None if r is None else {"score": r.score, "weight": r.weight}
        for name, r in trace.rewards.items()
    }
    unscored = [name for name, r in rewards.items() if r is None]
    reward = None if unscored or not rewards else float(trace.reward)
    return {
        "reward": reward,
        "rewards": rewards,
        "unscored": unscored,
        "metrics": jsonable(trace.metrics),
    }


def _transcript(trace: Any) -> dict[str, Any]:
    return {
        "reply": trace.last_reply if trace.nodes else "",
        "messages": [m.model_dump(mode="json", exclude_none=True) for m in trace.messages],
        "stop_condition": trace.stop_condition,
        "trace_id": trace.id,
    }


async def serve(worker: Worker) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2**26)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    running: dict[Any, asyncio.Task[None]] = {}

    def forget(rid: Any, _: asyncio.Task[None]) -> None:
        running.pop(rid, None)

    async def answer(request: dict[str, Any]) -> None:
        rid = request.get("id")
        try:
            op = request.get("op")
            if op == "rollout":
                result = await worker.rollout(request)
            elif op == "score":
                result = await worker.score(request)
            else:
                raise ValueError(f"unknown op {op!r}")
            send({"id": rid, "result": result})
        except Exception as e:
            send(
                {
                    "id": rid,
                    "error": f"{type(e).__name__}: {e}",
                    "traceback": traceback.format_exc(),
                }
            )

    async with contextlib.AsyncExitStack() as stack:
        await worker.serving(stack)
        send({"ready": True, "tasks": worker.described(), "versions": worker.versions()})
        while line := await reader.readline():
            if not line.strip():
                continue
            request = json.loads(line)
            if request.get("op") == "cancel":  # tracerl gave the episode up: stop its rollout
                if (target := running.get(request.get("target"))) is not None:
                    target.cancel()
                continue
            rid = request.get("id")
            running[rid] = task = asyncio.create_task(answer(request))
            task.add_done_callback(functools.partial(forget, rid))
        for task in list(running.values()):
            task.cancel()
        await asyncio.gather(*running.values(), return_exceptions=True)


def main() -> None:
    spec = json.loads(sys.argv[1])
    # verifiers' harnesses run their programs with uv: this environment's own, never one it
    # would otherwise install into the user's home
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    paths = [os.path.abspath(p) for p in spec.get("path") or []]
    sys.path[:0] = paths
    # ... and for the processes verifiers starts (a taskset's tool servers: python -m ...)
    os.environ["PYTHONPATH"] = os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")])
    logging.basicConfig(
        level=os.environ.get("TRACERL_VERIFIERS_LOG_LEVEL", "WARNING"),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        worker = Worker(spec)
    except Exception as e:
        send(
            {
                "ready": False,
                "error": f"{type(e).__name__}: {e}",
                "traceback": traceback.format_exc(),
            }
        )
        raise SystemExit(1) from None
    # tracerl stops a worker by closing its stdin (the serve loop ends, verifiers' servers
    # close); SIGTERM unwinds the same way rather than orphaning them
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(worker))


if __name__ == "__main__":
    main()
