"""Continuous against static batching: multi-turn episodes whose tools answer after uneven
delays, on one `BatchedHFSampler`, in one process, the same seeded episodes both ways.

    .venv/bin/python benchmarks/continuous_batching.py [--model smollm2-135m-instruct]
        [--episodes 8] [--turns 4] [--turn-tokens 24] [--tool-s 0.05 0.6]

Every episode makes ``turns - 1`` tool calls, then answers (a model that writes no calls
of its own is read as calling, turn by turn: the tokens, the tools' delays and the runner's
concurrency are real). Each call sleeps a delay drawn once per (episode, turn) from
``--tool-s``. Static batching (``BatchedHFSampler.continuous = False``): a turn that arrives
while a batch decodes waits for the whole batch to finish. Continuous: it joins the running
batch at the next step, and a finished row's episode goes on at once.

Prints the wall time of all episodes, the sampler's batches and forwards, how many turns
joined a running batch, and the mean time a turn waited from its request to its answer;
the headline is static / continuous wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from typing import Any

from gpu_step import scripted_episodes  # every turn but the last read as a lookup call
from tracerl.envs import ToolEnv, tool
from tracerl.models import load
from tracerl.rollout import BatchedHFSampler

DELAYS: dict[tuple[str, int], float] = {}


class UnevenLookup(ToolEnv):
    name = "uneven_lookup"
    version = "1.0"

    @tool(effect="read", timeout_s=30.0, version="1")
    async def lookup(self, key: str) -> str:
        """Look up the value stored under a key.

        Args:
            key: the key.
        """
        self.calls = getattr(self, "calls", 0) + 1
        await asyncio.sleep(DELAYS[(self.task["id"], self.calls)])
        return f"{key}: 42"

    async def setup(self, task: dict[str, Any], seed: int) -> list[dict[str, str]]:
        self.task = task
        return [{"role": "user", "content": f"Look up {task['key']} and tell me its value."}]

    def sample_tasks(self, n: int, *, seed: int = 0, split: str = "train") -> list[dict]:
        return [{"id": f"lookup-{i}", "key": f"k{i}", "answers": ["42"]} for i in range(n)]


class Timed:
    """The sampler, with each request's wait (request to answer) recorded."""

    def __init__(self, sampler: BatchedHFSampler) -> None:
        self.sampler, self.waits = sampler, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sampler, name)

    async def sample(self, request: Any) -> Any:
        t0 = time.perf_counter()
        out = await self.sampler.sample(request)
        self.waits.append(time.perf_counter() - t0)
        return out


def play(bundle: Any, a: argparse.Namespace, continuous: bool) -> dict[str, float]:
    sampler = BatchedHFSampler(bundle.model, seed=0, max_batch_size=a.episodes)
    sampler.continuous = continuous
    timed = Timed(sampler)
    tasks = UnevenLookup().sample_tasks(a.episodes)
    t0 = time.perf_counter()
    episodes = scripted_episodes(UnevenLookup, tasks, timed, bundle, a.turns, a.turn_tokens)
    wall = time.perf_counter() - t0
    tokens = sum(e.receipt.ledger["used"]["sampled_tokens"] for e in episodes)
    s = sampler.stats
    return {
        "wall_s": wall,
        "tokens": tokens,
        "batches": s.batches,
        "forwards": s.forward_calls,
        "admitted": s.admitted,
        "turn_wait_s": sum(timed.waits) / len(timed.waits),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--turn-tokens", type=int, default=24)
    ap.add_argument("--tool-s", type=float, nargs=2, default=(0.05, 0.6))
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()

    rng = random.Random(0)
    for i in range(a.episodes):
        for k in range(1, a.turns):
            DELAYS[(f"lookup-{i}", k)] = rng.uniform(*a.tool_s)
    bundle = load(a.model)
    print(
        f"{a.episodes} episodes x {a.turns} turns of <= {a.turn_tokens} tokens on {a.model}, "
        f"tool delays {a.tool_s[0]:g}-{a.tool_s[1]:g} s"
    )
    play(bundle, argparse.Namespace(**{**vars(a), "episodes": 2, "turns": 2}), True)  # warm-up
    best: dict[bool, dict[str, float]] = {}
    for _ in range(a.repeats):  # alternated, the best of each counts (a shared machine)
        for continuous in (False, True):
            r = play(bundle, a, continuous)
            if continuous not in best or r["wall_s"] < best[continuous]["wall_s"]:
                best[continuous] = r
    for continuous, r in sorted(best.items()):
        print(
            f"{'continuous' if continuous else 'static':>10}: {r['wall_s']:6.2f} s, "
            f"{r['tokens']:.0f} tokens, {r['batches']:.0f} batches, {r['forwards']:.0f} "
            f"forwards, {r['admitted']:.0f} turns joined a running batch, a turn waited "
            f"{r['turn_wait_s']:.2f} s on average"
        )
    print(f"static / continuous wall time: {best[False]['wall_s'] / best[True]['wall_s']:.2f}x")


if __name__ == "__main__":
    main()
