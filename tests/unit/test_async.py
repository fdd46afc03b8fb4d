"""Asynchronous training: the staleness bound holds, every turn carries the version that
sampled it, stale samples are dropped and counted, the learning rate slows with staleness,
and timeouts are kept apart from failures."""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import time

import pytest
import torch

from tests.scripts import scripted_policy
from tracerl.algos.staleness import staleness_factor, staleness_scales
from tracerl.config import StalenessLR
from tracerl.envs import SlowTools, get_parser, make
from tracerl.report.run import read_ledger
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.groups import episode_member, rollout_metrics, run_groups
from tracerl.rollout.persist import read_run_trajectories
from tracerl.train.async_loop import (
    AsyncSettings,
    consumed_before,
    episode_versions,
    ledger_writer,
    train_async,
)
from tracerl.train.grpo import GRPOConfig, training_rewards
from tracerl.train.learner import Learner, LearnerConfig
from tracerl.train.metrics import scored_metrics

ROLLOUT = RolloutConfig(budgets=Budgets(steps=6), reserve=None)


def _reward(e):
    return float(episode_member(e.episode_id) % 2 == 0)  # a group always has a spread


class WaitsForAnUpdate(SlowTools):
    """Episodes of one task hold their first tool call until the learner has updated: their
    later turns are then sampled by a newer policy, for certain. The first update never
    needs them (the window's other groups fill a step), so the wait ends with it; the bound
    only catches a hang, far from what a busy machine needs (5 s was not: under load, the
    groups of the first update took longer, the wait ran out and nothing straddled)."""

    def __init__(self, sampler, waiting_task, **kw):
        super().__init__(make("refund_desk"), **kw)
        self.sampler, self.waiting_task, self.waited = sampler, waiting_task, False

    async def reset(self, task, seed):
        self.task = task
        return await super().reset(task, seed)

    async def step(self, action):
        if self.task["id"] == self.waiting_task and not self.waited:
            self.waited, v0, t0 = True, self.sampler.policy_version, time.monotonic()
            while self.sampler.policy_version == v0 and time.monotonic() - t0 < 120:
                await asyncio.sleep(0.01)
        return await super().step(action)


def _run(
    tiny,
    *,
    steps,
    max_staleness,
    slow_update_s=0.0,
    start_version=0,
    done=None,
    tool_ms=30,
    waiting=True,
    start=0,
    consumed=frozenset(),
    ledger=None,
):
    tasks = make("refund_desk").sample_tasks(8)
    policy = scripted_policy(tiny.renderer, tasks)
    finished = []
    policy.sampler.policy_version = start_version
    learner = Learner(copy.deepcopy(tiny.model), LearnerConfig(lr=1e-6))
    update = learner.update

    def slow(*args, **kwargs):  # a learner slower than a tool call, so turns straddle it
        time.sleep(slow_update_s)
        return update(*args, **kwargs)

    learner.update = slow
    seen = []

    async def after(step, m, episodes):
        seen.append((step, policy.sampler.policy_version, m, episodes))
        return True

    def batch(b):
        return [tasks[(2 * b) % 8], tasks[(2 * b + 1) % 8]]

    def env():
        waiting_task = tasks[1]["id"] if waiting else None
        return WaitsForAnUpdate(policy.sampler, waiting_task, median_ms=tool_ms, tail=3, seed=1)

    asyncio.run(
        train_async(
            env,
            batch,
            policy,
            learner,
            _reward,
            GRPOConfig(group_size=4, rollout=ROLLOUT),
            AsyncSettings(steps, start, max_staleness, StalenessLR(), consumed=consumed),
            writer=lambda b: None,
            done=done or (lambda b: {}),
            after_step=after,
            on_episode=finished.append,
            ledger=ledger,
        )
    )
    return seen, policy, finished


