"""Sub-agents' receipts through the gateway: a planner whose two workers run at once, one on
the OpenAI Responses API and one on chat completions, each with tools of its own (not the
environment's) and each rewriting its history once. Each worker's samples carry the
worker's own receipt (its tools, its breaks, the root's ``unmanaged`` guard), and exact
replay reproduces the whole episode, both workers included.

The harness is `planner_with_two_protocols` below (the openai SDK only, no tracerl import)."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.unit.test_gateway import lps, via_gateway
from tracerl.envs.parsers import get_parser
from tracerl.gateway.replay import replay_exact
from tracerl.models import load
from tracerl.rollout.runner import Policy
from tracerl.rollout.sampler import ScriptedSampler
from tracerl.types import Attribution, Receipt, Source, StopReason, Trajectory

ENTRY = "tests.unit.test_gateway_tree_receipts:planner_with_two_protocols"

MULTIPLY = {
    "type": "function",
    "name": "multiply",
    "description": "Multiply two integers.",
    "parameters": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
}
LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a word up.",
        "parameters": {
            "type": "object",
            "properties": {"word": {"type": "string"}},
            "required": ["word"],
            "additionalProperties": False,
        },
    },
}

# each conversation's model turns, by session (the episode's id ends in ``/NAME`` in a child's)
SCRIPTS = {
    "": {0: "Plan: ask both.", 1: "The answer is 6."},
    "researcher": {
        0: '<tool_call>[{"name": "multiply", "arguments": {"a": 2, "b": 3}}]</tool_call>',
        1: "The product is 6.",
    },
    "coder": {
        0: '<tool_call>[{"name": "lookup", "arguments": {"word": "six"}}]</tool_call>',
        1: "Six is 6.",
    },
}


async def planner_with_two_protocols(task, base_url, api_key):
    """A planner (chat completions, no tools) sends two workers off at once: `researcher` on
    the Responses API with a `multiply` tool, `coder` on chat completions with a `lookup`
    tool. After its answer each worker rewrites its history and asks again: the researcher
    edits a tool output it already sent, the coder drops its system prompt."""
    from openai import AsyncOpenAI

    def client(name=None):
        key = api_key if name is None else f"{api_key}/{name}"
        return AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0)

    async def researcher():
        c = client("researcher")
        items = [{"role": "user", "content": f"What is {task['a']} * {task['b']}?"}]

        async def ask():
            r = await c.responses.create(
                model="p", instructions="Multiply.", tools=[MULTIPLY], input=items, store=False
            )
            items.extend(item.model_dump(exclude_none=True) for item in r.output)
            return r

        r = await ask()
        for call in (i for i in r.output if i.type == "function_call"):
            args = json.loads(call.arguments)
            out = str(args["a"] * args["b"])
            items.append({"type": "function_call_output", "call_id": call.call_id, "output": out})
        await ask()
        # the rewrite: the tool output it already sent, summarized
        k = next(i for i, item in enumerate(items) if item.get("type") == "function_call_output")
        items[k] = {**items[k], "output": "the product is " + items[k]["output"]}
        items.append({"role": "user", "content": "Are you sure?"})
        return (await ask()).output_text

    async def coder():
        c = client("coder")
        messages = [
            {"role": "system", "content": "Look words up."},
            {"role": "user", "content": "What number is 'six'?"},
        ]

        async def ask():
            r = await c.chat.completions.create(model="p", messages=messages, tools=[LOOKUP])
            messages.append(r.choices[0].message.model_dump(exclude_none=True))
            return r.choices[0].message

        message = await ask()
        for call in message.tool_calls or ():
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "6"})
        await ask()
        # the rewrite: memory trimming drops the system prompt
        del messages[0]
        messages.append({"role": "user", "content": "Again, please."})
        return (await ask()).content

    planner = client()
    plan = [{"role": "user", "content": f"Plan: what is {task['a']} * {task['b']}?"}]
    first = (await planner.chat.completions.create(model="p", messages=plan)).choices[0].message
    reports = await asyncio.gather(researcher(), coder())
    plan += [
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": "Reports: " + "; ".join(r or "" for r in reports)},
    ]
    r = await planner.chat.completions.create(model="p", messages=plan)
    return r.choices[0].message.content


@pytest.fixture(scope="module")
def bundle():
    return load("tiny-random")


@pytest.fixture(scope="module")
def episode(bundle):
    """One recorded episode of the harness, each conversation's turns scripted."""

    def turn(req):
        eid = req.episode_id or ""
        script = SCRIPTS[eid.rpartition("/")[2] if "/" in eid else ""]
        return script[min(req.turn, max(script))]

    sampler = ScriptedSampler.from_texts(bundle.renderer, turn, logprobs=lps)
    return via_gateway(
        ENTRY, Policy(sampler, bundle.renderer, get_parser("json_list"), bundle.spec)
    )


