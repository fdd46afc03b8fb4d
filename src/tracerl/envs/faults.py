"""`FaultInjector`: seeded, reproducible faults around any environment.

Wraps an env and, on each step that calls tools, injects with probability `rate` one of:

* ``timeout``, ``server_error`` (5xx), ``connection_refused`` — the request never reaches
  the wrapped env (so a retry is safe), and every call of the step fails with that fault;
* ``truncated_output`` — the wrapped env answers, but each tool output is cut short: the
  policy sees a degraded observation, so the episode can no longer teach it anything;
* ``latency`` — a heavy-tailed (Pareto) delay; when it passes the tool's timeout the step
  fails as a ``timeout``, otherwise it is only slow (and is not a fault).

Draws come from a generator seeded by (injector seed, episode seed), so the same episode sees
the same faults every run. Every injected fault is marked ``injected=True`` and logged in
`injected` for tests and benchmarks. Used by the tests, the adversarial eval and benchmarks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random
from collections.abc import Sequence
from typing import Any

from tracerl.envs.base import CallOutcome, Env, Message, StepResult
from tracerl.envs.parsers import Action
from tracerl.envs.tools import ToolResult, ToolSet
from tracerl.types import Fault, FaultKind

KINDS = ("timeout", "server_error", "connection_refused", "truncated_output", "latency")


class FaultInjector(Env):
    def __init__(
        self,
        env: Env,
        *,
        rate: float = 0.3,
        kinds: Sequence[str] = KINDS,
        seed: int = 0,
        latency_scale_ms: float = 200.0,
        latency_alpha: float = 1.2,
        sleep: bool = False,
    ) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"FaultInjector: rate must be in [0, 1], got {rate}")
        bad = sorted(set(kinds) - set(KINDS))
        if bad or not kinds:
            raise ValueError(f"FaultInjector: unknown fault kinds {bad}; valid: {KINDS}")
        self.env = env
        self.rate, self.kinds, self.seed = rate, tuple(kinds), seed
        self.latency_scale_ms, self.latency_alpha, self.sleep = (
            latency_scale_ms,
            latency_alpha,
            sleep,
        )
        self.name, self.version = env.name, env.version  # type: ignore[misc]
        self.side_effect_guard = env.side_effect_guard
        self.rng = random.Random(seed)
        self.injected: list[dict[str, Any]] = []  # every fault injected (and slow steps)
        self._steps = 0
        self._task_id = None

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The wrapped env's: a wrapper must not change what the prompt shows."""
        return self.env.tool_schemas()

    @property
    def tools(self) -> ToolSet:  # type: ignore[override]
        """The wrapped env's (which may change at reset: an MCP server's listing)."""
        return self.env.tools

    def services(self) -> list[dict[str, Any]]:
        return self.env.services()

    def describe(self) -> dict[str, Any]:
        """For receipts: how this wrapper was configured."""
        return {"fault_injector": {"rate": self.rate, "kinds": list(self.kinds), "seed": self.seed}}

    async def reset(self, task: dict[str, Any], seed: int) -> list[Message]:
        self.rng = random.Random(f"{self.seed}:{seed}")
        self._steps, self._task_id = 0, task.get("id")
        self.env.episode_id = self.episode_id
        return await self.env.reset(task, seed)

    async def step(self, action: Action) -> StepResult:
        self._steps += 1
        if not action.tool_calls or self.rng.random() >= self.rate:
            return await self.env.step(action)
        kind = self.rng.choice(self.kinds)
        if kind == "latency":
            delay_ms = self.latency_scale_ms * self.rng.paretovariate(self.latency_alpha)
            limit_ms = 1000 * min(self._timeout(c.name) for c in action.tool_calls)
            if delay_ms < limit_ms:
                self._log("latency", delay_ms=delay_ms, fault=False)
                if self.sleep:
                    await asyncio.sleep(delay_ms / 1000)
                result = await self.env.step(action)
                for c in result.calls:
                    c.result.latency_ms += delay_ms
                return result
            kind = "timeout"
        if kind == "truncated_output":
            return self._truncate(await self.env.step(action))
        fault_kind = FaultKind(kind)
        self._log(kind, fault=True)
        outcomes = []
        for c in action.tool_calls:
            fault = Fault(fault_kind, _MESSAGES[kind].format(tool=c.name), injected=True)
            latency = 1000 * self._timeout(c.name) if kind == "timeout" else 0.0
            outcomes.append(CallOutcome(c, ToolResult.failure(fault, latency), *self._meta(c)))
        messages = [o.message() for o in outcomes]
        return StepResult(messages, calls=outcomes, info={"injected": kind})

    def _truncate(self, result: StepResult) -> StepResult:
        """Cut the outputs of the calls that succeeded (an error message is left alone: its
        fault already has an owner). No successful call, no fault injected."""
        ok = {c.call.id for c in result.calls if c.result.ok}
        if not ok:
            return result
        self._log("truncated_output", fault=True)
        keep = self.rng.uniform(0.1, 0.6)
        messages = [
            {**m, "content": m["content"][: max(1, int(len(m["content"]) * keep))]}
            if m.get("tool_call_id") in ok
            else m
            for m in result.messages
        ]
        by_id = {m.get("tool_call_id"): m["content"] for m in messages}
        for c in result.calls:
            if c.call.id in ok:
                fault = Fault(
                    FaultKind.TRUNCATED_OUTPUT,
                    "the service returned a cut-off output",
                    injected=True,
                )
                content = by_id.get(c.call.id, c.result.content)
                c.result = dataclasses.replace(
                    c.result, content=content, error=fault, truncated=True
                )
        return dataclasses.replace(
            result, messages=messages, info={**result.info, "injected": "truncated_output"}
        )

    def _timeout(self, name: str) -> float:
        return self.tools[name].timeout_s if name in self.tools else 10.0

    def _meta(self, call: Any) -> tuple[str | None, str]:
        if call.name in self.tools:
            t = self.tools[call.name]
            return t.version, t.effect
        return None, "read"

    def _log(self, kind: str, *, fault: bool, **extra: Any) -> None:
        self.injected.append(
            {"task_id": self._task_id, "step": self._steps, "kind": kind, "fault": fault, **extra}
        )

    async def close(self) -> None:
        await self.env.close()

    async def final_state(self) -> dict[str, Any] | None:
        return await self.env.final_state()

    def prepare(self) -> None:
        self.env.prepare()

    def sample_tasks(self, n: int, *, seed: int = 0, split: str = "train") -> list[dict[str, Any]]:
        return self.env.sample_tasks(n, seed=seed, split=split)

    def check_script(self, task: dict[str, Any]) -> list[Action]:
        return self.env.check_script(task)

    def snapshot(self) -> Any:
        return self.env.snapshot()

    def __getattr__(self, name: str) -> Any:  # anything else: the wrapped env's
        return getattr(self.__dict__["env"], name)