def test_the_staleness_bound_holds_and_every_turn_carries_its_version(tiny):
    seen, _, finished = _run(tiny, steps=6, max_staleness=1, slow_update_s=0.2, tool_ms=100)
    assert [s for s, *_ in seen] == list(range(6))
    for step, version_after, m, episodes in seen:
        assert version_after == step + 1  # one version per update
        assert len(episodes) == 2 * 4
        for e in episodes:  # trained at version `step`: no token older than step - 1
            assert min(episode_versions(e)) >= step - 1, (step, episode_versions(e))
            assert e.receipt.rollout["weight_sync"] == "between_turns"
        assert m["async/staleness_max"] <= 1
        assert m["async/lr_effective"] == pytest.approx(1e-6 * m["async/lr_scale"])
        fresh = m["async/staleness_max"] == 0
        assert m["async/lr_scale"] == 1.0 if fresh else m["async/lr_scale"] < 1.0
    # turns of one episode sampled on both sides of an update carry both versions
    spanning = [e for e in finished if len(set(episode_versions(e))) > 1]
    assert spanning, "no episode straddled an update"
    assert all(v[0] < v[-1] for v in map(episode_versions, spanning))  # in turn order
    stale = [m["async/staleness_mean"] for *_, m, _ in seen]
    assert max(stale) > 0  # the learner did train on samples of an older version


def test_a_slow_learner_with_fast_tools_wastes_no_rollouts(tiny):
    """The window refills only once an update is done, so the groups that refill it sample on
    the new weights: they are fresh enough for the step after next and none expires (refilled
    at the start of the update, they would sample on the old weights and expire a step
    later, every step)."""
    seen, *_ = _run(tiny, steps=6, max_staleness=1, slow_update_s=0.3, tool_ms=1, waiting=False)
    assert [m["async/dropped_stale"] for *_, m, _ in seen] == [0.0] * 6
    assert all(m["async/staleness_max"] <= 1 for *_, m, _ in seen)
    # the pipeline is full: from step 1 on the learner trains on the previous version's groups
    assert [m["async/staleness_mean"] for *_, m, _ in seen][1:] == [1.0] * 5


def test_stale_samples_are_dropped_counted_and_never_trained_on(tiny):
    # batch 0's episodes were sampled (before a crash, say) by version 0; the learner is at 5
    tasks = make("refund_desk").sample_tasks(8)
    old = scripted_policy(tiny.renderer, tasks)
    groups = asyncio.run(
        run_groups("refund_desk", tasks[:2], old, ROLLOUT, group_size=4, seed=0, score=_reward)
    )
    on_disk = {e.episode_id: e for g in groups for e in g}
    seen, *_ = _run(
        tiny,
        steps=2,
        max_staleness=1,
        start_version=5,
        done=lambda b: on_disk if b == 0 else {},
    )
    trained = {e.episode_id for *_, eps in seen for e in eps}
    assert not trained & set(on_disk), "a stale episode was trained on"
    assert seen[0][2]["async/dropped_stale"] == 8.0  # both of batch 0's groups, counted
    assert seen[-1][2]["async/dropped_stale_total"] == 8.0
    assert all(len(eps) == 8 for *_, eps in seen)  # replaced by fresh groups
    assert all(min(episode_versions(e)) >= 5 for *_, eps in seen for e in eps)


def test_the_ledger_names_what_each_update_used_and_a_resume_never_trains_twice(tiny, tmp_path):
    writes = ledger_writer(tmp_path)
    seen, _, finished = _run(tiny, steps=2, max_staleness=1, slow_update_s=0.05, ledger=writes)
    rows = read_ledger(tmp_path)
    assert sorted(rows) == [0, 1]
    for step, _, m, episodes in seen:
        assert sorted(rows[step]["trained"]) == sorted(e.episode_id for e in episodes)
        assert len(rows[step]["dropped_stale"]) == m["async/dropped_stale"]
    # batch 0's second group waits for an update, so step 0 trained on a batch-1 group
    ahead = [i for i in rows[0]["trained"] if ":s1:" in i]
    assert ahead
    # resume after step 0 (its checkpoint) with batch 1's episodes on disk: what step 0 used
    # is not reused; the rest is, and every step is still full
    on_disk = {e.episode_id: e for e in finished if ":s1:" in e.episode_id}
    seen2, *_ = _run(
        tiny,
        steps=3,
        max_staleness=1,
        start=1,
        start_version=1,
        done=lambda b: on_disk if b == 1 else {},
        consumed=consumed_before(tmp_path, 1),
    )
    again = [e.episode_id for *_, eps in seen2 for e in eps]
    assert not set(again) & set(rows[0]["trained"]), "an episode was trained on twice"
    assert [len(eps) for *_, eps in seen2] == [8, 8]
    used = consumed_before(tmp_path, 1)
    assert set(on_disk) - used <= set(again)  # batch 1's other episodes: reused and trained


