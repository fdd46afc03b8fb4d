"""One environment step, done carefully: retries that never repeat a side effect, and the
observation assembled from the env's answer, the runner's refusals and the output budget.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import Any

from tracerl.envs.base import CallOutcome, Env, Message, StepResult
from tracerl.envs.parsers import Action
from tracerl.rollout.budget import RetryPolicy
from tracerl.rollout.episode import result_record
from tracerl.types import Attribution, FaultKind


async def step_with_retries(
    env: Env,
    action: Action,
    retry: RetryPolicy,
    sleep: Callable[[float], Awaitable[None]],
    rec: dict[str, Any],
) -> tuple[StepResult | None, bool]:
    """`env.step` with retries: (the step's result or None if the env kept failing, whether
    the env raised). Every attempt's raw result is appended to ``rec["attempts"]``.

    Only the calls that failed with a retryable infrastructure fault are sent again; calls
    that went through are kept, so a retry never repeats a side effect. A write call that
    timed out is not retried: it may have happened.
    """
    t0 = time.perf_counter()
    kept: dict[str, CallOutcome] = {}
    kept_messages: dict[Any, Message] = {}
    pending = action

    def done(result: StepResult | None, raised: bool = False) -> tuple[StepResult | None, bool]:
        rec["latency_ms"] = round((time.perf_counter() - t0) * 1000, 3)
        if result is None and not raised:
            rec["infra_error"] = True
        return result, raised

    for attempt in range(retry.max_retries + 1):
        try:
            result = await env.step(pending)
        except Exception as e:
            rec.update(exception=type(e).__name__, unknown_error=True)
            rec["attempts"].append({"exception": f"{type(e).__name__}: {e}"})
            return done(None, raised=True)
        rec["attempts"].append(result_record(result))
        failed = {o.call.id: o for o in result.calls if _hard_infra(o)}
        kept.update({o.call.id: o for o in result.calls if o.call.id not in failed})
        kept_messages.update(
            {
                m.get("tool_call_id"): m
                for m in result.messages
                if m.get("tool_call_id") not in failed
            }
        )
        if not failed:
            return done(_merged(action, result, kept, kept_messages))
        faults = [o.fault for o in failed.values() if o.fault is not None]
        rec["exception"] = faults[0].exception_type or faults[0].kind.value
        retryable = all(f.retryable for f in faults) and not any(
            o.effect == "write" and o.fault is not None and o.fault.kind is FaultKind.TIMEOUT
            for o in failed.values()
        )
        if not retryable or attempt == retry.max_retries:
            break
        rec["retried"] = attempt + 1
        pending = dataclasses.replace(
            action, tool_calls=tuple(c for c in action.tool_calls if c.id in failed)
        )
        await sleep(retry.delay(attempt))
    return done(None)


def gave_up(rec: dict[str, Any]) -> str:
    """For a step that failed on every attempt (a tool server that crashed mid-call, an env
    that raised): its calls become its last attempt's, each with its classified fault, and
    the return value is the episode's error naming the first, so neither is found only by
    digging through the retries."""
    last = rec["attempts"][-1] if rec["attempts"] else {}
    rec["calls"] = last.get("calls", [])
    faults = [
        (c["action"]["tool"], c["result"]["error"])
        for c in rec["calls"]
        if (c.get("result") or {}).get("error")
    ]
    if faults:
        tool, f = faults[0]
        error = f"tool {tool!r}: {f['kind']}: {f['message']}"
    else:
        error = f"env.step raised {last.get('exception', rec.get('exception', 'an error'))}"
    tries = len(rec["attempts"])
    return error + (f" (after {tries} attempts)" if tries > 1 else "")


def _hard_infra(o: CallOutcome) -> bool:
    """The call failed for infrastructure reasons and produced no usable output."""
    f = o.fault
    return (
        f is not None
        and f.attribution is Attribution.ENVIRONMENT
        and f.kind is not FaultKind.TRUNCATED_OUTPUT
    )


def _merged(
    action: Action,
    last: StepResult,
    kept: dict[str, CallOutcome],
    messages: dict[Any, Message],
) -> StepResult:
    """The step's result over its attempts: each call's successful outcome, in call order."""
    if len(last.calls) == len(action.tool_calls):
        return last  # one attempt (or every call retried): nothing to merge
    order = [c.id for c in action.tool_calls]
    calls = [kept[i] for i in order if i in kept]
    gains = [o.result.evidence_gain for o in calls if o.result.evidence_gain is not None]
    return dataclasses.replace(
        last,
        messages=[messages[i] for i in order if i in messages]
        + [m for k, m in messages.items() if k not in order],
        calls=calls,
        evidence_gain=sum(gains) if gains else last.evidence_gain,
    )


def observation(
    action: Action,
    result: StepResult,
    refused: list[CallOutcome],
    renderer: Any,
    max_tokens: int,
) -> list[Message]:
    """What the model sees after a tool step: the env's tool messages and the runner's
    refusals in call order, then any other env messages; outputs longer than `max_tokens`
    are cut with a visible marker (and their call marked ``truncated``)."""
    by_id = {m.get("tool_call_id"): m for m in result.messages if m.get("role") == "tool"}
    by_id.update({o.call.id: o.message() for o in refused})
    messages = [by_id[c.id] for c in action.tool_calls if c.id in by_id]
    messages += [m for m in result.messages if m.get("role") != "tool"]
    outcomes = {o.call.id: o for o in result.calls}
    return [
        _truncate(m, outcomes.get(m.get("tool_call_id")), renderer, max_tokens) for m in messages
    ]


def _truncate(m: Message, outcome: CallOutcome | None, renderer: Any, limit: int) -> Message:
    content = m.get("content", "")
    if len(content.encode("utf-8")) <= limit:  # a token spells >= 1 byte: it cannot overflow
        return m
    ids = renderer.encode(content, content=True)
    if len(ids) <= limit:
        return m
    kept = renderer.decode(ids[:limit])
    marker = f"\n[... output truncated: showing {limit} of {len(ids)} tokens ...]"
    if outcome is not None:
        outcome.result.truncated = True
    return {**m, "content": kept + marker}
