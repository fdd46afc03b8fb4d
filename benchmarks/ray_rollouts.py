"""Rollout throughput with 1 and 2 Ray workers on a tool-latency-bound environment, and the
per-episode cost of the Ray path against the in-process one.

Run: .venv/bin/python benchmarks/ray_rollouts.py [--episodes 48] [--tool-ms 100]
     [--per-worker 4] [--sequential 40]

The policy is scripted (served by `tracerl serve`'s server, `ServerThread`, on loopback) so
that the episode is the environment's time, not the model's: every turn calls
`get_refund_policy` in `refund_desk`, each call held for --tool-ms (`SlowTools`, a constant
delay: a remote service), until the step budget (4) ends the episode. Each worker runs at most
--per-worker episodes at once (its environment slots: sandboxes, browser tabs), which is what
makes a tool-bound rollout scale with workers. Measured in one process, one Ray cluster:

  throughput   --episodes episodes on 1 worker, then on 2 (ratio: 2 / 1; ideal 2.0), and in
               process with the same --per-worker concurrency for reference
  overhead     --sequential episodes one at a time with no tool delay: in process with the
               local sampler; in process through the HTTP server (the remote sampler's cost);
               through one Ray worker (HTTP + Ray dispatch, pickled episodes back). Reported as
               milliseconds per episode and the Ray path's extra milliseconds per episode.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import ray

from tracerl.config import RolloutBackendConfig
from tracerl.envs import SlowTools, get_parser, make
from tracerl.models.loading import smollm2_tokenizer
from tracerl.models.render import ChatRenderer
from tracerl.rollout import ScriptedSampler
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.groups import run_groups
from tracerl.rollout.ray_workers import RayRollouts
from tracerl.rollout.remote import RemoteSampler
from tracerl.rollout.runner import Policy
from tracerl.rollout.serve import ServerThread

ROLLOUT = RolloutConfig(budgets=Budgets(steps=4), max_turn_tokens=64, reserve=None)


def slow_env(tool_ms: float):
    return lambda: SlowTools(make("refund_desk"), median_ms=tool_ms, tail=1, seed=0)


def plain_env():
    return make("refund_desk")


async def timed(env, tasks, policy, *, concurrency: int, backend=None) -> float:
    t0 = time.perf_counter()
    groups = await run_groups(
        env,
        tasks,
        policy,
        ROLLOUT,
        group_size=1,
        max_concurrent_episodes=concurrency,
        backend=backend,
    )
    elapsed = time.perf_counter() - t0
    stops = {e.stop_reason.value for g in groups for e in g}
    assert stops == {"max_steps"}, f"the scripted episodes should run out of steps, got {stops}"
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=48)
    ap.add_argument("--tool-ms", type=float, default=100.0)
    ap.add_argument("--per-worker", type=int, default=4)
    ap.add_argument("--sequential", type=int, default=40)
    args = ap.parse_args()

    renderer = ChatRenderer(smollm2_tokenizer())
    parser = get_parser("json_list")
    call = parser.format_calls([("get_refund_policy", {})])
    sampler = ScriptedSampler.from_texts(renderer, lambda request: call)
    sampler.temperature = 1.0  # what the server checks requests against
    policy = Policy(sampler, renderer, parser, "tiny-random")
    server = ServerThread(sampler, "scripted", renderer.tokenizer)
    url = server.start()
    tasks = make("refund_desk").sample_tasks(args.episodes, seed=0)
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=128 << 20)
    results: dict[str, float] = {}
    try:
        for n in (1, 2):
            settings = RolloutBackendConfig(
                workers=n, episodes_per_worker=args.per_worker, worker_cpus=0.5
            )
            pool = RayRollouts(policy, url, served_model="scripted", settings=settings)
            try:  # a warm-up episode per worker, then the measured batch
                asyncio.run(
                    timed(slow_env(1), tasks[: 2 * n], policy, concurrency=2 * n, backend=pool)
                )
                results[f"ray{n}"] = asyncio.run(
                    timed(
                        slow_env(args.tool_ms), tasks, policy, concurrency=len(tasks), backend=pool
                    )
                )
            finally:
                pool.close()
        results["inproc"] = asyncio.run(
            timed(slow_env(args.tool_ms), tasks, policy, concurrency=args.per_worker)
        )

        seq = tasks[: args.sequential]
        remote = RemoteSampler(url, "scripted", temperature=1.0)
        http_policy = Policy(remote, renderer, parser, "tiny-random")
        one = RolloutBackendConfig(
            workers=1, episodes_per_worker=1, worker_cpus=0.5
        )  # one at a time
        pool = RayRollouts(policy, url, served_model="scripted", settings=one)
        try:
            asyncio.run(timed(plain_env, seq[:2], policy, concurrency=1, backend=pool))  # warm
            per = {
                "in process, local sampler": asyncio.run(
                    timed(plain_env, seq, policy, concurrency=1)
                ),
                "in process, HTTP sampler": asyncio.run(
                    timed(plain_env, seq, http_policy, concurrency=1)
                ),
                "1 Ray worker (HTTP + Ray)": asyncio.run(
                    timed(plain_env, seq, policy, concurrency=1, backend=pool)
                ),
            }
        finally:
            pool.close()
    finally:
        ray.shutdown()
        server.stop()

    n = args.episodes
    print(
        f"throughput: {n} episodes, 4 tool calls of {args.tool_ms:.0f} ms each, "
        f"{args.per_worker} episodes at once per worker"
    )
    for key, label in (
        ("inproc", "in process"),
        ("ray1", "1 Ray worker"),
        ("ray2", "2 Ray workers"),
    ):
        print(f"  {label:<14} {n / results[key]:7.2f} episodes/s  ({results[key]:.2f} s)")
    print(f"  ratio 2 workers / 1 worker: {results['ray1'] / results['ray2']:.2f}x (ideal 2.00x)")
    print(f"overhead: {args.sequential} episodes one at a time, 4 turns each, no tool delay")
    base = per["in process, local sampler"] / args.sequential * 1000
    for label, seconds in per.items():
        ms = seconds / args.sequential * 1000
        print(f"  {label:<27} {ms:7.1f} ms/episode  (+{ms - base:.1f} ms)")
    ray_ms = per["1 Ray worker (HTTP + Ray)"] / args.sequential * 1000
    http_ms = per["in process, HTTP sampler"] / args.sequential * 1000
    print(f"  Ray dispatch alone (Ray path - HTTP path): {ray_ms - http_ms:.1f} ms/episode")


if __name__ == "__main__":
    main()
