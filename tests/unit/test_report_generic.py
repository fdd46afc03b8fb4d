"""The report, `tracerl show` and `tracerl triage` on a run of an environment of one's own: a
unit-conversion environment with one tool (``convert``), tasks without ``question`` or
``answers``, and its own reward (``format`` as a gating constraint, then ``within_tolerance``
as the outcome, 1% tolerance). What a user of such an environment would read: its reward's
components, its task's text, never the search environment's words (citations, evidence),
and ids that can be copied whatever the terminal's width."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

from tracerl.cli import app
from tracerl.jsonl import write_trajectories
from tracerl.report.html import write_report
from tracerl.report.run import RunData, find_episode, iter_episodes
from tracerl.report.terminal import print_episode, print_evals, print_triage
from tracerl.report.triage import POLICY_KINDS, classify, triage
from tracerl.report.viewer import episode_page
from tracerl.types import Attribution, Layer, RewardBreakdown, RewardComponent, Segment, Trajectory

QUESTION = "Convert 12 m to centimetres. Answer with a number."
# long ids, as a user's own task naming makes them: longer than a 60-column terminal
PREFIX = "unit-conversion/train/length-metres-to-centimetres-0000012:s0:t0"


def _reward(outcome: float | None, fmt: float = 1.0, answer: str = "1200") -> dict[str, Any]:
    """``format`` (constraint, gate 1.0), then ``within_tolerance`` (outcome): behind a
    failed format it is gated, as `compose` records it."""
    comps = [
        RewardComponent(
            "format",
            Layer.CONSTRAINT,
            fmt,
            0.0,
            0.0,
            {"answer": answer} if fmt >= 1.0 else {"answer": answer, "reason": "not a number"},
        )
    ]
    if fmt < 1.0:
        comps.append(RewardComponent("within_tolerance", Layer.OUTCOME, 0.0, 1.0, 0.0, gated=True))
    else:
        value = float(outcome or 0.0)
        evidence = {"answer": answer, "expected": 1200, "tolerance": 0.01, "unit": "cm"}
        comps.append(
            RewardComponent("within_tolerance", Layer.OUTCOME, value, 1.0, value, evidence)
        )
    total = sum(c.contribution for c in comps)
    return RewardBreakdown(tuple(comps), total, Attribution.POLICY, True).to_dict()


def _episode(eid: str, answer: str, reward: dict[str, Any], step: int = 0) -> Trajectory:
    call = {"name": "convert", "arguments": {"value": 12, "from": "m", "to": "cm"}}
    segments = (
        Segment("prompt", (1, 2, 3), text=QUESTION),
        Segment("template", (4,), text="<assistant>"),
        Segment("policy", (5, 6), (-0.1, -0.2), step=1, text=json.dumps(call)),
        Segment("environment", (7, 8), step=1, text="12 m = 1200 cm"),
        Segment("policy", (9,), (-0.3,), step=2, text=f"<answer>{answer}</answer>"),
    )
    steps = (
        {
            "step": 1,
            "action": {"kind": "tool", "tool_calls": [call]},
            "calls": [
                {"action": {"tool": "convert"}, "observation": {"status": "ok", "chars": 14}}
            ],
            "latency_ms": 2.0,
        },
        {"step": 2, "action": {"kind": "final", "answer": answer}, "latency_ms": 0.0},
    )
    receipt = {
        "replay_id": "ro_" + "0123456789abcdef" * 4 + eid[-2:],
        "episode_id": eid,
        "env": {"name": "unit_conversion", "version": "1.0"},
        "task_id": "length-12",
        "task": {"id": "length-12", "value": 12, "from": "m", "to": "cm", "split": "train"},
        "reset_messages": [
            {"role": "system", "content": "You convert units with the convert tool."},
            {"role": "user", "content": QUESTION},
        ],
        "model_id": "tiny-random",
        "stop_reason": "answered",
        "attribution": "policy",
        "gradient_eligible": True,
        "seed": step,
        "started_at": "2025-01-01T00:00:00Z",
        "wall_time_s": 0.5,
    }
    return Trajectory(segments, steps, receipt, reward, eid, 0)


# member -> (answer, reward, expected verdict kind)
MEMBERS = {
    0: ("1200", _reward(1.0), "succeeded"),
    1: ("12", _reward(0.0, answer="12"), "wrong_answer"),
    2: ("twelve hundred", _reward(None, fmt=0.0, answer="twelve hundred"), "constraint_violated"),
}


@pytest.fixture(scope="module")
def custom_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("custom") / "unit-conversion-run-with-a-rather-long-name"
    (run / "episodes").mkdir(parents=True)
    config = {"name": "unit", "env": {"name": "unit_conversion"}, "trainer": {"steps": 1}}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    write_trajectories(
        run / "episodes" / "step_0.jsonl.gz",
        [_episode(f"{PREFIX}:g{g}", a, r) for g, (a, r, _) in MEMBERS.items()],
    )
    write_trajectories(
        run / "eval" / "episodes" / "step_1.jsonl.gz",
        [_episode(f"{PREFIX}:eval:g{g}", a, r, 1) for g, (a, r, _) in MEMBERS.items()],
    )
    common = {
        "cost/tool_calls_mean": 1.0,
        "cost/tool_latency_ms_mean": 2.0,
        "rollout/latency_p95_s": 0.5,
        "attribution/episodes_policy": 1.0,
    }
    train = {
        "step": 0,
        "phase": "train",
        "train/reward_mean": 1 / 3,
        "train/success_rate": 1 / 3,
        "train/reward/format": 2 / 3,
        "train/reward/within_tolerance": 0.5,
        "train/constraint_violation_rate": 1 / 3,
        "train/constraint/format": 1 / 3,
        "train/evaluator_error_rate": 0.0,
        "time/step_s": 1.0,
        **common,
    }
    evals = [
        {
            "step": step,
            "phase": "eval",
            "stage": stage,
            "eval/heldout/success_rate": rate,
            "eval/heldout/reward_mean": rate,
            "eval/heldout/reward/within_tolerance": rate,
            "eval/heldout/searches_mean": 0.0,  # every evaluation writes it
            "eval/heldout/constraint_violation_rate": 1 / 3,
            **{f"eval/heldout/{k}": v for k, v in common.items()},
        }
        for step, stage, rate in ((0, "baseline", 0.0), (1, "train", 1 / 3))
    ]
    rows = [evals[0], train, evals[1]]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def _train(run: Path) -> dict[int, Any]:
    return {int(e.episode_id[-1]): e for e in iter_episodes(run) if e.phase == "train"}


def test_triage_describes_failures_with_the_runs_own_reward_components(custom_run):
    episodes = _train(custom_run)
    verdicts = {g: classify(e) for g, e in episodes.items()}
    assert {g: v.kind for g, v in verdicts.items()} == {g: m[2] for g, m in MEMBERS.items()}
    assert verdicts[1].bucket == verdicts[2].bucket == "policy"
    wrong = verdicts[1].why
    assert "within_tolerance 0.000" in wrong and "answer='12'" in wrong, wrong
    assert "expected=1200" in wrong, wrong
    violated = verdicts[2].why
    assert violated.startswith("constraint format 0.000") and "not a number" in violated
    for v in verdicts.values():  # never the search environment's words
        assert "evidence" not in v.why and "observation held" not in v.why, v
    assert "constraint_violated" in POLICY_KINDS


def test_triage_keeps_evidence_kinds_where_gold_answers_exist(custom_run):
    """The search reward's exact match records ``golds``: the evidence kinds still apply;
    so do a task's ``answers`` when the failed component recorded none."""
    ep = _train(custom_run)[1]
    em = {"name": "em", "layer": "outcome", "value": 0.0, "weight": 1.0, "contribution": 0.0}
    em["evidence"] = {"answer": "12", "golds": ["120 cm"]}
    for t in ep.trajectories:
        t.reward["components"][1] = em
    ep.__dict__.pop("reward", None)  # the cached breakdown
    assert classify(ep).kind == "answered_without_evidence"  # no observation held '120 cm'
    em["evidence"] = {"answer": "12", "golds": ["1200"]}
    ep.__dict__.pop("reward", None)
    assert classify(ep).kind == "ignored_evidence"  # "12 m = 1200 cm" did
    em["evidence"] = {}
    ep.receipt["task"]["answers"] = ["1200"]
    ep.__dict__.pop("reward", None)
    assert classify(ep).kind == "ignored_evidence"


