"""Asynchronous against synchronous GRPO when the environment's latency is heavy-tailed.

Run: .venv/bin/python benchmarks/async_vs_sync.py [--steps 40] [--median-ms 100] [--tail 10]
     [--width 1024 --layers 8]   (the default: a learner with real work, about 2 s an update)
     [--width 64 --layers 2]     (tiny-chars itself: the learner is nearly free)
     [--window 3]                (async: 3 steps' worth of groups outstanding, at s=1 too)

The task is `configs/learn-arithmetic.yaml`'s (a fresh random model over a character
vocabulary learns single-digit sums; 4 tasks x 32 samples per step), with the start of
every episode (a sandbox being provisioned) delayed by a log-normal draw (`SlowTools`:
median --median-ms, 95th percentile --tail times the median). The model is tiny-chars
widened to --width and deepened to --layers. The same model initialisation, tasks and number
of trained episodes (--steps x 128) for each side, measured in one process:

  sync          sample a batch, wait for its slowest episode, update
  async s=1,2   rollout workers keep sampling while the learner trains, at
                `max_staleness` 1 and 2 (staleness-scaled learning rate, inverse, alpha 0.5)

Prints, per side: trained episodes per second, the learner's idle fraction (wall time not
spent inside `Learner.update`), the training reward over the first 5 steps and the last 10
(with the standard error of that mean: the noise), the mean staleness trained on, the
episodes dropped as too stale, and the throughput ratio to sync. Targets (issue 7): async
>= 2.5x sync, learner idle < 10%, final reward within noise of sync.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import time

import torch
from transformers import LlamaForCausalLM

from tracerl.config import StalenessLR
from tracerl.envs import SlowTools, get_parser, make
from tracerl.envs.arithmetic import digit_reward
from tracerl.models import load
from tracerl.rollout import BatchedHFSampler
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.runner import Policy
from tracerl.train.async_loop import AsyncSettings, train_async
from tracerl.train.grpo import GRPOConfig, grpo_step
from tracerl.train.learner import Learner, LearnerConfig

TASKS, GROUP = 4, 32


def reward(e) -> float:
    segs = e.trajectories[0].policy_segments()
    return digit_reward((segs[0].text or "") if segs else "", e.receipt.task["answers"][0])


def side(mode: str, staleness: int, args: argparse.Namespace) -> dict[str, float]:
    torch.manual_seed(0)
    bundle = load("tiny-chars")
    cfg = bundle.model.config
    if (args.width, args.layers) != (cfg.hidden_size, cfg.num_hidden_layers):
        cfg.hidden_size, cfg.intermediate_size = args.width, 2 * args.width
        cfg.num_hidden_layers = args.layers
        bundle = dataclasses.replace(bundle, model=LlamaForCausalLM(cfg).to(torch.float32).eval())
    sampler = BatchedHFSampler(bundle.model, temperature=1.0, seed=0, max_batch_size=128)
    policy = Policy(sampler, bundle.renderer, get_parser("json_list"), bundle.spec)
    learner = Learner(bundle.model, LearnerConfig(lr=3e-3, epochs=args.epochs))
    busy = [0.0]
    update = learner.update

    def timed(*a, **k):
        t0 = time.perf_counter()
        try:
            return update(*a, **k)
        finally:
            busy[0] += time.perf_counter() - t0

    learner.update = timed
    rollout = RolloutConfig(budgets=Budgets(steps=1), max_turn_tokens=2, reserve=None)
    grpo = GRPOConfig(group_size=GROUP, rollout=rollout, max_concurrent_episodes=512)
    probe = make("arithmetic")

    def env():
        return SlowTools(
            make("arithmetic"), median_ms=args.median_ms, tail=args.tail, seed=0, reset_too=True
        )

    def tasks(step: int):
        return probe.sample_tasks(TASKS, seed=step)

    rewards: list[float] = []
    stats = {"dropped": 0.0, "staleness": 0.0}
    t0 = time.perf_counter()
    if mode == "sync":
        for step in range(args.steps):
            m, _ = grpo_step(env, tasks(step), policy, learner, reward, grpo, step=step)
            rewards.append(m["train/reward_mean"])
    else:

        async def after(step, m, episodes):
            rewards.append(m["train/reward_mean"])
            stats["dropped"] = m["async/dropped_stale_total"]
            stats["staleness"] += m["async/staleness_mean"] / args.steps
            return True

        window = args.window * TASKS if args.window else None
        settings = AsyncSettings(
            args.steps, 0, staleness, StalenessLR(kind="inverse"), max_outstanding_groups=window
        )
        asyncio.run(
            train_async(
                env,
                tasks,
                policy,
                learner,
                reward,
                grpo,
                settings,
                writer=lambda b: None,
                done=lambda b: {},
                after_step=after,
            )
        )
    wall = time.perf_counter() - t0
    last = rewards[-10:]
    spread = statistics.stdev(last) / len(last) ** 0.5 if len(last) > 1 else float("nan")
    return {
        **stats,
        "reward_se": spread,
        "episodes_per_s": args.steps * TASKS * GROUP / wall,
        "idle": 1 - busy[0] / wall,
        "final_reward": statistics.fmean(last),
        "first_reward": sum(rewards[:5]) / len(rewards[:5]),
        "wall_s": wall,
        "update_s": busy[0] / args.steps,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--median-ms", type=float, default=100.0)
    ap.add_argument("--tail", type=float, default=10.0)
    ap.add_argument("--width", type=int, default=1024, help="hidden size (tiny-chars: 64)")
    ap.add_argument("--layers", type=int, default=8, help="decoder layers (tiny-chars: 2)")
    ap.add_argument(
        "--window",
        type=int,
        default=0,
        help="async: outstanding groups, in steps' worth (default max_staleness + 1)",
    )
    ap.add_argument("--epochs", type=int, default=1, help="PPO epochs per update")
    args = ap.parse_args()
    print(
        f"task: learn-arithmetic (char model, width {args.width}, {args.layers} layers), "
        f"{TASKS} tasks x {GROUP} samples x {args.steps} "
        f"steps; env latency log-normal, median {args.median_ms:.0f} ms, p95 {args.tail:.0f}x"
    )
    results = {"sync": side("sync", 0, args)}
    for s in (1, 2):
        results[f"async s={s}"] = side("async", s, args)
    base = results["sync"]["episodes_per_s"]
    print(
        f"{'side':<12}{'episodes/s':>12}{'ratio':>8}{'idle':>8}{'reward first -> last10':>30}"
        f"{'staleness':>11}{'dropped':>9}{'wall s':>9}{'update s':>10}"
    )
    for name, r in results.items():
        print(
            f"{name:<12}{r['episodes_per_s']:>12.1f}{r['episodes_per_s'] / base:>7.2f}x"
            f"{100 * r['idle']:>7.1f}%{r['first_reward']:>13.3f} -> {r['final_reward']:.3f}"
            f" +- {r['reward_se']:.3f}{r['staleness']:>11.2f}{r['dropped']:>9.0f}"
            f"{r['wall_s']:>9.1f}{r['update_s']:>10.3f}"
        )


if __name__ == "__main__":
    main()
