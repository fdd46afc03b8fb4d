"""No step without signal: groups whose advantages are all zero are counted, left out of the
update and replaced (DAPO's dynamic sampling), within a cap; every sampled group is written
and counted, replacement ids never collide, and a resumed step redraws the same."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from tracerl.config.loading import load_config
from tracerl.envs import make
from tracerl.rollout.persist import read_run_trajectories
from tracerl.train.dynamic_sampling import (
    DynamicSampling,
    replacement_tasks,
    replacements_needed,
    sample_with_signal,
)
from tracerl.train.grpo import GRPOConfig, has_signal
from tracerl.train.metrics import signal_metrics
from tracerl.types import Attribution, RewardBreakdown, StopReason


def _episode(reward: float, eligible: bool = True):
    return SimpleNamespace(
        reward=RewardBreakdown.scalar(reward, Attribution.POLICY),
        gradient_eligible=eligible,
        stop_reason=StopReason.ANSWERED,
    )


def _group(*rewards, out=()):
    return [_episode(r, i not in out) for i, r in enumerate(rewards)]


@pytest.mark.parametrize("advantage", ["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"])
def test_a_group_has_signal_when_its_eligible_members_differ(advantage):
    cfg = GRPOConfig(advantage=advantage)
    assert has_signal(_group(1.0, 0.0, 0.5), cfg)
    assert not has_signal(_group(1.0, 1.0, 1.0), cfg)  # all equal: nothing to compare
    # an ineligible member's different reward does not give its group signal
    assert not has_signal(_group(1.0, 1.0, 0.0, out={2}), cfg)
    assert not has_signal(_group(0.0, 1.0, out={1}), cfg)  # one eligible member, no baseline
    assert not has_signal(_group(0.3), cfg)  # alone
    m = signal_metrics([True, False, False, True])
    assert m["train/zero_signal_groups"] == 2.0
    assert m["train/zero_signal_group_rate"] == pytest.approx(0.5)


def test_replacements_follow_the_informative_rate_within_the_cap():
    assert replacements_needed(4, 4, 4, cap=8) == 0
    assert replacements_needed(4, 2, 4, cap=8) == 4  # half were informative: 2 / 0.5
    assert replacements_needed(4, 1, 4, cap=8) == 8  # 3 / 0.25 = 12, capped at 8
    assert replacements_needed(4, 0, 4, cap=8) == 8  # nothing informative yet: the cap
    assert replacements_needed(4, 3, 4, cap=2) == 2  # at least the missing, at most the cap


SIGNAL = {"a": True, "b": False, "c": False, "d": True, "e": False, "f": True, "g": True}


def _sampler(signal=SIGNAL):
    calls = []

    async def run_round(tasks, first):
        calls.append(([t["id"] for t in tasks], first))
        return [[SimpleNamespace(task=t["id"], position=first + i)] for i, t in enumerate(tasks)]

    def refill(round_, n, drawn):
        calls.append(("refill", round_, n, sorted(drawn)))
        return [{"id": k} for k in signal if k not in drawn][:n]

    return calls, run_round, refill, lambda g: signal[g[0].task]


def test_a_step_samples_replacements_until_it_has_its_quota_of_informative_groups():
    calls, run_round, refill, signal = _sampler()
    tasks = [{"id": k} for k in "abc"]
    s = asyncio.run(sample_with_signal(tasks, run_round, signal, DynamicSampling(3), refill))
    # round 1: a, b, c (1 informative of 3): 2 missing / (1/3) = 6 replacements, capped at
    # 2 x quota = 6; the split has only 4 more; their positions follow the step's own
    assert calls == [
        (["a", "b", "c"], 0),
        ("refill", 2, 6, ["a", "b", "c"]),
        (["d", "e", "f", "g"], 3),
    ]
    assert [g[0].task for g in s.train] == ["a", "d", "f"]  # the quota, in drawing order
    positions = [g[0].position for g in s.drawn]
    assert positions == list(range(7))  # episode ids never collide
    m = s.metrics(dynamic=True)
    assert m["train/sampled_groups"] == 7.0 and m["train/resampled_groups"] == 4.0
    assert m["train/sampling_rounds"] == 2.0 and m["train/informative_groups"] == 4.0
    assert m["train/filtered_groups"] == 3.0  # b, c, e: without signal
    assert m["train/surplus_groups"] == 1.0  # g: informative, beyond the quota
    assert m["train/episodes_sampled"] == 7.0
    # without dynamic sampling a step says what it sampled, nothing about a filter
    assert set(s.metrics(dynamic=False)) == {"train/sampled_groups", "train/episodes_sampled"}


def test_the_cap_stops_resampling_and_the_step_trains_on_what_it_has():
    none = dict.fromkeys("abcdefghijklmnop", False)
    calls, run_round, refill, signal = _sampler(none)
    tasks = [{"id": k} for k in "ab"]
    s = asyncio.run(sample_with_signal(tasks, run_round, signal, DynamicSampling(3), refill))
    assert s.rounds == 3 and s.train == [] and len(s.drawn) == 2 + 4 + 4
    # off: one round, every group trained on (as before dynamic sampling)
    calls, run_round, refill, signal = _sampler(none)
    s = asyncio.run(sample_with_signal(tasks, run_round, signal, None, refill))
    assert s.rounds == 1 and len(s.train) == 2 and len(calls) == 1


def test_replacement_tasks_are_a_function_of_seed_step_and_round_and_never_repeat_a_task():
    cfg = load_config("configs/learn-arithmetic.yaml", ["env.train_split=train"])
    probe = make("arithmetic")
    first = [t["id"] for t in probe.sample_tasks(4, seed=0)]
    a = replacement_tasks(cfg, probe, 3, 2, 5, set(first))
    assert len(a) == 5 and not {t["id"] for t in a} & set(first)
    assert a == replacement_tasks(cfg, probe, 3, 2, 5, set(first))  # a resume draws the same
    assert a != replacement_tasks(cfg, probe, 3, 3, 5, set(first))  # another round, others


def test_tracerl_train_with_dynamic_sampling_writes_counts_and_resumes_without_resampling(
    tmp_path,
):
    """Groups of two on a fresh model: most have no signal. Every sampled group is written
    under its own id and counted; resuming from scratch redraws the same replacements and
    reuses every episode (nothing sampled twice)."""
    import shutil

    from typer.testing import CliRunner

    from tracerl.cli import app

    args = [
        "train",
        "configs/learn-arithmetic.yaml",
        f"out_dir={tmp_path}",
        "trainer.steps=2",
        "trainer.group_size=2",
        "env.eval_tasks=2",
        "trainer.dynamic_sampling.max_rounds=3",
    ]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    run = tmp_path / "learn-arithmetic"

    def steps():
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        return [r for r in rows if r["phase"] == "train"]

    first = steps()
    for r in first:
        assert r["train/sampled_groups"] == 4 + r["train/resampled_groups"]
        assert r["train/informative_groups"] <= r["train/sampled_groups"]
        assert r["train/zero_signal_groups"] == (
            r["train/sampled_groups"] - r["train/informative_groups"]
        )
        assert r["train/filtered_groups"] == r["train/zero_signal_groups"]
        assert r["train/surplus_groups"] == max(0, r["train/informative_groups"] - 4)
        # it resampled exactly when round 1 left it short, and stopped at the cap
        assert (r["train/sampling_rounds"] > 1) == (r["train/resampled_groups"] > 0)
        assert r["train/sampling_rounds"] <= 3
    assert any(r["train/resampled_groups"] > 0 for r in first), "nothing was resampled"

    def train_ids():
        return {
            path.name: [t.episode_id for _, t in read_run_trajectories(run) if _ == path]
            for path in sorted((run / "episodes").glob("step_*.jsonl.gz"))
        }

    written = train_ids()
    for r in first:
        ids = written[f"step_{r['step']}.jsonl.gz"]
        assert len(ids) == len(set(ids)) == 2 * r["train/sampled_groups"]  # every one, once
        positions = {int(i.rsplit(":t", 1)[1].split(":")[0]) for i in ids}
        assert positions == set(range(int(r["train/sampled_groups"])))

    html = (run / "report" / "index.html").read_text()
    assert "replacement groups sampled per step" in html and "up to 3 rounds a step" in html

    shutil.rmtree(run / "checkpoints")
    out = CliRunner().invoke(app, [*args, "--resume"])
    assert out.exit_code == 0, out.output
    again = steps()
    assert [r["train/sampled_groups"] for r in again] == [r["train/sampled_groups"] for r in first]
    assert all(r["train/reused_episodes"] == r["train/episodes_sampled"] for r in again)
    assert train_ids() == written  # nothing sampled twice


def test_async_training_sets_groups_without_signal_aside_and_the_ledger_names_them(tiny, tmp_path):
    import copy

    from tests.scripts import scripted_policy
    from tracerl.report.run import read_ledger
    from tracerl.rollout.budget import Budgets, RolloutConfig
    from tracerl.rollout.groups import episode_member, episode_task_id
    from tracerl.train.async_loop import (
        AsyncSettings,
        consumed_before,
        ledger_writer,
        train_async,
    )
    from tracerl.train.learner import Learner, LearnerConfig

    tasks = make("refund_desk").sample_tasks(8)
    flat = {t["id"] for t in tasks[::2]}  # every member of these scores the same

    def reward(e):
        task = episode_task_id(e.episode_id)
        return 1.0 if task in flat else float(episode_member(e.episode_id) % 2 == 0)

    policy = scripted_policy(tiny.renderer, tasks)
    seen = []

    async def after(step, m, episodes):
        seen.append((m, episodes))
        return True

    asyncio.run(
        train_async(
            "refund_desk",
            lambda b: [tasks[(2 * b) % 8], tasks[(2 * b + 1) % 8]],
            policy,
            Learner(copy.deepcopy(tiny.model), LearnerConfig(lr=1e-6)),
            reward,
            GRPOConfig(
                group_size=2,
                rollout=RolloutConfig(budgets=Budgets(steps=6), reserve=None),
                dynamic_sampling=DynamicSampling(max_rounds=3),
            ),
            AsyncSettings(3, max_staleness=2),
            writer=lambda b: None,
            done=lambda b: {},
            after_step=after,
            ledger=ledger_writer(tmp_path),
        )
    )
    ledger = read_ledger(tmp_path)
    for step, (m, episodes) in enumerate(seen):
        trained = {episode_task_id(e.episode_id) for e in episodes}
        assert trained and not trained & flat  # only groups with signal are trained on
        assert len(episodes) == 2 * 2  # the step's quota
        assert m["train/filtered_groups"] == len(ledger[step]["filtered"]) / 2
        assert {episode_task_id(i) for i in ledger[step]["filtered"]} <= flat
        assert m["train/zero_signal_groups"] == m["train/filtered_groups"]
    assert sum(len(r["filtered"]) for r in ledger.values()) > 0
    # a resume never runs a set-aside group again
    assert set(ledger[0]["filtered"]) <= consumed_before(tmp_path, 1)