def _lines(text: str) -> list[str]:
    return text.splitlines()


@pytest.mark.parametrize("width", [60, 80])
def test_ids_to_copy_are_never_cut_or_wrapped(custom_run, width):
    ids = [e.episode_id for e in iter_episodes(custom_run)]
    assert min(map(len, ids)) > 60
    console = Console(width=width, record=True)
    print_triage(triage(list(iter_episodes(custom_run))), console)
    text = console.export_text()
    for eid in _train(custom_run).values():  # one example of each kind: all three
        assert any(eid.episode_id in line for line in _lines(text)), (eid.episode_id, text)
    for kind in ("succeeded", "wrong_answer", "constraint_violated"):
        assert any(kind in line and PREFIX in line for line in _lines(text)), (kind, text)

    console = Console(width=width, record=True)
    print_triage(triage(list(iter_episodes(custom_run))), console, run=custom_run)
    text = console.export_text()
    assert f"tracerl show {custom_run} {PREFIX}:g1" in text, text

    for ep in iter_episodes(custom_run):
        console = Console(width=width, record=True)
        print_episode(ep, console)
        lines = _lines(console.export_text())
        assert any(ep.episode_id in line for line in lines), ep.episode_id
        assert any(ep.receipt["replay_id"] in line for line in lines)

    console = Console(width=width, record=True)
    print_evals(custom_run, console)
    assert any(str(custom_run) in line for line in _lines(console.export_text()))


