"""Per-step reward components: declared ``per: step``, scored on every environment step,
recorded on the step, paid to that step's turn by turn-level credit, shown in the viewer."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch
import yaml
from pydantic import ValidationError

from tests.scripts import scripted_policy
from tracerl.envs import make
from tracerl.errors import UserError
from tracerl.rewards import RewardContext, RewardSpec, Score, compose
from tracerl.rewards.resolve import resolve_reward
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.episode import score_episode
from tracerl.rollout.runner import run_episode
from tracerl.train.turn_credit import episode_turns, turn_level_advantages
from tracerl.types import Attribution, RewardBreakdown

STEPS = [
    {"step": 0, "evidence_gain": 0.5, "calls": []},
    {"step": 1, "evidence_gain": 0.0, "calls": []},
    {"step": 2, "evidence_gain": 0.5, "calls": []},
]


def ctx(answer: str = "Paris", steps=STEPS) -> RewardContext:
    return RewardContext(
        task={"id": "q", "answers": ["Paris"]},
        answer={"text": answer},
        steps=[dict(s) for s in steps],
        stop_reason="answered",
        attribution=Attribution.POLICY,
    )


def spec(*extra: str) -> RewardSpec:
    return RewardSpec.from_yaml(
        "components:\n"
        "  - {name: em, fn: exact_match, layer: outcome, weight: 1.0}\n"
        + "".join(f"  - {c}\n" for c in extra)
    )


def test_a_per_step_component_scores_each_step_and_sums_into_the_total():
    r = compose(
        spec("{name: gain, fn: evidence_gain, layer: process, weight: 0.4, per: step}"), ctx()
    )
    gain = r.component("gain")
    assert [(s.step, s.value) for s in gain.steps] == [(0, 0.5), (1, 0.0), (2, 0.5)]
    assert gain.value == 1.0 and gain.contribution == pytest.approx(0.4)
    assert r.step_rewards() == pytest.approx({0: 0.2, 1: 0.0, 2: 0.2})
    assert r.total == pytest.approx(1.4)  # the outcome's 1.0 plus what the steps earned
    # the record keeps every step's score, and reads back the same
    again = RewardBreakdown.from_dict(r.to_dict())
    assert again.step_rewards() == r.step_rewards() and again.total == r.total
    # scored per episode, the same function judges all the steps at once: no step shares
    whole = compose(spec("{name: gain, fn: evidence_gain, layer: process, weight: 0.4}"), ctx())
    assert whole.component("gain").steps is None and whole.step_rewards() == {}
    assert whole.total == pytest.approx(r.total)


def test_a_cap_bounds_the_sum_and_scales_every_steps_share_alike():
    steps = [{"step": k, "calls": [{"action": {"tool": "search"}}] * 3} for k in range(3)]
    r = compose(
        spec(
            "{name: cost, fn: search_cost, layer: cost, weight: 1.0, cap: 0.09, per: step,"
            " params: {per_search: 0.02}}"
        ),
        ctx(steps=steps),
    )
    # 9 searches x -0.02 = -0.18, capped at -0.09: each step pays half of its -0.06
    assert r.component("cost").contribution == pytest.approx(-0.09)
    assert r.step_rewards() == pytest.approx({0: -0.03, 1: -0.03, 2: -0.03})


def test_a_closed_gate_keeps_per_step_components_from_paying():
    s = spec("{name: gain, fn: evidence_gain, layer: process, weight: 0.4, per: step}")
    s.components[0].gate = 1.0
    r = compose(s, ctx(answer="Lyon"))
    assert r.component("gain").gated and r.step_rewards() == {} and r.total == 0.0


@pytest.mark.parametrize(
    ("component", "message"),
    [
        ("{name: g, fn: evidence_gain, layer: process, gate: 0.5, per: step}", "gate decides"),
        ("{name: g, fn: exact_match, layer: outcome, per: step}", "outcome"),
        ("{name: g, fn: evidence_gain, layer: process, per: turn}", "per"),
        # a share summed over steps would pay for taking more of them
        ("{name: g, fn: valid_calls, layer: process, per: step}", "cannot be scored per step"),
    ],
)
def test_specs_that_cannot_mean_anything_per_step_are_refused(component, message):
    with pytest.raises((ValidationError, ValueError), match=message):
        spec(component)
    with pytest.raises((ValidationError, UserError), match=message):  # in a run's config
        em = {"name": "em", "fn": "exact_match", "layer": "outcome"}
        resolve_reward(None, [em, yaml.safe_load(component)], _Env())


def test_a_step_component_that_raises_is_the_evaluators_and_names_the_step():
    def picky(c: RewardContext) -> Score:
        if c.step["step"] == 1:
            raise KeyError("evidence")
        return Score(1.0)

    s = RewardSpec.model_validate(
        {
            "components": [
                {"name": "em", "fn": "exact_match", "layer": "outcome"},
                {"name": "picky", "fn": "picky", "layer": "process", "per": "step"},
            ]
        }
    )
    r = compose(s, ctx(), {"exact_match": lambda c: Score(1.0), "picky": picky})
    assert r.attribution is Attribution.EVALUATOR and not r.decided
    assert r.error == "picky (step 1): KeyError: 'evidence'"


class _Env:
    """An env whose own method scores a step, by the names it asks for."""

    name = "stepper"

    def found(self, step, completion):
        return float(step["evidence_gain"] > 0) if step is not None else float(bool(completion))


def test_a_users_function_asks_for_the_step_by_name():
    reward = resolve_reward(
        None,
        [
            {"name": "em", "fn": "exact_match", "layer": "outcome"},
            {"name": "found", "fn": "found", "layer": "process", "weight": 0.1, "per": "step"},
        ],
        _Env(),
    )
    r = compose(reward.spec, ctx(), reward.functions)
    assert r.step_rewards() == pytest.approx({0: 0.1, 1: 0.0, 2: 0.1})


@pytest.fixture(scope="module")
def episodes(tiny):
    """One refund task played by the scripted plans: a good one, and one whose second call
    has bad arguments."""
    task = make("refund_desk").sample_tasks(1, seed=3)[0]
    policy = scripted_policy(tiny.renderer, [task])
    cfg = RolloutConfig(budgets=Budgets(steps=6, tool_calls=8, write_actions=2), reserve=None)
    return [
        asyncio.run(
            run_episode(
                make("refund_desk"), task, policy, cfg, seed=0, episode_id=f"{task['id']}:s0:g{g}"
            )
        )
        for g in (0, 2)
    ]


def test_the_episode_records_each_steps_reward_and_turn_credit_pays_it_to_that_turn(episodes):
    s = RewardSpec.from_yaml(
        "components:\n"
        "  - {name: done, fn: answered, layer: outcome, weight: 1.0}\n"
        "  - {name: errors, fn: call_errors, layer: process, weight: 0.1, per: step}\n"
    )
    scored = [
        score_episode(dataclasses.replace(e), lambda e: compose(s, _context(e))) for e in episodes
    ]
    good, bad = scored
    for e in scored:
        paid = {x["step"]: x["step_reward"] for x in e.steps}
        assert paid == pytest.approx(e.reward.step_rewards())
        assert all(x["step_rewards"] == {"errors": x["step_reward"]} for x in e.steps)
        # the trajectories written to the run directory carry the same records
        assert [x.get("step_reward") for x in e.trajectories[0].steps] == [
            x["step_reward"] for x in e.steps
        ]
    assert all(x["step_reward"] == 0.0 for x in good.steps)
    # the step whose call had bad arguments, and only it, paid for it
    paid = {x["step"]: x["step_reward"] for x in bad.steps}
    assert {k for k, v in paid.items() if v} == {x["step"] for x in bad.steps if x["policy_error"]}
    assert sorted({round(v, 9) for v in paid.values()}) == [-0.1, 0.0]
    # turn returns: the first turn's return is the whole reward, nothing counted twice
    totals = [e.reward.total for e in scored]
    per_token = turn_level_advantages(
        scored, totals, torch.zeros(2, dtype=torch.long), [True, True], "turn_returns"
    )
    turns = [episode_turns(e) for e in scored]
    first = [per_token[i][t[0]["sample"]][t[0]["offset"]] for i, t in enumerate(turns)]
    assert first == pytest.approx([totals[0] - totals[1], totals[1] - totals[0]])
    assert [t["reward"] for t in turns[1]] == pytest.approx([paid[t["step"]] for t in turns[1]])


def _context(e):
    return RewardContext.from_trajectories(e.trajectories, lambda _: None)


def test_the_viewers_step_table_shows_what_each_step_earned(episodes, tmp_path):
    from tracerl.report.run import EpisodeRecord
    from tracerl.report.viewer import episode_page

    s = RewardSpec.from_yaml(
        "components:\n"
        "  - {name: done, fn: answered, layer: outcome, weight: 1.0}\n"
        "  - {name: errors, fn: call_errors, layer: process, weight: 0.1, per: step}\n"
    )
    e = score_episode(dataclasses.replace(episodes[1]), lambda e: compose(s, _context(e)))
    record = EpisodeRecord(e.trajectories, "train", "train", "train", 0, tmp_path)
    html = episode_page(record)
    assert "<th>step reward</th>" in html.replace(' class="num"', "")
    assert "-0.10 (errors -0.10)" in html and "0.00 (errors +0.00)" in html
    assert "per step (" in html
    # without per-step components, the table is as it always was
    plain = score_episode(dataclasses.replace(episodes[0]), lambda e: 1.0)
    html = episode_page(EpisodeRecord(plain.trajectories, "train", "train", "train", 0, tmp_path))
    assert "step reward" not in html


def test_a_run_with_a_per_step_component_says_so_on_its_dashboard(tmp_path):
    import json

    from typer.testing import CliRunner

    from tracerl.cli import app

    config = tmp_path / "run.yaml"
    config.write_text(
        "name: steps\n"
        "model: {spec: tiny-chars, temperature: 1.0}\n"
        "env: {name: arithmetic, parser: json_list, tasks_per_step: 2, eval_tasks: 2}\n"
        "trainer:\n"
        "  steps: 1\n"
        "  group_size: 4\n"
        "  credit: turn_returns\n"
        "  reward_components:\n"
        "    - {name: digit, fn: digit, layer: outcome, weight: 1.0}\n"
        "    - {name: errors, fn: call_errors, layer: process, weight: 0.1, per: step}\n"
        "rollout: {budgets: {steps: 1}, max_turn_tokens: 2, reserve: null}\n"
    )
    out = CliRunner().invoke(app, ["train", str(config), f"out_dir={tmp_path}"])
    assert out.exit_code == 0, out.output
    run = tmp_path / "steps"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert "train/reward/errors" in next(r for r in rows if r["phase"] == "train")
    html = (run / "report" / "index.html").read_text()
    assert "process, per step" in html and "per turn: turn_returns" in html


def test_the_attribution_label_names_the_rollouts_owner_not_the_episodes():
    """A component that crashes after the label makes the episode the evaluator's; the label
    said whose the rollout was (``rollout_attribution``), never "attribution: policy" beside
    an episode that is the evaluator's."""

    def broken(c: RewardContext) -> Score:
        raise ZeroDivisionError("verifier bug")

    s = RewardSpec.from_yaml(
        "components:\n"
        "  - {name: attribution, fn: attribution_label, layer: attribution, weight: 0.0}\n"
        "  - {name: em, fn: exact_match, layer: outcome, weight: 1.0}\n"
    )
    from tracerl.rewards.compose import COMPONENTS

    out = compose(s, ctx(), {**COMPONENTS, "exact_match": broken})  # a bug in its verifier
    assert out.attribution is Attribution.EVALUATOR and out.error
    label = out.components[0].evidence
    assert label["rollout_attribution"] == "policy" and "attribution" not in label
