"""A model judge in a real run, as a user sets it up.

1. `tracerl train` with a judge (group-relative) as the outcome, asked over HTTP (the scripted
   judge server): the run's metrics carry what the judge cost; `tracerl review --from-judge`
   queues judged answers, a person decides three, and `tracerl report` shows the judge's
   agreement with them (accuracy, Cohen's kappa, counts) per rubric version.
2. SmolLM2 itself as the judge, served by `tracerl serve` (chat completions): the plumbing
   holds end to end (quality is not asserted: a 135M model rarely writes a strict verdict;
   what it replies is either a verdict or the evaluator's failure, never a 0).
"""

from __future__ import annotations

import asyncio
import json
import re

import pytest
import yaml

from tests.judge_server import ScriptedJudgeServer
from tests.serve import tracerl_serve
from tracerl.envs import get_parser, make
from tracerl.envs.search import tasks as task_sets
from tracerl.rewards.judge.component import task_text
from tracerl.rewards.resolve import resolve_reward
from tracerl.rewards.review import ReviewPool
from tracerl.rollout import ScriptedSampler
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.runner import Policy, run_episode
from tracerl.types import Attribution

RUBRIC = {
    "name": "sum_digit",
    "version": "1",
    "instructions": "The task is a sum; the answer must be the last digit of the sum.",
}


def _cli(*args: str) -> str:
    from typer.testing import CliRunner

    from tracerl.cli import app

    out = CliRunner().invoke(app, list(args))
    assert out.exit_code == 0, out.output
    return out.output


def test_a_judged_run_shows_what_the_judge_cost_and_how_it_agrees_with_people(tmp_path):
    tasks = make("arithmetic").sample_tasks(100, seed=0)
    server = ScriptedJudgeServer({task_text(t): t["answers"][0] for t in tasks})
    try:
        config = {
            "name": "judged",
            "model": {"spec": "tiny-chars", "temperature": 1.0},
            "env": {
                "name": "arithmetic",
                "parser": "json_list",
                "tasks_per_step": 2,
                "eval_tasks": 4,
            },
            "trainer": {
                "steps": 2,
                "group_size": 4,
                "lr": 1.0e-3,
                "reward_components": [
                    {"name": "attribution", "fn": "attribution_label", "layer": "attribution"},
                    {
                        "name": "judged",
                        "fn": "judge",
                        "layer": "outcome",
                        "params": {
                            "rubric": RUBRIC,
                            "base_url": server.base_url,
                            "model": "scripted-judge",
                            "mode": "group",
                            "cache": str(tmp_path / "verdicts"),
                        },
                    },
                ],
            },
            # long enough for the random model to end some replies (an answer to judge)
            "rollout": {"budgets": {"steps": 1}, "max_turn_tokens": 64, "reserve": None},
        }
        path = tmp_path / "judged.yaml"
        path.write_text(yaml.safe_dump(config))
        _cli("train", str(path), f"out_dir={tmp_path}")
    finally:
        server.close()
    run = tmp_path / "judged"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r.get("phase") == "train"]
    assert len(train) == 2
    # a group is judged in one request (its members that answered, ranked together)
    groups = 2
    for r in train:
        assert 0 < r["train/judge_requests_mean"] <= groups / 8
        assert r["train/judge_tokens_mean"] == pytest.approx(110 * r["train/judge_requests_mean"])
        assert r["train/judge_failure_rate"] == 0.0
    assert all(
        len(json.loads(r["messages"][1]["content"].splitlines()[-1][9:])) >= 1
        for r in server.requests
    )

    out = _cli("review", str(run), "--from-judge", "3")
    assert "queued 3 of" in out
    ids = [int(i) for i in re.findall(r"^\[(\d+)\]", out, re.M)]
    assert len(ids) == 3
    # what the scripted judge said of each (its rule: 10 for the gold, 6 for a reply that
    # mentions it, else 1; "correct" from 5 up); a person agrees twice and disagrees once
    pool = {x.id: x for x in ReviewPool(run / "review.sqlite").samples()}
    judge_says = [ScriptedJudgeServer.score(pool[i].golds[0], pool[i].answer) >= 5 for i in ids]
    person_says = [judge_says[0], judge_says[1], not judge_says[2]]
    for sample, correct in zip(ids, person_says, strict=True):
        verdict = "--correct" if correct else "--wrong"
        _cli("review", str(run), "--decide", str(sample), verdict, "--reviewer", "ada")
    _cli("report", str(run))
    html = (run / "report" / "index.html").read_text()
    assert "<h2>Judges</h2>" in html and "judge tokens per episode" in html
    judges = html[html.index("Agreement with people") :]
    row = re.search(r"<td>sum_digit</td><td>1</td><td>scripted-judge</td>(.*?)</tr>", judges)
    assert row, judges[:3000]
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1))
    pairs = list(zip(judge_says, person_says, strict=True))
    counts = [
        sum(j and p for j, p in pairs),
        sum(not j and not p for j, p in pairs),
        sum(j and not p for j, p in pairs),
        sum(p and not j for j, p in pairs),
    ]
    j_yes, p_yes = sum(judge_says) / 3, sum(person_says) / 3
    chance = j_yes * p_yes + (1 - j_yes) * (1 - p_yes)
    kappa = "–" if chance >= 1 else f"{(2 / 3 - chance) / (1 - chance):.3f}"
    assert cells == ["3", "66.7%", kappa, *map(str, counts)]


@pytest.mark.slow
def test_smollm2_judges_through_tracerl_serve(tmp_path, tiny):
    env = make("search", corpus="synthetic")
    task = next(q for q in task_sets.split("synthetic", "train") if q["hops"] == 2)
    p = get_parser("json_list")
    cfg = RolloutConfig(budgets=Budgets(steps=4, tool_calls=4), reserve=None)

    def episode(answer):
        text = p.format_calls([("answer", {"text": answer, "citations": []})])
        policy = Policy(ScriptedSampler.from_texts(tiny.renderer, [text]), tiny.renderer, p, "t")
        return asyncio.run(run_episode(make("search", corpus="synthetic"), task, policy, cfg))

    with tracerl_serve("smollm2-135m-instruct", "--temperature", "0") as url:  # greedy
        params = {
            "rubric": {
                "name": "correct",
                "instructions": "Score from 0 to 10 how well ANSWER answers TASK.",
            },
            "base_url": f"{url}/v1",
            "model": "smollm2-135m-instruct",
            "max_tokens": 32,
            # a request takes ~2 s on idle cores and 30 s on loaded ones; a timeout would be
            # a JudgeUnavailable, not the verdict or VerdictError asserted: only a hang's bound
            "timeout_s": 900,
            "retries": 0,
            "cache": str(tmp_path / "verdicts"),
        }
        reward = resolve_reward(
            None,
            [{"name": "judged", "fn": "judge", "layer": "outcome", "params": params}],
            env,
            env_name="search",
        )
        scored = [reward(episode(a)) for a in (task["answers"][0], "I do not know")]
        again = reward(episode(task["answers"][0]))
    for r in scored:
        e = r.component("judged").evidence
        if r.decided:  # SmolLM2 wrote a strict verdict
            assert 0.0 <= r.total <= 1.0 and e["prompt_tokens"] > 100 and not e["cached"]
        else:  # it answered, with something that is not a verdict: the evaluator's
            assert r.attribution is Attribution.EVALUATOR and "VerdictError" in r.error
            assert e["tokens"] > 100
    # a verdict it gave is cached; a failure is asked again, never cached
    first = scored[0]
    if first.decided:
        assert again.component("judged").evidence["cached"] is True