def test_the_cli_triage_output_holds_whole_ids(custom_run):
    out = CliRunner().invoke(app, ["triage", str(custom_run)])
    assert out.exit_code == 0, out.output
    for g in MEMBERS:
        assert any(f"{PREFIX}:g{g}" in line for line in out.output.splitlines()), out.output
    assert "constraint_violated" in out.output and "wrong_answer" in out.output


def test_show_and_the_episode_page_show_the_same_question(custom_run):
    eid = f"{PREFIX}:g1"
    shown = CliRunner().invoke(app, ["show", str(custom_run), eid])
    assert shown.exit_code == 0, shown.output
    question = re.search(r"^question\s+(.*)$", shown.output, re.M)
    assert question and question.group(1).strip() == QUESTION, shown.output
    assert "gold answers" not in shown.output  # the task has none: no empty row
    for word in ("within_tolerance", "format", "wrong_answer", "expected=1200"):
        assert word in shown.output, word
    assert "citation" not in shown.output.lower()
    html = episode_page(find_episode(custom_run, eid))
    assert f"<td>question</td><td>{QUESTION}</td>" in html
    assert "gold answers" not in html

    ep = find_episode(custom_run, eid)  # a task that names its text, or its answers
    ep.receipt["task"].update(prompt="How many cm in 12 m?", answers=[1200])
    console = Console(width=100, record=True)
    print_episode(ep, console)
    text = console.export_text()
    assert re.search(r"^question\s+How many cm in 12 m\?\s*$", text, re.M), text
    assert re.search(r"^gold answers\s+1200\s*$", text, re.M), text
    html = episode_page(ep)
    assert "<td>question</td><td>How many cm in 12 m?</td>" in html
    assert "<td>gold answers</td><td>1200</td>" in html


def test_the_dashboard_shows_the_runs_own_components_and_no_citations(custom_run):
    html = write_report(custom_run).read_text()
    components = re.search(r"<h2>Reward components</h2>(.*?)<h2>", html, re.S)
    assert components
    for name in ("within_tolerance", "format"):
        assert f"<td>{name}</td>" in components.group(1), name
    assert "citation" not in html.lower()  # no row, no heading, no curve
    assert "P95 episode latency" in html and "Latency, eligibility" in html
    assert "policy: constraint_violated" in html and "policy: wrong_answer" in html
    for g in MEMBERS:  # the triage table links whole ids
        assert f">{PREFIX}:g{g}</a>" in html
    data = RunData.load(custom_run)
    assert {e.episode_id for e in data.episodes if e.phase == "eval"} == {
        f"{PREFIX}:eval:g{g}" for g in MEMBERS
    }


def test_an_episode_the_environment_ended_is_judged_by_its_reward(custom_run):
    """A task that reaches its end through a tool (``env_terminated``), as a code-repair
    environment's does: a gate that closed is named, never "no answer in the expected form"
    nor the search environment's evidence."""
    ep = _train(custom_run)[1]
    ep.receipt["stop_reason"] = "env_terminated"
    ep.receipt["task"]["answers"] = ["1200"]  # even with gold answers: there was no answer
    edits = RewardComponent(
        "no_forbidden_edits", Layer.CONSTRAINT, 0.0, 0.0, 0.0, {"paths": ["tests/test_x.py"]}
    )
    tests = RewardComponent("hidden_tests", Layer.OUTCOME, 0.0, 1.0, 0.0, gated=True)
    for t in ep.trajectories:
        t.reward.update(RewardBreakdown((edits, tests), 0.0, Attribution.POLICY, True).to_dict())
    ep.__dict__.pop("reward", None)
    v = classify(ep)
    assert (v.kind, v.why) == (
        "constraint_violated",
        'constraint no_forbidden_edits 0.000 (paths=["tests/test_x.py"])',
    )
    valid = RewardComponent("valid_patch", Layer.PROCESS, 0.0, 0.1, 0.0, {"error": "x" * 200})
    for t in ep.trajectories:
        t.reward.update(RewardBreakdown((valid, tests), 0.0, Attribution.POLICY, True).to_dict())
    ep.__dict__.pop("reward", None)
    v = classify(ep)
    assert v.kind == "wrong_answer" and v.why.startswith("valid_patch 0.000 (error='xxx")
    assert v.why.endswith("...') closed the gate") and len(v.why) < 100, v.why
