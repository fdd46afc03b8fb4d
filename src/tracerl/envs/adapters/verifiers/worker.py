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
import hashlib
import importlib.metadata
import json
import logging
import os
import sys
import traceback
from typing import Any

SESSION_HEADER = "X-Tracerl-Session"
KEY_VAR = "TRACERL_VERIFIERS_KEY"
"""The env var verifiers' client reads its API key from: the gateway finds the episode by
the session header, so the key is only a placeholder."""

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
        trace = episode.traces[-1] if episode.traces else None
        errors = [_error(e, "episode") for e in episode.errors]
        if trace is None:
            return {"ok": False, "errors": errors, "reward": None}
        errors += [_error(e, "trace") for e in trace.errors]
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
        except Exception as e:  # the rubric raised: verifiers records it as a TaskError
            trace.errors.append(self.vf.Error(type=type(e).__name__, message=str(e)))
        errors = [_error(e, "trace") for e in trace.errors]
        return {**_scores(trace), "ok": not errors, "errors": errors, **_transcript(trace)}


def _error(error: Any, where: str) -> dict[str, Any]:
    """verifiers' error record, with whose it is: a crash in the task's scoring (its rewards
    and metrics) is the evaluator's; anything else (the harness, its program, the tools,
    the runtime, the taskset's setup) the environment's. A model call the gateway refused
    comes back as a provider error: tracerl knows why from its own session."""
    kind = getattr(error, "type", "") or ""
    message = getattr(error, "message", "") or ""
    if kind == "TaskError" and "scoring" in message:
        owner = "evaluator"
    elif kind in ("ProviderError", "InterceptionError"):
        owner = "model_call"
    else:
        owner = "environment"
    return {"type": kind, "message": message[:2000], "owner": owner, "where": where}


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
    pending: set[asyncio.Task[None]] = set()

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
            task = asyncio.create_task(answer(json.loads(line)))
            pending.add(task)
            task.add_done_callback(pending.discard)
        for task in list(pending):
            task.cancel()


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
    asyncio.run(serve(worker))


if __name__ == "__main__":
    main()
