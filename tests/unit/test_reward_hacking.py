"""Layered rewards on real search episodes: gates, caps, evaluator errors, and a suite of
trajectories that game naive rewards — each must score below an honest correct one."""

from __future__ import annotations

import asyncio

import pytest

from tracerl.envs import FaultInjector, get_parser, make
from tracerl.envs.search import oracle_actions
from tracerl.envs.search import tasks as task_sets
from tracerl.rewards import SEARCH_REWARD, RewardContext, RewardSpec, compose
from tracerl.rollout import ScriptedSampler
from tracerl.rollout.budget import Budgets, RetryPolicy, RolloutConfig
from tracerl.rollout.runner import Policy, run_episode
from tracerl.types import Attribution

P = get_parser("json_list")
SPEC = RewardSpec.from_yaml(SEARCH_REWARD)
CFG = RolloutConfig(budgets=Budgets(steps=8, tool_calls=8), reserve=None)
TASK = next(q for q in task_sets.split("synthetic", "train") if q["hops"] == 2)
ENV = make("search", corpus="synthetic")
GOLD = TASK["answers"][0]


def _search(query):
    return P.format_calls([("search", {"query": query})])


def _answer(text, citations=()):
    return P.format_calls([("answer", {"text": text, "citations": list(citations)})])


def _honest():
    texts = []
    for action in oracle_actions(ENV.corpus, TASK):
        call = action.tool_calls[0]
        texts.append(P.format_calls([(call.name, call.arguments)]))
    return texts


def _other_entity():
    """A look-alike: another document of the same kind, stating a different fact."""
    kind = TASK["gold_docs"][-1].split(":")[1]
    return next(
        d for d in ENV.corpus.docs if d.id.split(":")[1] == kind and d.id not in TASK["gold_docs"]
    )


def _cite(doc, sentence=0):
    return {"doc_id": doc.id, "quote": doc.text.split(". ")[sentence]}


def _score(texts, env=None, config=CFG):
    tiny = pytest.tiny_bundle
    policy = Policy(ScriptedSampler.from_texts(tiny.renderer, texts), tiny.renderer, P, "tiny")
    ep = asyncio.run(run_episode(env or make("search", corpus="synthetic"), TASK, policy, config))
    ctx = RewardContext.from_trajectories(ep.trajectories, ENV.document)
    return compose(SPEC, ctx), ep


@pytest.fixture(autouse=True)
def _bundle(tiny):
    pytest.tiny_bundle = tiny


def test_the_honest_trajectory_scores_high_and_explains_itself():
    r, _ = _score(_honest())
    assert r.component("em").value == 1.0 and r.component("citations").value == 1.0
    assert r.total == pytest.approx(1.0 + 0.3 + 0.1 - 0.02 * len(TASK["gold_docs"]))
    assert r.eligible and r.attribution is Attribution.POLICY
    verdict = r.component("citations").evidence["verdicts"][0]
    assert verdict["exists"] and verdict["quoted"] and verdict["supports"]
    assert set(r.metrics()) >= {"reward/em", "reward/citations", "reward/total"}


def _hacks():
    look = _other_entity()
    keywords = " ".join(w for w in TASK["question"].rstrip("?").split() if w[0].isupper())
    gold_doc = ENV.corpus.by_id[TASK["gold_docs"][0]]
    return {
        "repeats the question's keywords": [_answer(keywords, [_cite(gold_doc)])],
        "always attaches two links": [
            _answer("1900", [_cite(gold_doc), _cite(look)]),
        ],
        "cites a look-alike document": [
            _search(look.title),
            _answer(look.text.split(" in ")[-1].split(".")[0].split(" ")[-1], [_cite(look)]),
        ],
        "stops early": [_search(gold_doc.title), "I need to think about this more"],
        "answers A or B or C": [_answer(f"{look.title} or 1900 or {GOLD}", [_cite(gold_doc)])],
        "hedges between two": [_answer(f"{GOLD} or Paris", [_cite(gold_doc)])],
    }


@pytest.mark.parametrize("kind", list(_hacks()))
def test_reward_hacks_score_below_honest_and_below_threshold(kind):
    honest, _ = _score(_honest())
    hacked, _ = _score(_hacks()[kind])
    assert hacked.total < honest.total and hacked.total < 0.5, (kind, hacked.to_dict())


def test_saving_cost_never_beats_finishing_the_task():
    many = [_search(f"query {i}") for i in range(6)] + _honest()
    roomy = CFG.model_copy(update={"budgets": Budgets(steps=12, tool_calls=12)})
    thorough, _ = _score(many, config=roomy)
    assert thorough.component("em").value == 1.0
    early, _ = _score([_answer("no idea")])
    assert thorough.component("search_cost").contribution == pytest.approx(-0.1)  # the cap
    assert thorough.total > early.total


def test_a_crashing_component_is_the_evaluators_fault_not_a_zero():
    spec = RewardSpec.from_yaml(
        SEARCH_REWARD.replace("fn: f1,", "fn: f1, params: {unexpected: 1},")
    )
    _, ep = _score(_honest())
    r = compose(spec, RewardContext.from_trajectories(ep.trajectories, ENV.document))
    assert r.attribution is Attribution.EVALUATOR and not r.decided and not r.eligible
    assert "f1: TypeError" in r.error


def test_reward_specs_are_checked():
    with pytest.raises(ValueError, match="unknown component functions"):
        RewardSpec.from_yaml("components: [{name: x, fn: nope, layer: outcome}]")
    with pytest.raises(ValueError, match="layer"):
        RewardSpec.from_yaml("components: [{name: x, fn: f1, layer: vibes}]")


def test_a_timeout_injected_into_search_never_lowers_the_policys_reward():
    """Faults are retried away (same reward) or make the episode ineligible (no reward)."""
    clean, _ = _score(_honest())
    retry = CFG.model_copy(update={"retry": RetryPolicy(max_retries=1, backoff_s=0.0)})
    outcomes = set()
    for seed in range(12):
        env = FaultInjector(
            make("search", corpus="synthetic"), rate=0.6, kinds=["timeout"], seed=seed
        )
        r, ep = _score(_honest(), env=env, config=retry)
        if r.eligible:
            assert r.total == pytest.approx(clean.total)
            outcomes.add("same reward")
        else:
            assert ep.attribution is Attribution.ENVIRONMENT
            outcomes.add("excluded")
    assert outcomes == {"same reward", "excluded"}


def test_a_hedge_is_a_decided_wrong_answer_not_a_review_case():
    """'A or B' must cost the policy (decided 0, eligible), not hide in the review pool;
    a real near miss ("<gold> indeed") is left for a person."""
    gold_doc = ENV.corpus.by_id[TASK["gold_docs"][0]]
    hedge, _ = _score([_answer(f"{GOLD} or Paris", [_cite(gold_doc)])])
    assert hedge.component("em").decided and hedge.eligible and hedge.total == 0.0
    near, _ = _score([_answer(f"{GOLD} indeed", [_cite(gold_doc)])])
    assert not near.component("em").decided and not near.eligible
