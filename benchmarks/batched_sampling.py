"""Concurrent episodes on one CPU: BatchedHFSampler vs one episode alone vs the plain sampler.

Run: .venv/bin/python benchmarks/batched_sampling.py [--model tiny-random] [--episodes 8]
     [--kv-cache dynamic|static] [--compile]

Real episodes through the episode runner: E refund_desk tasks, each rendered with the chat
template, sampled by the model, parsed, stepped in the env, for up to --steps model turns of
at most --turn-tokens tokens. Every episode's turns are seeded, so each draws from the same
uniforms whichever way it runs; its tokens are the same alone and batched with static slots,
while with the dynamic cache left-padding to another width can move a logit's last bits and
flip a near-tie (the "same tokens" line says which; docs/gpu.md). Measured in one process
after a warm-up:

  single    each of the E episodes alone, one after another (per-episode mean reported)
  batched   all E at once on BatchedHFSampler (one batched forward per decode step)
  plain     all E at once on the plain HFSampler (it serves them one after another)

With --fault-rate R, every env is wrapped in a FaultInjector (sleeping for real on its
heavy-tailed latency), so the figures include retries and slow tools overlapping with sampling.

The headline is batched_E / single_1: the time of E concurrent episodes over the time of one.
Well under E means many episodes waiting on the model cost one batched forward, not many.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from tracerl.envs import FaultInjector, make
from tracerl.models import load
from tracerl.rollout import BatchedHFSampler, HFSampler
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.runner import Episode, Policy, run_episode

FAULT_RATE = 0.0


def env():
    if not FAULT_RATE:
        return make("refund_desk")
    return FaultInjector(make("refund_desk"), rate=FAULT_RATE, seed=0, sleep=True)


def run(
    policy: Policy, tasks: list[dict], cfg: RolloutConfig, first_seed: int = 0
) -> tuple[float, list[Episode]]:
    async def all_episodes() -> list[Episode]:
        return await asyncio.gather(
            *(run_episode(env(), t, policy, cfg, seed=first_seed + i) for i, t in enumerate(tasks))
        )

    t0 = time.perf_counter()
    episodes = asyncio.run(all_episodes())
    return time.perf_counter() - t0, episodes


def sampled(episodes: list[Episode]) -> int:
    return sum(e.receipt.ledger["used"]["sampled_tokens"] for e in episodes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--turn-tokens", type=int, default=48)
    ap.add_argument("--fault-rate", type=float, default=0.0)
    ap.add_argument(
        "--kv-cache",
        choices=("dynamic", "static"),
        default="dynamic",
        help="the batched sampler's key/value memory (model.kv_cache)",
    )
    ap.add_argument("--compile", action="store_true", help="compile its decode step")
    args = ap.parse_args()
    global FAULT_RATE
    FAULT_RATE = args.fault_rate

    bundle = load(args.model)
    cfg = RolloutConfig(budgets=Budgets(steps=args.steps), max_turn_tokens=args.turn_tokens)
    tasks = make("refund_desk").sample_tasks(args.episodes, seed=0)
    batched = BatchedHFSampler(
        bundle.model,
        temperature=0.8,
        max_batch_size=args.episodes,
        kv_cache=args.kv_cache,
        compile=args.compile,
    )
    plain = HFSampler(bundle.model, temperature=0.8)
    on_batched = Policy.from_bundle(bundle, batched)
    on_plain = Policy.from_bundle(bundle, plain)
    # warm-up (static slots: a whole episode, so the slots, and a compiled step, are sized)
    short = cfg.model_copy(update={"max_turn_tokens": 4})
    run(on_batched, tasks[:2], cfg if args.kv_cache == "static" else short)
    run(on_plain, tasks[:1], short)

    singles = [run(on_batched, [t], cfg, first_seed=i) for i, t in enumerate(tasks)]
    single_wall = sum(w for w, _ in singles) / len(singles)
    single_eps = [e for _, eps in singles for e in eps]
    batch_wall, batch_eps = run(on_batched, tasks, cfg)
    plain_wall, plain_eps = run(on_plain, tasks, cfg)

    e = args.episodes
    print(
        f"{bundle.model_id}: {e} refund_desk episodes, <= {args.steps} turns x "
        f"{args.turn_tokens} tokens, fault rate {FAULT_RATE:g} (CPU, fp32; kv_cache "
        f"{args.kv_cache}{', compiled' if args.compile else ''})"
    )
    rows = [
        ("single_1 (mean)", single_wall, sampled(single_eps) / e),
        (f"batched_{e}", batch_wall, sampled(batch_eps)),
        (f"plain_{e}", plain_wall, sampled(plain_eps)),
    ]
    for name, wall, tokens in rows:
        print(f"  {name:>16}: {wall:6.2f} s  {tokens:7.1f} tokens  {tokens / wall:6.1f} tokens/s")
    same = [a.trajectories[0].token_ids for a in single_eps] == [
        b.trajectories[0].token_ids for b in batch_eps
    ]
    print(f"  same tokens alone and batched: {same}")
    print(
        f"  batched_{e} / single_1: {batch_wall / single_wall:.2f}x  "
        f"(time of {e} concurrent episodes over one; {e}x would mean no batching)"
    )
    print(f"  plain_{e} / batched_{e}: {plain_wall / batch_wall:.2f}x  (speed-up over plain)")
    print(f"  batched stats: {batched.stats}")


if __name__ == "__main__":
    main()
