"""Concurrent episodes on one CPU: BatchedHFSampler vs one episode alone vs the plain sampler.

Run: .venv/bin/python benchmarks/batched_sampling.py [--model tiny-random] [--episodes 8]
Each episode renders a user prompt, samples a turn, appends the sampled tokens and a short
fixed "observation" (token ids concatenated; this measures the sampler, not the renderer) and
samples the next turn. No stop tokens, so every turn samples exactly --new-tokens tokens.
Measured after a warm-up, in one process: (a) one episode alone on the batched sampler,
(b) E episodes at once on BatchedHFSampler, (c) E episodes at once on the plain HFSampler
(which serves them one after another). Prints wall times, tokens/s, and the ratios
batched_E / single_1 (the headline: well under E means batching pays) and plain_E / batched_E.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from tracerl.models import load
from tracerl.rollout import BatchedHFSampler, HFSampler, Sampler, SampleRequest

TOPICS = ["cats", "rivers", "chess", "volcanoes", "bread", "comets", "bees", "glass"]


async def episode(sampler: Sampler, prompt: list[int], obs: list[int], turns: int, n: int) -> int:
    ids = list(prompt)
    sampled = 0
    for turn in range(turns):
        req = SampleRequest(ids, max_tokens=n, seed=len(ids) + turn, turn=turn)
        res = await sampler.sample(req)
        sampled += len(res.token_ids)
        ids += res.token_ids + obs
    return sampled


def timed(sampler: Sampler, prompts: list[list[int]], obs: list[int], turns: int, n: int):
    async def all_episodes() -> list[int]:
        return await asyncio.gather(*(episode(sampler, p, obs, turns, n) for p in prompts))

    t0 = time.perf_counter()
    tokens = sum(asyncio.run(all_episodes()))
    return time.perf_counter() - t0, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=32)
    args = ap.parse_args()

    bundle = load(args.model)
    render = bundle.renderer.start
    prompts = [
        render([{"role": "user", "content": f"Tell me something about {TOPICS[i % 8]}."}]).token_ids
        for i in range(args.episodes)
    ]
    obs = bundle.tokenizer.encode("\nObservation: ok.\n", add_special_tokens=False)
    batched = BatchedHFSampler(bundle.model, max_batch_size=max(16, args.episodes))
    plain = HFSampler(bundle.model)
    e, t, n = args.episodes, args.turns, args.new_tokens
    timed(batched, prompts[:2], obs, 1, 4)  # warm-up: kernels, allocator, thread pool
    timed(plain, prompts[:1], obs, 1, 4)

    rows = {
        "single_1": timed(batched, prompts[:1], obs, t, n),
        f"batched_{e}": timed(batched, prompts, obs, t, n),
        f"plain_{e}": timed(plain, prompts, obs, t, n),
    }
    print(f"{args.model}: {e} episodes x {t} turns x {n} new tokens (CPU, fp32)")
    for name, (wall, tokens) in rows.items():
        print(f"  {name:>10}: {wall:6.2f} s  {tokens:5d} tokens  {tokens / wall:7.1f} tokens/s")
    single, batch, seq = rows["single_1"][0], rows[f"batched_{e}"][0], rows[f"plain_{e}"][0]
    print(f"  batched_{e} / single_1: {batch / single:.2f}x  (serving {e} episodes at once)")
    print(f"  plain_{e} / batched_{e}: {seq / batch:.2f}x  (speed-up over the plain sampler)")
    print(f"  batched stats: {batched.stats}")


if __name__ == "__main__":
    main()
