"""The agent that plays a `verifiers` environment under training: one rollout of verifiers'
own (its harness, program and tool servers; the task's rubric) in the worker, with every
model call sent to tracerl's gateway under this episode's session.

What it returns is the episode's answer, the rollout's outcome as verifiers computed it (the
rubric's rewards and metrics, the last reply, the messages): the reward reads it
(`Verifiers.reward`). It raises, the environment's failure, when the worker is gone or the
rollout failed for anything but the model (the harness, its program, a tool server, the
task's own setup); a model call the gateway refused is the gateway's to explain (a budget
spent, the sampler down), so tracerl's session decides that episode's ending.
"""

from __future__ import annotations

import asyncio
from typing import Any

from tracerl.envs.adapters.verifiers.process import WorkerDied, running_worker


class VerifiersRolloutError(RuntimeError):
    """verifiers' rollout failed for a reason that is not the model's: the environment's."""


async def solve(task: dict[str, Any], base_url: str, api_key: str) -> dict[str, Any]:
    worker = running_worker(task["worker"])
    if worker is None:
        raise WorkerDied("no verifiers worker runs for this task's configuration")
    future = worker.request(
        "rollout",
        split=task["split"],
        index=task["index"],
        key=task["key"],
        base_url=base_url,
        session=api_key,
    )
    result: dict[str, Any] = await asyncio.wrap_future(future)
    failed = [e for e in result.get("errors") or [] if e.get("owner") == "environment"]
    if failed:
        raise VerifiersRolloutError(f"{failed[0]['type']}: {failed[0]['message'][:1000]}")
    refused = [e for e in result.get("errors") or [] if e.get("owner") == "model_call"]
    if refused:
        raise VerifiersRolloutError(f"a model call failed: {refused[0]['message'][:1000]}")
    return result
