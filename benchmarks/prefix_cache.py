"""Prefix caching across turns: multi-turn episodes whose tools answer with long texts, on one
`BatchedHFSampler`, with the kept keys and values (``model.prefix_cache_gb``) and without.

    .venv/bin/python benchmarks/prefix_cache.py [--model smollm2-135m-instruct]
        [--episodes 8] [--turns 4] [--turn-tokens 24] [--tool-words 120] [--repeats 2]

Every episode makes ``turns - 1`` tool calls, then answers (a model that writes no calls of
its own is read as calling, turn by turn, as in `continuous_batching.py`). Each call answers,
after 0.05-0.2 s, with about `--tool-words` words of text (a retrieved passage's worth), so
each turn's prompt is the whole conversation so far: without the cache every turn prefills
all of it again; with it, only what follows the last turn's sampled tokens.

Prints, for each way: the wall time of all episodes, the prompt tokens the model was fed
(prefills; decode steps feed one token a row and are counted apart), the tokens the cache
spared, and whether every episode sampled the same tokens both ways; the headline is
without / with wall time. The runs alternate and the best of each counts (a shared machine).
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

WORDS = [
    "river",
    "valley",
    "north",
    "stone",
    "bridge",
    "built",
    "century",
    "trade",
    "market",
    "town",
    "council",
    "records",
    "show",
    "merchants",
    "crossed",
    "each",
    "spring",
    "carrying",
    "salt",
    "grain",
    "wool",
    "toward",
    "the",
    "coast",
    "where",
    "ships",
    "waited",
    "harbour",
    "masters",
    "kept",
    "ledgers",
    "of",
    "every",
    "cargo",
    "and",
    "its",
    "owner",
]


class LongLookup(ToolEnv):
    name = "long_lookup"
    version = "1.0"
    words = 120

    @tool(effect="read", timeout_s=30.0, version="1")
    async def lookup(self, key: str) -> str:
        """Look up what is known about a key.

        Args:
            key: the key.
        """
        self.calls = getattr(self, "calls", 0) + 1
        rng = random.Random(f"{self.task['id']}-{self.calls}")
        await asyncio.sleep(rng.uniform(0.05, 0.2))
        return f"{key}: " + " ".join(rng.choice(WORDS) for _ in range(self.words))

    async def setup(self, task: dict[str, Any], seed: int) -> list[dict[str, str]]:
        self.task = task
        return [{"role": "user", "content": f"Find out about {task['key']} and summarize it."}]

    def sample_tasks(self, n: int, *, seed: int = 0, split: str = "train") -> list[dict]:
        return [{"id": f"long-{i}", "key": f"k{i}", "answers": ["42"]} for i in range(n)]


class Fed:
    """Counts the tokens each forward of `sampler` is fed (prefills apart from decode steps)."""

    def __init__(self, sampler: BatchedHFSampler) -> None:
        self.prefill_tokens = self.decode_tokens = 0
        orig = sampler._forward

        def forward(ids_B_T: Any, *a: Any, **k: Any) -> Any:
            n = int(ids_B_T.shape[0] * ids_B_T.shape[1])
            if ids_B_T.shape[1] > 1:
                self.prefill_tokens += n
            else:
                self.decode_tokens += n
            return orig(ids_B_T, *a, **k)

        sampler._forward = forward  # type: ignore[method-assign]


def play(bundle: Any, a: argparse.Namespace, gb: float) -> dict[str, Any]:
    sampler = BatchedHFSampler(bundle.model, seed=0, max_batch_size=a.episodes, prefix_cache_gb=gb)
    fed = Fed(sampler)
    LongLookup.words = a.tool_words
    tasks = LongLookup().sample_tasks(a.episodes)
    t0 = time.perf_counter()
    episodes = scripted_episodes(LongLookup, tasks, sampler, bundle, a.turns, a.turn_tokens)
    wall = time.perf_counter() - t0
    sampled = {
        e.episode_id: [tuple(s.token_ids) for t in e.trajectories for s in t.policy_segments()]
        for e in episodes
    }
    return {
        "wall_s": wall,
        "sampled": sampled,
        "tokens": sum(e.receipt.ledger["used"]["sampled_tokens"] for e in episodes),
        "context": max(len(t.token_ids) for e in episodes for t in e.trajectories),
        "turns": sum(len(v) for v in sampled.values()) / len(sampled),
        "prefill_tokens": fed.prefill_tokens,
        "decode_tokens": fed.decode_tokens,
        "reused": sampler.prefixes.stats.reused_tokens,
        "hits": sampler.prefixes.stats.hits,
        "left_bytes": sampler.prefixes.bytes,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--turn-tokens", type=int, default=24)
    ap.add_argument("--tool-words", type=int, default=120)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()

    bundle = load(a.model)
    print(
        f"{a.episodes} episodes, at most {a.turns} steps (turns - 1 tool calls) of <= "
        f"{a.turn_tokens} tokens a turn on {a.model}, tool answers of {a.tool_words} words"
    )
    play(bundle, argparse.Namespace(**{**vars(a), "episodes": 2, "turns": 2}), 1.0)  # warm-up
    best: dict[float, dict[str, Any]] = {}
    for _ in range(a.repeats):
        for gb in (0.0, 1.0):
            r = play(bundle, a, gb)
            if gb not in best or r["wall_s"] < best[gb]["wall_s"]:
                best[gb] = r
    off, on = best[0.0], best[1.0]
    same = sum(off["sampled"][k] == on["sampled"].get(k) for k in off["sampled"])
    for name, r in (("without", off), ("with", on)):
        print(
            f"{name:>8} the cache: {r['wall_s']:6.2f} s, {r['turns']:.1f} model turns an "
            f"episode, {r['tokens']:.0f} sampled tokens, "
            f"prefills fed {r['prefill_tokens']:,} prompt tokens (decode steps "
            f"{r['decode_tokens']:,}); {r['hits']} turns started from kept keys and values, "
            f"{r['reused']:,} tokens spared; longest context {r['context']} tokens; "
            f"{r['left_bytes']} bytes kept at the end"
        )
    print(f"episodes that sampled the same tokens both ways: {same}/{len(off['sampled'])}")
    print(
        f"prompt tokens prefilled: {on['prefill_tokens'] / max(off['prefill_tokens'], 1):.2f}x; "
        f"without / with wall time: {off['wall_s'] / on['wall_s']:.2f}x"
    )


if __name__ == "__main__":
    main()
