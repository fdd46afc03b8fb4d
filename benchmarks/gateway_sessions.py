"""Gateway sessions sharing one batched sampler: 16 concurrent agents against 1.

Run: .venv/bin/python benchmarks/gateway_sessions.py [--model smollm2-135m-instruct]
     [--sessions 16] [--turns 2] [--turn-tokens 32] [--repeats 2]
Smoke test (~20 s, random weights): --model tiny-random --turn-tokens 8

An agent written with the openai SDK only (`agent` below: asks a question, then follows up
"Are you sure?" until it has made --turns requests) runs through tracerl's gateway
(`tracerl.gateway.AgentBackend`, every session in its own thread, its requests over HTTP),
on one `BatchedHFSampler`. Every turn samples exactly --turn-tokens tokens (stop tokens are
ignored, so each side does the same work whatever the random draw), temperature 1.0.

Sides, each the best of --repeats after a warm-up, all in this process:

  gateway x1     one session (one episode);
  gateway xS     S sessions at once (one GRPO step's worth of episodes): the step time,
                 its ratio to x1 (1.0 = the S sessions cost what one does; S = no sharing),
                 and the sampler's batches (how many turns shared a forward pass); the
                 sampler waits `GATHER_S` for stragglers, as `AgentBackend` has it do;
  native xS      the same S episodes (--turns 1: question, answer) through tracerl's own
                 episode runner, for the gateway's overhead (HTTP, threads, the SDK) at
                 --turns 1 (the gateway side is rerun with one turn for it);
  per protocol   the same S one-turn episodes by an agent on each protocol the gateway
                 speaks (chat completions, the Responses API, Anthropic's Messages API with
                 the anthropic SDK): each one's overhead per episode over the native runner.

Prints seconds, tokens/s and the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import TYPE_CHECKING, Any

from tracerl.envs.base import Env, StepResult
from tracerl.gateway import AgentBackend, Gateway
from tracerl.gateway.agent import GATHER_S
from tracerl.models import load
from tracerl.rollout import BatchedHFSampler
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.groups import run_groups
from tracerl.rollout.runner import Policy
from tracerl.rollout.sampler import SampleRequest, SampleResult

if TYPE_CHECKING:  # the agent's client annotation: tracerl gives it the anthropic SDK's
    from anthropic import AsyncAnthropic

QUESTION = "Name three rivers in Europe and say which is the longest."
TURNS = 2


async def agent(task: dict[str, Any], client: Any) -> str:
    """openai SDK only: ask, then follow up until TURNS requests were made."""
    messages = [{"role": "user", "content": task["question"]}]
    answer = ""
    for turn in range(task["turns"]):
        if turn:
            messages += [
                {"role": "assistant", "content": answer},
                {"role": "user", "content": "Are you sure?"},
            ]
        r = await client.chat.completions.create(model="policy", messages=messages)
        answer = r.choices[0].message.content or ""
    return answer


async def agent_responses(task: dict[str, Any], client: Any) -> str:
    """The same agent on the Responses API (follow-ups chained by previous_response_id)."""
    r = await client.responses.create(model="policy", input=task["question"])
    for _ in range(task["turns"] - 1):
        r = await client.responses.create(
            model="policy", previous_response_id=r.id, input="Are you sure?"
        )
    return r.output_text


async def agent_messages(task: dict[str, Any], client: AsyncAnthropic) -> str:
    """The same agent with the anthropic SDK (Messages API)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": task["question"]}]
    answer = ""
    for turn in range(task["turns"]):
        if turn:
            messages += [
                {"role": "assistant", "content": answer},
                {"role": "user", "content": "Are you sure?"},
            ]
        r = await client.messages.create(model="policy", max_tokens=1024, messages=messages)
        answer = "".join(b.text for b in r.content if b.type == "text")
    return answer


PROTOCOLS = {"chat": "agent", "responses": "agent_responses", "messages": "agent_messages"}


class QA(Env):
    """The native twin at one turn: the question, then the answer ends it."""

    name, version = "qa-bench", "1"

    async def reset(self, task: dict[str, Any], seed: int) -> list[dict[str, Any]]:
        return [{"role": "user", "content": task["question"]}]

    async def step(self, action: Any) -> StepResult:
        return StepResult([], terminated=True, info={"answer": action.answer})

    def sample_tasks(self, n: int, *, seed: int = 0, split: str = "train") -> list[dict]:
        return [{"id": f"q{i}", "question": QUESTION} for i in range(n)]