def test_a_window_smaller_than_a_step_is_refused(tiny):
    with pytest.raises(ValueError, match="max_outstanding_groups=1 is less than the 2 groups"):
        asyncio.run(
            train_async(
                "refund_desk",
                lambda b: make("refund_desk").sample_tasks(2),
                scripted_policy(tiny.renderer, make("refund_desk").sample_tasks(2)),
                Learner(copy.deepcopy(tiny.model), LearnerConfig()),
                _reward,
                GRPOConfig(group_size=2, rollout=ROLLOUT),
                AsyncSettings(1, max_outstanding_groups=1),
                writer=lambda b: None,
                done=lambda b: {},
                after_step=None,
            )
        )


def test_staleness_schedules_and_their_split_into_lr_and_weights():
    assert staleness_factor(0) == 1.0
    assert staleness_factor(2, "inverse", alpha=0.5) == pytest.approx(0.5)
    assert staleness_factor(3, "exponential", gamma=0.5) == pytest.approx(0.125)
    assert staleness_factor(7, "off") == 1.0
    scale, weights = staleness_scales([0, 2], "inverse", alpha=0.5)
    assert scale == pytest.approx(0.75) and sum(weights) / 2 == pytest.approx(1.0)
    assert weights[0] / weights[1] == pytest.approx(2.0)  # the fresh sample counts double
    with pytest.raises(ValueError, match="unknown staleness schedule"):
        staleness_factor(1, "linear")


def test_a_learning_rate_scale_slows_the_step_where_a_loss_weight_cannot(tiny):
    """AdamW normalises the gradient's scale away: halving every advantage moves the
    weights as far as before, halving the learning rate halves the move."""
    from tracerl.rollout import ScriptedSampler
    from tracerl.rollout.runner import Policy, run_episode

    policy = Policy(
        ScriptedSampler.from_texts(tiny.renderer, lambda r: "Answer 4.", logprob=-0.7),
        tiny.renderer,
        get_parser("json_list"),
        "t",
    )
    task = make("refund_desk").sample_tasks(1)[0]
    traj = asyncio.run(run_episode(make("refund_desk"), task, policy, ROLLOUT)).trajectories

    def moved(advantage, lr_scale):
        model = copy.deepcopy(tiny.model)
        before = [p.detach().clone() for p in model.parameters()]
        Learner(model, LearnerConfig(lr=1e-3)).update(traj, [advantage], lr_scale=lr_scale)
        return sum(
            float((p - b).abs().sum()) for p, b in zip(model.parameters(), before, strict=True)
        )

    base = moved(1.0, 1.0)
    assert moved(0.5, 1.0) == pytest.approx(base, rel=0.05)  # a loss weight: no effect
    assert moved(1.0, 0.5) == pytest.approx(base / 2, rel=0.05)  # the lr scale: half


def test_timeouts_are_excluded_or_clamped_and_never_counted_as_policy_failures(tiny):
    tasks = make("refund_desk").sample_tasks(2)
    policy = scripted_policy(tiny.renderer, tasks)
    timed = ROLLOUT.model_copy(update={"budgets": Budgets(steps=6, wall_time_s=0.02)})
    groups = asyncio.run(
        run_groups(
            lambda: SlowTools(make("refund_desk"), median_ms=60, tail=1, seed=0),
            tasks,
            policy,
            timed,
            group_size=2,
            score=lambda e: 0.7,
        )
    )
    episodes = [e for g in groups for e in g]
    assert {e.stop_reason.value for e in episodes} == {"timeout"}
    _, eligible = training_rewards(episodes, GRPOConfig(timeouts="exclude"))
    assert not any(eligible)
    rewards, eligible = training_rewards(
        episodes, GRPOConfig(timeouts="grade", timeout_reward_cap=0.25)
    )
    assert all(eligible) and rewards == [0.25] * len(episodes)
    m = rollout_metrics(episodes)
    assert m["rollout/timeout_rate"] == 1.0 and m["rollout/infra_failure_rate"] == 0.0
    assert scored_metrics(episodes)["policy_failure_rate"] == 0.0


def test_learner_weights_lock_is_taken_for_the_optimizer_step(tiny):
    import threading

    learner = Learner(copy.deepcopy(tiny.model), LearnerConfig(lr=1e-3))
    lock, held, bumped = threading.Lock(), [], []

    class Watch:
        def __enter__(self):
            lock.acquire()
            held.append(True)

        def __exit__(self, *exc):
            lock.release()

    learner.weights_lock = Watch()
    learner.after_update = lambda: bumped.append(lock.locked())
    ids = torch.randint(0, 100, (1, 8)).tolist()[0]
    from tracerl.types import Segment, Source, Trajectory

    t = Trajectory(
        segments=(
            Segment(Source.PROMPT, ids[:4]),
            Segment(Source.POLICY, ids[4:], logprobs=[-1.0] * 4),
        )
    )
    learner.update([t], [1.0])
    assert held == [True] and bumped == [True]  # the version bump happens under the lock


