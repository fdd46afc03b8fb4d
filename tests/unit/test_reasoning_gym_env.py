"""The reasoning-gym adapter: a task family passes check_env; its splits are the generator's,
seeded, deterministic and disjoint by question; its reward is reasoning-gym's own
`score_answer` on the reply's answer (a missing answer the policy's 0, a crashing scorer the
evaluator's); a mistake in the config names the key and the valid values."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

pytest.importorskip("reasoning_gym")

import reasoning_gym

from tracerl.envs import make
from tracerl.envs.adapters.reasoning_gym import (
    PIP,
    MissingExtra,
    ReasoningGym,
    extract_answer,
)
from tracerl.envs.parsers import Action
from tracerl.errors import NotFoundError, UserError
from tracerl.rewards import RewardContext
from tracerl.rewards.compose import compose
from tracerl.rewards.resolve import resolve_reward
from tracerl.rollout.env_check import check_env
from tracerl.types import Attribution

SUMS = {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2}


def _env(**kwargs) -> ReasoningGym:
    return make("reasoning_gym", **{"dataset": "chain_sum", "config": SUMS, **kwargs})


def _their_entry(task: dict) -> tuple[dict, object]:
    """The entry reasoning-gym itself makes at the task's source, built here independently."""
    s = task["source"]
    made = reasoning_gym.create_dataset(task["dataset"], **SUMS, seed=s["seed"], size=s["size"])
    return made[s["index"]], made


def _score(env: ReasoningGym, task: dict, reply: str):
    """The env's own reward on an episode that ended with `reply`, as a run scores it."""

    async def play():
        await env.reset(task, 0)
        return await env.step(Action(text=reply, answer=reply.strip()))

    result = asyncio.run(play())
    ctx = RewardContext(
        task=task,
        answer=result.info["answer"],
        steps=[{"step": 0, "info": result.info}],
        stop_reason="answered",
        attribution=Attribution.POLICY,
    )
    reward = resolve_reward(None, None, env)
    return compose(reward.spec, ctx, reward.functions)


def test_a_task_family_passes_check_env(base_tokenizer):
    from tracerl.models.render import ChatRenderer

    report = check_env(_env, renderer=ChatRenderer(base_tokenizer), raise_on_failure=False)
    assert report.ok, str(report)
    assert "splits: train, heldout" in report.passed
    assert any(
        p.startswith("reward: attribution, score_answer; scripted episodes 2/2")
        for p in report.passed
    )


def test_the_version_names_the_release_and_the_dataset():
    from importlib.metadata import version

    env = _env()
    assert env.version == f"1.0/reasoning-gym-{version('reasoning-gym')}/chain_sum"
    assert make("reasoning_gym").dataset == "chain_sum"  # the default family


def test_splits_are_deterministic_disjoint_by_question_and_json():
    env = _env()
    train, heldout = env.pool("train"), env.pool("heldout")
    questions = [t["question"] for t in train]
    assert len(set(questions)) == len(questions)  # repeats dropped
    assert not set(questions) & {t["question"] for t in heldout}  # never a training question
    assert not {t["id"] for t in train} & {t["id"] for t in heldout}
    assert len(train) > 800 and len(heldout) > 100
    drawn = env.sample_tasks(8, seed=3)
    assert drawn == _env().sample_tasks(8, seed=3)  # a fresh instance, the same tasks
    assert drawn != env.sample_tasks(8, seed=4)
    assert env.sample_tasks(8, seed=3, split="heldout")[0]["split"] == "heldout"
    assert json.loads(json.dumps(drawn)) == drawn  # plain JSON, as receipts keep it
    assert {"id", "question", "answer", "metadata", "source"} <= set(drawn[0])
    # the entry reasoning-gym makes at the task's source is the task
    entry, _ = _their_entry(drawn[0])
    assert (entry["question"], entry["answer"]) == (drawn[0]["question"], drawn[0]["answer"])
    # another seed, other questions
    other = {t["question"] for t in _env(seed=1).pool("train")}
    assert len(other & set(questions)) < len(questions) // 2
    with pytest.raises(ValueError, match="unknown split 'test'"):
        env.sample_tasks(1, split="test")


def test_a_config_with_few_distinct_questions_still_holds_out_only_new_ones():
    tiny = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}  # 200 sums
    env = _env(config=tiny, train_size=150, heldout_size=100)
    train = {t["question"] for t in env.pool("train")}
    heldout = [t["question"] for t in env.pool("heldout")]
    assert heldout and not train & set(heldout)
    assert len(heldout) < 100  # some generated held-out sums were training sums: dropped
    one = {"min_terms": 1, "max_terms": 1, "min_digits": 1, "max_digits": 1}  # 10 questions
    with pytest.raises(UserError, match="also a training question"):
        _env(config=one, train_size=100).sample_tasks(1, split="heldout")


def test_the_reward_is_reasoning_gyms_score_answer():
    env = _env()
    for task in env.sample_tasks(4, seed=0) + env.sample_tasks(2, seed=0, split="heldout"):
        entry, made = _their_entry(task)
        gold = task["answer"]
        wrong = str(int(gold) + 1)
        for answer in (gold, wrong, f"{gold} apples", f"0{gold}" if gold[0] != "-" else gold):
            b = _score(env, task, f"I think so.\n<answer>{answer}</answer>")
            assert b.decided and b.attribution is Attribution.POLICY
            assert b.total == made.score_answer(answer, entry), answer
            assert b.component("score_answer").evidence["answer"] == answer
        assert _score(env, task, f"<answer>{gold}</answer>").succeeded
        assert not _score(env, task, f"<answer>{wrong}</answer>").succeeded
        partial = _score(env, task, f"<answer>{gold} apples</answer>").total
        assert 0 < partial < 1  # reasoning-gym's partial credit, kept as it scores it