class FixedLength:
    """The sampler, with stop tokens ignored: every turn samples exactly its max_tokens."""

    def __init__(self, sampler: BatchedHFSampler) -> None:
        self.sampler = sampler
        self.policy_version = 0

    async def sample(self, request: SampleRequest) -> SampleResult:
        inner = SampleRequest(
            request.prompt_ids,
            request.max_tokens,
            frozenset(),
            request.seed,
            request.episode_id,
            request.turn,
        )
        return await self.sampler.sample(inner)


def rollout(args: argparse.Namespace) -> RolloutConfig:
    return RolloutConfig(
        budgets=Budgets(steps=args.turns + 1, sampled_tokens=None, context_tokens=None),
        reserve=None,
        max_turn_tokens=args.turn_tokens,
    )


async def gateway_side(
    policy: Policy, n: int, turns: int, args: argparse.Namespace, entry: str = "agent"
) -> float:
    tasks = [{"id": f"q{i}", "question": QUESTION, "turns": turns} for i in range(n)]
    with Gateway(policy.model_id) as gateway:
        backend = AgentBackend(f"{__name__}:{entry}", gateway)
        t0 = time.perf_counter()
        groups = await run_groups(
            QA,
            tasks,
            policy,
            rollout(args),
            group_size=1,
            max_concurrent_episodes=n,
            backend=backend,
        )
        wall = time.perf_counter() - t0
    for g in groups:
        assert g[0].receipt.ledger["used"]["steps"] == turns, g[0].receipt.error
    return wall


async def native_side(policy: Policy, n: int, args: argparse.Namespace) -> float:
    tasks = QA().sample_tasks(n)
    t0 = time.perf_counter()
    await run_groups(QA, tasks, policy, rollout(args), group_size=1, max_concurrent_episodes=n)
    return time.perf_counter() - t0


def best(fn: Any, repeats: int) -> float:
    return min(fn() for _ in range(repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--turns", type=int, default=TURNS)
    parser.add_argument("--turn-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    bundle = load(args.model)
    batched = BatchedHFSampler(bundle.model, temperature=1.0, max_batch_size=args.sessions)
    policy = Policy.from_bundle(bundle, FixedLength(batched))
    if "tiny" in args.model:
        from tracerl.envs.parsers import get_parser

        policy.parser = get_parser("json_list")
    s, k, n = args.sessions, args.turns, args.turn_tokens

    def gw(sessions: int, turns: int, entry: str = "agent") -> float:
        batched.gather_s = GATHER_S  # what AgentBackend sets on a BatchedHFSampler
        return asyncio.run(gateway_side(policy, sessions, turns, args, entry))

    def native(sessions: int) -> float:
        batched.gather_s = 0.0
        return asyncio.run(native_side(policy, sessions, args))

    gw(2, 1)  # warm-up: the model's first forward passes, the SDK's imports
    one = best(lambda: gw(1, k), args.repeats)
    before = (batched.stats.batches, batched.stats.requests)
    many = best(lambda: gw(s, k), args.repeats)
    batches = (batched.stats.batches - before[0]) / args.repeats
    turns = (batched.stats.requests - before[1]) / args.repeats
    print(f"model {args.model}, {k} turns x {n} tokens per session, best of {args.repeats}")
    print(f"gateway x1:   {one:7.2f} s  {k * n / one:7.1f} tokens/s")
    print(
        f"gateway x{s}:  {many:7.2f} s  {s * k * n / many:7.1f} tokens/s   "
        f"step time x{many / one:.2f} of one session's for {s}x the episodes; "
        f"{turns / max(batches, 1):.1f} turns per sampler batch (max {batched.stats.max_batch})"
    )
    g1 = best(lambda: gw(s, 1), args.repeats)
    nat = best(lambda: native(s), args.repeats)
    print(
        f"at 1 turn, x{s}: gateway {g1:.2f} s, native runner {nat:.2f} s: "
        f"the gateway's overhead x{g1 / nat:.2f} ({(g1 - nat) / s * 1000:.0f} ms per episode)"
    )
    for name, entry in PROTOCOLS.items():
        gw(2, 1, entry)  # its SDK's imports and first client
        t = best(lambda entry=entry: gw(s, 1, entry), args.repeats)
        print(
            f"  {name:<10} x{s}, 1 turn: {t:.2f} s, overhead over the native runner "
            f"{(t - nat) / s * 1000:.0f} ms per episode"
        )


if __name__ == "__main__":
    main()
