"""A distillation teacher that cannot score an episode's samples makes that episode the
evaluator's, as a crashing reward does: left out of the update whole, not eligible, counted in
the step's attribution metrics, its reward record on disk saying so (with the teacher named
and why), and a teacher that fails every episode of K steps stops the run as a dead verifier
does."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from tracerl.train.distill import Distiller
from tracerl.train.futility import Futility
from tracerl.train.grpo import GRPOConfig, update_on_groups
from tracerl.train.metrics import gradient_eligible, owner
from tracerl.types import Attribution

T = 0.7
LABEL = "run:runs/teacher@7"


class Teacher:
    """The student's log-probs minus 0.25 on policy tokens; `fail`: the episodes it cannot
    score (every sample), or ``(episode, sample)`` pairs (that sample only)."""

    identity, label = "under-test", LABEL

    def __init__(self, fail=()):
        self.fail = set(fail)

    def logprobs(self, rows, temperature):
        out = []
        for t in rows:
            if t.episode_id in self.fail or (t.episode_id, t.sample_index) in self.fail:
                out.append("ConnectionError: teacher server at 10.0.0.7:8000 refused")
                continue
            out.append(
                [v - 0.25 if m else 0.0 for v, m in zip(t.logprobs, t.loss_mask, strict=True)]
            )
        return out


class Learner:
    """Records what the update trained on."""

    def __init__(self):
        self.rows = []

    def update(self, rows, advantages, *, lr_scale=1.0, weights=None):
        self.rows = list(rows)
        return {}


@pytest.fixture(scope="module")
def episode(tiny):
    """Episodes of two samples each (a parent and its sub-agent), rewarded 1 or 0."""
    from tests.unit.test_subagents import Archive, scripted
    from tracerl.rollout.budget import Budgets, RolloutConfig
    from tracerl.rollout.context import SubagentConfig
    from tracerl.rollout.episode import score_episode
    from tracerl.rollout.runner import run_episode

    cfg = RolloutConfig(
        budgets=Budgets(steps=4), reserve=None, subagents=SubagentConfig(), max_turn_tokens=48
    )
    base = asyncio.run(
        run_episode(Archive(), {"id": "t"}, scripted(tiny), cfg, seed=0, episode_id="e")
    )

    def make(name, reward=1.0):
        trajectories = [dataclasses.replace(t, episode_id=name) for t in base.trajectories]
        receipt = dataclasses.replace(base.receipt, episode_id=name)
        ep = dataclasses.replace(base, trajectories=trajectories, receipt=receipt)
        return score_episode(ep, lambda _: reward)  # on the episode and on its samples

    return make


def distill(teacher, **kw):
    return GRPOConfig(group_size=3, distill=Distiller(teacher, temperature=T, **kw))


def test_an_episode_the_teacher_failed_is_the_evaluators_and_counted(episode):
    group = [episode("e0", 1.0), episode("e1", 0.0), episode("e2", 1.0)]
    assert all(owner(e) is Attribution.POLICY and gradient_eligible(e) for e in group)
    learner = Learner()
    m = update_on_groups([group], learner, distill(Teacher(fail={"e1"})))
    assert {t.episode_id for t in learner.rows} == {"e0", "e2"}
    e1 = group[1]
    assert owner(e1) is Attribution.EVALUATOR and not gradient_eligible(e1)
    assert e1.reward.attribution is Attribution.EVALUATOR and not e1.reward.eligible
    # why, naming the teacher and its error, as a crashed reward names its exception
    assert LABEL in e1.reward.error and "ConnectionError: teacher server" in e1.reward.error
    assert e1.reward.total == 0.0 and e1.reward.components == episode("x", 0.0).reward.components
    # every sample carries the record that is written to disk
    assert all(t.reward == e1.reward.to_dict() for t in e1.trajectories)
    assert all(owner(e) is Attribution.POLICY for e in (group[0], group[2]))
    assert m["attribution/episodes_evaluator"] == pytest.approx(1 / 3)
    assert m["attribution/episodes_policy"] == pytest.approx(2 / 3)
    assert m["train/evaluator_error_rate"] == pytest.approx(1 / 3)
    assert m["train/ineligible_episodes"] == 1.0
    assert m["train/distill/teacher_failures"] == 2.0  # its two samples


def test_one_sample_the_teacher_failed_leaves_its_whole_episode_out(episode):
    group = [episode("e0"), episode("e1"), episode("e2")]
    learner = Learner()
    m = update_on_groups([group], learner, distill(Teacher(fail={("e1", 1)})))  # its sub-agent
    assert [t.episode_id for t in learner.rows] == ["e0", "e0", "e2", "e2"]
    assert owner(group[1]) is Attribution.EVALUATOR and "sample 1" in group[1].reward.error
    assert m["attribution/episodes_evaluator"] == pytest.approx(1 / 3)
    assert m["train/distill/teacher_failures"] == 1.0


def test_a_sample_past_the_teachers_budget_makes_its_episode_the_evaluators(episode):
    group = [episode("e0"), episode("e1"), episode("e2")]
    first = sum(sum(t.loss_mask) for t in group[0].trajectories)
    learner = Learner()
    m = update_on_groups([group], learner, distill(Teacher(), tokens_per_step=first))
    assert {t.episode_id for t in learner.rows} == {"e0"}
    for e in group[1:]:
        assert owner(e) is Attribution.EVALUATOR and "tokens_per_step" in e.reward.error
    assert m["attribution/episodes_evaluator"] == pytest.approx(2 / 3)


def test_a_dead_teacher_stops_the_run_as_a_dead_verifier_does_naming_the_teacher(episode):
    futility = Futility(3, "runs/student")
    stop = None
    for step in range(3):
        group = [episode(f"s{step}e{k}") for k in range(3)]
        teacher = Teacher(fail={e.episode_id for e in group})
        m = update_on_groups([group], Learner(), distill(teacher))
        assert m["attribution/episodes_evaluator"] == 1.0
        stop = futility.observe(step, group, m)
        assert (stop is None) == (step < 2)
    assert stop is not None and stop.owner is Attribution.EVALUATOR
    assert "steps 0-2" in stop.message and "evaluator's failure" in stop.message
    assert LABEL in stop.message and "ConnectionError: teacher server" in stop.message
    assert "9 of 9" in stop.message and "--resume" in stop.hint


def test_the_step_file_says_whose_failure_it_was_as_for_a_crashed_reward(tiny, tmp_path):
    from tracerl.envs import get_parser, make
    from tracerl.report.run import iter_episodes
    from tracerl.report.triage import classify
    from tracerl.rollout import ScriptedSampler
    from tracerl.rollout.budget import Budgets, RolloutConfig
    from tracerl.rollout.persist import EpisodeWriter, done_episodes
    from tracerl.rollout.runner import Policy
    from tracerl.train.grpo import grpo_step

    sampler = ScriptedSampler.from_texts(tiny.renderer, lambda r: f"Answer {r.episode_id[-1]}.")
    policy = Policy(sampler, tiny.renderer, get_parser("json_list"), "tiny-random")
    tasks = make("refund_desk").sample_tasks(2)
    rollout = RolloutConfig(budgets=Budgets(steps=1), max_turn_tokens=6, reserve=None)
    cfg = GRPOConfig(group_size=2, rollout=rollout)

    def reward(e):
        if e.episode_id.endswith("g1") and e.episode_id.startswith(tasks[1]["id"]):
            raise ValueError("the grader crashed")
        return float(e.episode_id.endswith("g0"))

    # which episode ids the step will draw: the first task's second member is the teacher's
    first_ids = [f"{tasks[0]['id']}:s0:t0:g{g}" for g in range(2)]
    cfg.distill = Distiller(Teacher(fail={first_ids[1]}), temperature=T)
    learner = Learner()
    m, episodes = grpo_step(
        lambda: make("refund_desk"),
        tasks,
        policy,
        learner,
        reward,
        cfg,
        step=0,
        writer=EpisodeWriter(tmp_path, 0),
    )
    assert first_ids[1] in {e.episode_id for e in episodes}
    assert m["attribution/episodes_evaluator"] == pytest.approx(2 / 4)
    on_disk = {r.episode_id: r for r in iter_episodes(tmp_path)}
    assert len(on_disk) == 4
    taught = on_disk[first_ids[1]]
    crashed = next(r for k, r in on_disk.items() if k.endswith("g1") and k not in first_ids)
    for record in (taught, crashed):  # the same kind of record, the same verdict
        d = record.trajectories[0].reward
        assert d["attribution"] == "evaluator" and d["eligible"] is False and d["error"]
        assert record.attribution == "evaluator"
        assert classify(record).bucket == "evaluator"
    assert LABEL in taught.trajectories[0].reward["error"]
    assert LABEL in classify(taught).why
    healthy = on_disk[first_ids[0]]
    assert healthy.trajectories[0].reward["attribution"] == "policy"
    # a resumed step reuses the episodes as written: the teacher's stays out of the update
    again = done_episodes(tmp_path, 0)
    assert not gradient_eligible(again[first_ids[1]]) and gradient_eligible(again[first_ids[0]])
    assert owner(again[first_ids[1]]) is Attribution.EVALUATOR


def test_the_rewrite_changes_only_the_marked_episodes_records(episode, tmp_path):
    import zlib

    from tracerl.rollout.persist import EpisodeWriter, done_episodes, step_file
    from tracerl.train.distill.attribution import mark_teacher_failure, rewrite_rewards

    group = [episode("e0"), episode("e1"), episode("e2")]
    writer = EpisodeWriter(tmp_path, 4)
    for e in group:
        writer.append(e.trajectories)
    path = step_file(tmp_path, 4)
    before = path.read_bytes()
    assert rewrite_rewards(path, group) == 0 and path.read_bytes() == before  # nothing new
    mark_teacher_failure(group[1], "distillation teacher x: sample 0 not scored: boom")
    assert rewrite_rewards(path, group) == 2  # e1's two samples
    assert rewrite_rewards(path, group) == 0  # said once
    data, members = path.read_bytes(), 0
    while data:  # still one gzip member per episode, as the writer writes them
        d = zlib.decompressobj(wbits=31)
        d.decompress(data)
        data, members = d.unused_data, members + 1
    assert members == 3
    back = done_episodes(tmp_path, 4)
    assert [t.to_dict() for t in back["e0"].trajectories] == [
        t.to_dict() for t in group[0].trajectories
    ]
    assert back["e1"].reward == group[1].reward and not back["e1"].reward.eligible
    # the tokens of the marked episode are untouched: only its reward record changed
    assert [dataclasses.replace(t, reward=None).to_dict() for t in back["e1"].trajectories] == [
        dataclasses.replace(t, reward=None).to_dict() for t in group[1].trajectories
    ]
    EpisodeWriter(tmp_path, 4).append(episode("e3").trajectories)  # appends go on as before
    assert set(done_episodes(tmp_path, 4)) == {"e0", "e1", "e2", "e3"}


def test_async_training_marks_the_teachers_failures_in_each_batchs_step_file(episode, tmp_path):
    """Asynchronous training trains on groups of several batches at once: each episode the
    teacher failed is marked in its own batch's file (its id's seed is its batch)."""
    from tracerl.rollout.persist import EpisodeWriter, done_episodes
    from tracerl.train.async_loop import _rewrite_marked
    from tracerl.train.distill.attribution import mark_teacher_failure

    batches = {b: [episode(f"t:s{b}:t0:g{g}") for g in range(2)] for b in (3, 4)}
    for b, group in batches.items():
        writer = EpisodeWriter(tmp_path, b)
        for e in group:
            writer.append(e.trajectories)
    failed = [batches[3][1], batches[4][0]]
    for e in failed:
        mark_teacher_failure(e, "distillation teacher x: sample 0 not scored: boom")
    _rewrite_marked(failed, lambda b: EpisodeWriter(tmp_path, b))
    for b, group in batches.items():
        back = done_episodes(tmp_path, b)
        for e in group:
            assert back[e.episode_id].reward.eligible is (e not in failed), (b, e.episode_id)