class SlowTools(FaultInjector):
    """Every tool step is slow and none fails: a log-normal delay whose median is
    `median_ms` and whose 95th percentile is `tail` times the median (a service whose slow
    calls are ten times its typical ones), seeded per episode like the faults. For
    benchmarks of overlapping rollouts with training."""

    def __init__(
        self,
        env: Env,
        *,
        median_ms: float = 100.0,
        tail: float = 10.0,
        seed: int = 0,
        answers_too: bool = False,
        reset_too: bool = False,
    ):
        """`answers_too`: the final answer's step is slow as well (a grading service);
        `reset_too`: so is the start of each episode (a sandbox being provisioned)."""
        super().__init__(env, rate=0.0, seed=seed)
        self.answers_too, self.reset_too = answers_too, reset_too
        if median_ms <= 0 or tail < 1:
            raise ValueError(
                f"SlowTools: need median_ms > 0 and tail >= 1, got {median_ms}, {tail}"
            )
        self.median_ms = median_ms
        self.sigma = math.log(tail) / 1.6449  # z of the 95th percentile

    async def reset(self, task: dict[str, Any], seed: int) -> list[Message]:
        messages = await super().reset(task, seed)  # seeds this episode's draws
        if self.reset_too:
            await self._delay()
        return messages

    async def _delay(self) -> float:
        delay_ms = self.median_ms * math.exp(self.sigma * self.rng.gauss(0.0, 1.0))
        self._log("latency", delay_ms=delay_ms, fault=False)
        await asyncio.sleep(delay_ms / 1000)
        return delay_ms

    def describe(self) -> dict[str, Any]:
        return {"slow_tools": {"median_ms": self.median_ms, "sigma": self.sigma, "seed": self.seed}}

    async def step(self, action: Action) -> StepResult:
        self._steps += 1
        if not action.tool_calls and not self.answers_too:
            return await self.env.step(action)
        delay_ms = await self._delay()
        result = await self.env.step(action)
        for c in result.calls:
            c.result.latency_ms += delay_ms
        return result


_MESSAGES = {
    "timeout": "{tool}: the service did not answer in time",
    "server_error": "{tool}: 503 Service Unavailable",
    "connection_refused": "{tool}: connection refused",
}