def test_tracerl_train_async_writes_staleness_and_effective_lr_curves(tmp_path):
    from typer.testing import CliRunner

    from tracerl.cli import app
    from tracerl.report.html import ASYNC_CURVES, CURVES

    args = ["configs/learn-arithmetic.yaml", f"out_dir={tmp_path}", "trainer.steps=6"]
    out = CliRunner().invoke(
        app, ["train", *args, "env.eval_tasks=4", "trainer.mode=async", "trainer.max_staleness=2"]
    )
    assert out.exit_code == 0, out.output
    run = tmp_path / "learn-arithmetic"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["phase"] == "train"]
    assert [r["step"] for r in train] == list(range(6))
    assert all(r["async/staleness_max"] <= 2 for r in train)
    assert [r["train/policy_version"] for r in train] == [float(s + 1) for s in range(6)]
    html = (run / "report" / "index.html").read_text()
    assert all(f'data-curve="{c}"' in html for c in (*CURVES, *ASYNC_CURVES))
    written = [t for _, t in read_run_trajectories(run)]
    receipts = [t.receipt for t in written]
    assert receipts and all(r["rollout"]["weight_sync"] == "between_turns" for r in receipts)
    # the ledger names what each update used; the report counts what became of the rest
    ledger = read_ledger(run)
    trained = [i for step in range(6) for i in ledger[step]["trained"]]
    per_step = {len(ledger[step]["trained"]) for step in range(6)}
    assert len(per_step) == 1 and len(trained) == len(set(trained)) == 6 * per_step.pop()
    assert set(trained) <= {t.episode_id for t in written}
    assert f"{len(trained)} were trained on" in html


def test_an_async_run_reports_only_what_it_trained_on_as_training(tmp_path):
    """The producer samples past the last step: those episodes are counted as never used,
    never shown as the run's best or worst training episode nor triaged as training; the
    run facts say sampling ran ahead; and an evaluation's bar counts its own episodes, not
    the producer's sampling beside it."""
    import re

    from tracerl.config.loading import load_config
    from tracerl.report.html import write_report
    from tracerl.report.progress import QuietProgress
    from tracerl.train.loop import train

    class Bars(QuietProgress):
        def __init__(self):
            super().__init__()
            self.phases = []

        def phase(self, description, total, done=0):
            self.phases.append([description, total, done, 0])  # ..., advanced since

        def advance(self, _=None):
            self.phases[-1][3] += 1

    args = [f"out_dir={tmp_path}", "trainer.steps=3", "trainer.group_size=4", "env.eval_tasks=4"]
    args += ["trainer.mode=async", "trainer.max_staleness=2", "trainer.eval_every=1"]
    cfg = load_config("configs/learn-arithmetic.yaml", args)
    bars = Bars()
    train(cfg, progress=bars, log=lambda line: None)
    evals = [p for p in bars.phases if p[0].startswith("eval")]
    assert len(evals) == 4 and all(n == total == 4 for _, total, _, n in evals), evals
    # the producer's bar, taken up again after each evaluation where it was, and beyond
    rollouts = [p for p in bars.phases if p[0] == "async rollouts"]
    assert len(rollouts) == 4 and rollouts[0][2] == 0
    assert all(a[2] + a[3] <= b[2] for a, b in itertools.pairwise(rollouts)), rollouts

    run = cfg.run_dir
    ledger = read_ledger(run)
    used = {i for r in ledger.values() for k in ("trained", "dropped_stale") for i in r[k]}
    sampled = {t.episode_id for p, t in read_run_trajectories(run) if p.parent == run / "episodes"}
    assert sampled - used, "the producer sampled nothing past the last step"
    html = write_report(run).read_text()
    for label in ("best training", "worst training"):
        row = re.search(rf"<td>{label}</td><td><a href=[^>]*>([^<]+)</a>", html)
        assert row and row.group(1) in used, (label, row and row.group(1))
    assert "asynchronous: sampled up to 2 policy versions ahead" in html
    assert f"The last {len(used & sampled)} training episodes" in html