def test_a_missing_answer_scores_zero_as_the_policys():
    env = _env()
    task = env.sample_tasks(1, seed=0)[0]
    for reply in (task["answer"], "no idea", "<answer></answer>", "<answer>12"):
        b = _score(env, task, reply)
        assert b.total == 0.0 and b.decided and b.attribution is Attribution.POLICY
        assert b.component("score_answer").evidence["answer"] is None
    # answer_format: reply takes a reply without tags, whole
    loose = _env(answer_format="reply")
    assert _score(loose, task, f" {task['answer']} ").succeeded
    assert "Reply with the final answer only." in asyncio.run(loose.reset(task, 0))[0]["content"]


def test_answers_are_read_the_way_reasoning_gym_reads_them():
    from reasoning_gym.utils import extract_answer as theirs

    for reply in ("<answer>1</answer> then <answer> 2 </answer>", "x <answer>\n-3\n</answer>"):
        assert extract_answer(reply) == theirs(reply)
    assert extract_answer("42") is None and extract_answer("42", "reply") == "42"
    # number: tags first, else the reply's last number (a numeric family's flexible extract)
    assert extract_answer("4 + 9 = 13", "number") == "13"
    assert extract_answer("-3.5 is it, not 2.", "number") == "2"
    assert extract_answer("<answer>7</answer> or 8", "number") == "7"
    assert extract_answer("no digits here", "number") is None


def test_a_numeric_reply_is_scored_on_its_last_number():
    env = _env(answer_format="number")
    task = env.sample_tasks(1)[0]
    assert _score(env, task, f"so the sum is {task['answer']}").succeeded
    assert not _score(env, task, f"{task['answer']} is not it: 99999").succeeded
    assert "a number" in asyncio.run(env.reset(task, 0))[0]["content"]


def test_a_crashing_scorer_is_the_evaluators_fault(monkeypatch):
    env = _env()
    task = env.sample_tasks(1, seed=0)[0]
    _, made = _their_entry(task)

    def crash(self, answer, entry):
        raise RuntimeError("scorer down")

    monkeypatch.setattr(type(made), "score_answer", crash)
    b = _score(env, task, f"<answer>{task['answer']}</answer>")
    assert b.attribution is Attribution.EVALUATOR and not b.decided and not b.eligible
    assert "scorer down" in b.error
    monkeypatch.setattr(type(made), "score_answer", lambda self, a, e: "1.0")  # not a number
    assert _score(env, task, "<answer>1</answer>").attribution is Attribution.EVALUATOR


def test_a_task_the_generator_does_not_make_is_the_evaluators():
    env = _env()
    task = {**env.sample_tasks(1, seed=0)[0], "question": "What is 2 + 2?"}
    b = _score(env, task, "<answer>4</answer>")
    assert b.attribution is Attribution.EVALUATOR and "another question" in b.error


def test_the_scorer_gets_reasoning_gyms_own_entry_not_a_json_copy():
    """rearc's scorer reads tuples in the metadata: a JSON copy (lists) scores the gold
    answer 0.05; the entry rebuilt from the generator scores it 1.0."""
    env = make("reasoning_gym", dataset="rearc", train_size=2, heldout_size=1)
    task = env.sample_tasks(1, seed=0)[0]
    assert _score(env, task, f"<answer>{task['answer']}</answer>").succeeded


def test_mistakes_name_the_key_and_the_valid_values(monkeypatch):
    with pytest.raises(NotFoundError) as e:
        make("reasoning_gym", dataset="chain_summ")
    assert e.value.message.startswith("dataset: unknown reasoning-gym dataset 'chain_summ'")
    assert "did you mean 'chain_sum'" in e.value.message and "basic_arithmetic" in e.value.message
    with pytest.raises(UserError, match=r"config: unknown chain_sum setting 'min_term'.*min_terms"):
        _env(config={"min_term": 2})
    with pytest.raises(UserError, match="max_terms must be >= min_terms"):
        _env(config={"min_terms": 5, "max_terms": 2})
    with pytest.raises(UserError, match=r"config\.seed: the splits set"):
        _env(config={"seed": 3})
    with pytest.raises(UserError, match="answer_format"):
        _env(answer_format="boxed")
    with pytest.raises(UserError, match="train_size"):
        _env(train_size=0)
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # not installed
    with pytest.raises(MissingExtra) as missing:
        _env()
    assert isinstance(missing.value, ImportError) and missing.value.hint == PIP


def test_a_held_out_split_squeezed_by_training_questions_is_warned_about(caplog):
    # two single-digit terms: ~200 distinct questions, which 1000 training draws nearly cover
    import logging

    small = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
    env = make("reasoning_gym", dataset="chain_sum", config=small, seed=123)
    with caplog.at_level(logging.WARNING, logger="tracerl"):
        heldout = env.sample_tasks(48, split="heldout")
    assert len(heldout) < 50
    assert "chain_sum kept" in caplog.text and "of its 200 heldout questions" in caplog.text
