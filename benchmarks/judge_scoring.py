"""What a model judge costs a rollout step, and what the cache and the scoring pool buy.

Run: .venv/bin/python benchmarks/judge_scoring.py [--groups 16] [--group-size 4] [--latency 0.2]

A step of search episodes (a scripted policy on the tiny model: the rollout itself is cheap,
so the judge's share shows) is scored by a pointwise judge over HTTP: the scripted judge
server of the tests, answering each request after `--latency` seconds, as a remote model
would. Sides, measured in the same run:

  no judge          exact match only (the baseline);
  judge, inline     the judge asked on the rollout's event loop (what a reward that does
                    not declare it waits on a model gets): requests one at a time;
  judge, pool       the judge asked from tracerl's scoring pool (what a judge gets): as many
                    requests in flight as episodes finishing;
  judge, cached     the same step again: every verdict from the disk cache, no request;
  group-relative    one request per group instead of one per episode.

Prints wall time per step, requests sent, and ratios to the baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.judge_server import ScriptedJudgeServer

from tracerl.envs import get_parser, make
from tracerl.envs.search import tasks as task_sets
from tracerl.models import load
from tracerl.rewards.resolve import resolve_reward
from tracerl.rewards.run_reward import RunReward
from tracerl.rollout import ScriptedSampler
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.groups import run_groups
from tracerl.rollout.runner import Policy

RUBRIC = {"name": "correct", "instructions": "Score how well ANSWER answers TASK (10: fully)."}


class SlowJudge(ScriptedJudgeServer):
    def __init__(self, golds: dict[str, str], latency: float) -> None:
        super().__init__(golds)
        self.latency = latency

    def reply(self, messages, fault):  # type: ignore[no-untyped-def]
        time.sleep(self.latency)
        return super().reply(messages, fault)


class Inline(RunReward):
    """The same reward, scored on the event loop (as if it did not wait on a model)."""

    @property
    def blocking(self) -> bool:
        return False


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--latency", type=float, default=0.2)
    args = ap.parse_args()

    tiny = load("tiny-random")
    env = make("search", corpus="synthetic")
    tasks = task_sets.split("synthetic", "train")[: args.groups]
    golds = {t["question"]: t["answers"][0] for t in tasks}
    parser = get_parser("json_list")
    by_id = {t["id"]: t for t in tasks}

    def turn(request):  # type: ignore[no-untyped-def]
        task = by_id[request.episode_id.rsplit(":s", 1)[0]]
        g = int(request.episode_id.rsplit(":g", 1)[1])
        text = task["answers"][0] if g % 2 == 0 else f"maybe {g}"
        return parser.format_calls([("answer", {"text": text, "citations": []})])

    policy = Policy(ScriptedSampler.from_texts(tiny.renderer, turn), tiny.renderer, parser, "t")
    cfg = RolloutConfig(budgets=Budgets(steps=2), reserve=None)
    server = SlowJudge(golds, args.latency)
    cache = Path(tempfile.mkdtemp(prefix="judge-bench-"))

    def reward(judge: dict | None, cls: type = RunReward) -> RunReward:
        components = [{"name": "em", "fn": "exact_match", "layer": "outcome"}]
        if judge is not None:
            params = {"rubric": RUBRIC, "base_url": server.base_url, "model": "m", **judge}
            components = [{"name": "judged", "fn": "judge", "layer": "outcome", "params": params}]
        r = resolve_reward(None, components, env, env_name="search")
        return cls(r.spec, r.functions, r.source, r.lookup)

    def step(score: RunReward, seed: int = 0) -> tuple[float, int]:
        before = len(server.requests)
        t0 = time.perf_counter()
        asyncio.run(
            run_groups(
                lambda: make("search", corpus="synthetic"),
                tasks,
                policy,
                cfg,
                group_size=args.group_size,
                seed=seed,
                max_concurrent_episodes=64,
                score=score,
            )
        )
        return time.perf_counter() - t0, len(server.requests) - before

    step(reward(None))  # warm up
    rows = [("no judge", *step(reward(None)))]
    rows.append(("judge, inline", *step(reward({"cache": str(cache / "a")}, Inline), seed=1)))
    pooled = reward({"cache": str(cache / "b")})
    rows.append(("judge, pool", *step(pooled, seed=1)))
    rows.append(("judge, cached", *step(reward({"cache": str(cache / "b")}), seed=1)))
    rows.append(("group-relative", *step(reward({"cache": str(cache / "c"), "mode": "group"}), 1)))
    server.close()

    n = args.groups * args.group_size
    base = rows[0][1]
    print(
        f"{n} episodes ({args.groups} groups of {args.group_size}), judge latency {args.latency} s"
    )
    print(f"{'side':16s} {'wall s':>8s} {'requests':>9s} {'x baseline':>11s}")
    for name, wall, requests in rows:
        print(f"{name:16s} {wall:8.2f} {requests:9d} {wall / base:11.1f}")


if __name__ == "__main__":
    main()
