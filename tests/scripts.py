"""Scripted agents for rollout tests: each episode follows a plan chosen by its group index.

Plans (one action text per turn), for a refund_desk task:
  "good":      look up order + policy, refund (if allowed), answer
  "bad_tool":  calls a tool that does not exist, then behaves
  "bad_args":  issue_refund with a non-numeric amount, then behaves
  "garbled":   an unreadable turn, then behaves
"""

from __future__ import annotations

from typing import Any

from tracerl.envs import get_parser
from tracerl.rollout import ScriptedSampler
from tracerl.rollout.runner import Policy
from tracerl.rollout.sampler import SampleRequest

PLANS = ["good", "bad_tool", "bad_args", "garbled"]
# The deliberate mistake each plan makes at turn 1, and the fault kind it must be blamed as.
MISTAKES = {"bad_tool": "unknown_tool", "bad_args": "invalid_arguments", "garbled": "parse_error"}


def plan_texts(task: dict[str, Any], plan: str) -> list[str]:
    p = get_parser("json_list")
    oid = task["order_id"]
    look = p.format_calls([("lookup_order", {"order_id": oid}), ("get_refund_policy", {})])
    mistake = {
        "bad_tool": p.format_calls([("delete_orders", {"all": True})]),
        "bad_args": p.format_calls([("issue_refund", {"order_id": oid, "amount": "lots"})]),
        "garbled": "<tool_call>[{'name': issue_refund",
    }
    texts = [look]
    if plan in mistake:
        texts.append(mistake[plan])
    if task["expected"]["action"] == "refund":
        texts.append(
            p.format_calls([("issue_refund", {"order_id": oid, "amount": task["amount"]})])
        )
        texts.append(f"Done: ${task['amount']:.2f} refunded for order {oid}.")
    else:
        texts.append(f"Sorry, I cannot refund this: {task['expected']['why']}.")
    return texts


def plan_of(episode_id: str) -> str:
    g = int(episode_id.rsplit(":g", 1)[1])
    return PLANS[g % len(PLANS)]


def scripted_policy(renderer: Any, tasks: list[dict[str, Any]]) -> Policy:
    """A policy whose episode `<task id>:s<seed>:g<g>` follows plan PLANS[g % 4]."""
    by_id = {t["id"]: t for t in tasks}

    def turn(request: SampleRequest) -> str:
        task_id = request.episode_id.rsplit(":s", 1)[0]
        texts = plan_texts(by_id[task_id], plan_of(request.episode_id))
        return texts[min(request.turn, len(texts) - 1)]

    sampler = ScriptedSampler.from_texts(renderer, turn, logprob=-0.5)
    return Policy(sampler, renderer, get_parser("json_list"), "tiny-random")