def _by_agent(episode) -> dict[str, list[Trajectory]]:
    out: dict[str, list[Trajectory]] = {}
    for t in episode.trajectories:
        out.setdefault(t.agent, []).append(t)
    return out


def test_each_childs_samples_carry_its_own_tools_breaks_and_the_roots_guard(episode):
    assert episode.stop_reason is StopReason.ANSWERED, episode.receipt.error
    assert episode.attribution is Attribution.POLICY and episode.gradient_eligible
    root = episode.receipt
    assert root.side_effect_guard == "unmanaged"
    by_agent = _by_agent(episode)
    assert sorted(by_agent) == ["", "coder", "researcher"]
    children = {c["agent"]: c for c in root.children}
    want = {
        "researcher": ("multiply", "openai-responses", "(tool) content changed"),
        "coder": ("lookup", "openai-chat", "message 0 was 'system'"),
    }
    for name, (tool, protocol, differs) in want.items():
        samples = by_agent[name]
        assert len(samples) == 2  # one rewrite: a new sample after it
        assert samples[1].segments[0].source is Source.PROMPT
        assert children[name]["history_breaks"] == 1
        for t in samples:
            receipt = Receipt.from_dict(t.receipt)
            assert receipt.episode_id == f"{root.episode_id}/{name}"
            # the tools it was offered in its own requests, not the environment's `add`
            assert list(receipt.tool_versions) == [tool], receipt.tool_versions
            assert receipt.tool_versions[tool].startswith("schema:")
            assert [s["function"]["name"] for s in receipt.tool_schemas] == [tool]
            assert all(s["x-effect"] == "unknown" for s in receipt.tool_schemas)
            # the root's guard: the harness runs these tools, tracerl does not
            assert receipt.side_effect_guard == root.side_effect_guard == "unmanaged"
            assert receipt.ledger["side_effect_guard"] == "unmanaged"
            # its own account: its requests, its protocol, its break
            assert receipt.agent is not None
            assert receipt.agent["session"] == receipt.episode_id
            assert receipt.agent["requests"] == 3
            assert receipt.agent["protocols"] == [protocol]
            [brk] = receipt.agent["history_breaks"]
            assert differs in brk["reason"], brk
            assert receipt.parent["episode_id"] == root.episode_id


def test_the_whole_episode_replays_exactly_children_included(bundle, episode):
    report = asyncio.run(replay_exact(episode.trajectories, renderer=bundle.renderer))
    assert report.ok, report.first_difference
    # as `tracerl replay` reads it back: the trajectories through their stored form
    stored = [
        Trajectory.from_dict(json.loads(json.dumps(t.to_dict()))) for t in episode.trajectories
    ]
    report = asyncio.run(replay_exact(stored, renderer=bundle.renderer))
    assert report.ok, report.first_difference


def test_replay_notices_a_childs_tampered_break(bundle, episode):
    import dataclasses

    trajectories = list(episode.trajectories)
    k = next(i for i, t in enumerate(trajectories) if t.agent == "coder")
    receipt = dict(trajectories[k].receipt)
    receipt["agent"] = {**receipt["agent"], "history_breaks": []}
    for i, t in enumerate(trajectories):
        if t.agent == "coder":
            trajectories[i] = dataclasses.replace(t, receipt=receipt, _cache={})
    report = asyncio.run(replay_exact(trajectories, renderer=bundle.renderer))
    assert not report.ok and "child session coder" in report.first_difference


@pytest.mark.parametrize("sampled_tokens", [40, 80])
def test_a_tree_stopped_by_its_shared_token_budget_replays_exactly(bundle, sampled_tokens):
    """``budgets.sampled_tokens`` bounds the whole tree: a worker refused because the others
    spent the budget replays as refused, though each conversation replays on its own."""
    from tests.unit.test_gateway import CFG
    from tests.unit.test_gateway_tree import planner
    from tracerl.rollout.budget import Budgets

    tight = CFG.model_copy(update={"budgets": Budgets(steps=4, sampled_tokens=sampled_tokens)})
    episode = planner(bundle, cfg=tight)
    assert "max_tokens" in {c["stop_reason"] for c in episode.receipt.children}
    report = asyncio.run(replay_exact(episode.trajectories, renderer=bundle.renderer))
    assert report.ok, report.first_difference
