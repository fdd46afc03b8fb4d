"""The dashboard, the trajectory viewer, triage and the metrics sinks, on a real (scripted)
run directory: what a user opening the report or typing the commands would see."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.report_run import EXPECTED, MEMBERS
from tracerl.cli import app
from tracerl.jsonl import read_trajectories, write_trajectories
from tracerl.report.html import CURVES, GAP_CURVE, write_report
from tracerl.report.run import iter_episodes
from tracerl.report.triage import classify, triage
from tracerl.rollout.groups import episode_member
from tracerl.types import RewardBreakdown, Trajectory


@pytest.fixture(scope="module")
def run(scripted_run) -> Path:
    return scripted_run


@pytest.fixture(scope="module")
def report(run) -> Path:
    return write_report(run)


def _pages(report: Path) -> list[Path]:
    return [report, *sorted((report.parent / "episodes").glob("*.html"))]


def test_training_episodes_carry_their_reward_breakdown(run):
    train = [e for e in iter_episodes(run) if e.phase == "train"]
    assert len(train) == 2 * 2 * MEMBERS
    assert all(t.reward and t.reward["components"] for e in train for t in e.trajectories)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in rows if r["phase"] == "train")
    # g2 never answers (the format constraint fails); g4's env is down: not a violation,
    # and not counted among the policy's episodes
    assert step["train/constraint_violation_rate"] == pytest.approx(1 / (MEMBERS - 1))
    assert step["train/ineligible_episodes"] == 2.0  # the two g4 episodes, environment's
    # each task's five plans score differently: every group has something to teach
    assert step["train/zero_signal_groups"] == 0.0
    assert step["attribution/episodes_environment"] == pytest.approx(1 / MEMBERS)
    assert step["cost/tool_latency_ms_mean"] > 0 and step["rollout/latency_p95_s"] > 0


def test_the_dashboard_has_four_separate_curves_with_data(report):
    html = report.read_text()
    figures = re.findall(r'<figure class="curve" data-curve="([^"]+)">(.*?)</figure>', html, re.S)
    # the scripted run's learner had the sampler's log-probs: the gap chart follows the four
    assert [name for name, _ in figures] == [*CURVES, GAP_CURVE]
    for name, body in figures:
        assert body.count("<svg") == 1, name
        assert "<circle" in body, f"{name} has no data points"
    held_out = dict(figures)["heldout-success"]
    rows = [json.loads(x) for x in (report.parents[1] / "metrics.jsonl").read_text().splitlines()]
    kinds = {k.split("/")[2] for r in rows for k in r if k.startswith("eval/adversarial/")}
    kinds &= {"conflict", "dead_link", "look_alike", "timeout"}
    assert kinds, "the scripted run evaluates adversarial traps"
    for name in ["heldout", "adversarial", *(f"adversarial: {k}" for k in kinds)]:
        series = re.search(rf'<g class="series" data-series="{name}">(.*?)</g>', held_out)
        assert series and "<circle" in series.group(1), name
    assert "tool latency per episode" in dict(figures)["tool-cost"]


def test_the_dashboard_shows_attribution_stops_components_and_facts(report):
    html = report.read_text()
    for heading in (
        "Whose fault: attribution",
        "How episodes ended",
        "Reward components",
        "premature_stop_rate",
        "unfinished_after_budget",
        "invalid citation rate",
        "P95 episode latency",
        "episodes left out of the gradient",
        "groups with no signal",
        "Run facts",
        "grpo, one per episode",  # the estimator that trained it
    ):
        assert heading in html, heading
    row = re.search(r"<td>environment</td><td class=num>([\d.]+)%", html)
    assert row and float(row.group(1)) == pytest.approx(100 / MEMBERS)


def test_every_link_resolves_and_every_failure_kind_is_linked(report):
    html = report.read_text()
    links = set(re.findall(r'href="(episodes/[^"]+)"', html))
    assert links and all((report.parent / link).is_file() for link in links)
    for label in ("best training", "worst training", "policy: format", "environment:"):
        assert label in html, label


def test_model_and_tool_text_is_escaped_and_cannot_run(report):
    pages = _pages(report)
    injected = 0
    for page in pages:
        text = page.read_text()
        assert "window.__pwned=1</script>" not in text, page.name
        assert "<img src=x" not in text, page.name
        assert text.count("<script>") == 1, page.name  # ours, allowed by the CSP's hash
        injected += "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in text
    assert injected, "no page shows the injected answer (escaped)"


def test_triage_names_each_failure_and_its_owner(run):
    episodes = list(iter_episodes(run))
    verdicts = {e.episode_id: classify(e) for e in episodes if e.phase == "train"}
    kinds = Counter()
    for eid, v in verdicts.items():
        g = episode_member(eid)
        bucket, kind = EXPECTED[g]
        assert v.bucket == bucket, (eid, v)
        if g == 3:  # searched the subject: the answer was in view unless it needed a 2nd hop
            assert v.kind in ("ignored_evidence", "answered_without_evidence"), (eid, v)
        else:
            assert v.kind == kind, (eid, v)
        kinds[v.kind] += 1
    assert kinds["ignored_evidence"] >= 1
    last = triage(episodes, n=MEMBERS)
    assert len(last.verdicts) == MEMBERS  # the last N training episodes only
    assert set(last.counts()) <= {"succeeded", "policy", "environment", "evaluator"}


def test_the_cli_triages_shows_and_reports(run, tmp_path):
    cli = CliRunner()
    out = cli.invoke(app, ["triage", str(run), "--n", "100"])
    assert out.exit_code == 0, out.output
    assert "20 episodes" in out.output
    for word in ("succeeded", "answered_without_evidence", "format", "server_error"):
        assert word in out.output, word
    eid = next(e.episode_id for e in iter_episodes(run) if e.episode_id.endswith("t0:g1"))
    shown = cli.invoke(app, ["show", str(run), eid])
    assert shown.exit_code == 0, shown.output
    for word in (
        "reward breakdown",
        "steps",
        "answered_without_evidence",
        "tokens by author",
        "<script>",
    ):
        assert word in shown.output, word
    held_out = next(e for e in iter_episodes(run) if e.phase == "eval")
    replayed = cli.invoke(app, ["replay", str(run), "--episode", held_out.receipt["replay_id"]])
    assert replayed.exit_code == 0 and "replayed exactly" in replayed.output  # not only train
    missing = cli.invoke(app, ["show", str(run), "no-such-episode"])
    assert missing.exit_code == 2 and "no episode 'no-such-episode'" in missing.output
    bad = cli.invoke(app, ["report", str(tmp_path / "nowhere")])
    assert bad.exit_code == 2 and "no such directory" in bad.output
    copied = tmp_path / "copied"
    shutil.copytree(run, copied)  # a run copied from another machine
    ok = cli.invoke(app, ["report", str(copied)])
    assert ok.exit_code == 0 and "report/index.html" in ok.output


def test_a_run_still_being_written_still_reports(run, tmp_path):
    live = tmp_path / "live"
    shutil.copytree(run, live)
    shutil.rmtree(live / "report", ignore_errors=True)
    with open(live / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "phase": "tr')  # a line being written
    step_file = live / "episodes" / "step_1.jsonl.gz"
    member = gzip.compress(b'{"schema": "tracerl.trajectory/1", "segm')
    with open(step_file, "ab") as f:
        f.write(member[: len(member) // 2])  # an episode being written
    before = step_file.read_bytes()
    index = write_report(live)
    assert index.is_file() and all(f'data-curve="{c}"' in index.read_text() for c in CURVES)
    assert step_file.read_bytes() == before  # the reader never cuts a file it reads


def test_metrics_sinks_tensorboard_and_offline_wandb(tmp_path, monkeypatch):
    from tracerl.report.sinks import MetricsLog

    pytest.importorskip("tensorboard")
    monkeypatch.setenv("WANDB_SILENT", "true")
    log = MetricsLog.open(tmp_path, ["jsonl", "tensorboard"], name="t")
    for step in range(3):
        log.log({"step": step, "phase": "train", "train/reward_mean": step / 2, "note": "x"})
    log.close()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["train/reward_mean"] for r in rows] == [0.0, 0.5, 1.0]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    events = acc.Scalars("train/reward_mean")
    assert [(e.step, e.value) for e in events] == [(0, 0.0), (1, 0.5), (2, 1.0)]
    with pytest.raises(ValueError, match="unknown sink 'mlflow'"):
        MetricsLog.open(tmp_path, ["mlflow"])


def test_offline_wandb_sink_writes_a_local_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from tracerl.report.sinks import MetricsLog

    for key in ("WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(key, raising=False)
    log = MetricsLog.open(tmp_path, ["wandb"], name="offline-test", config={"lr": 1e-5})
    log.log({"step": 0, "phase": "eval", "eval/heldout/success_rate": 0.25})
    log.log({"step": 1, "phase": "train", "train/reward_mean": 0.5})
    log.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 2


def test_tracerl_train_ends_by_writing_the_report(tmp_path):
    args = ["configs/learn-arithmetic.yaml", f"out_dir={tmp_path}", "trainer.steps=2"]
    out = CliRunner().invoke(app, ["train", *args, "env.eval_tasks=4"])
    assert out.exit_code == 0, out.output
    index = tmp_path / "learn-arithmetic" / "report" / "index.html"
    assert f"report: {index}" in out.output and index.is_file()
    assert "heldout success: baseline" in out.output
    html = index.read_text()
    assert all(f'data-curve="{c}"' in html for c in CURVES)
    assert "finished: 2 of 2 RL steps" in html


def test_reports_of_unusual_run_directories(run, tmp_path):
    """Metrics only, episodes written before rewards were recorded, a crashed reward, and a
    directory written by `tracerl eval`: each reports without error, and says what it is."""
    metrics_only = tmp_path / "metrics-only"
    metrics_only.mkdir()
    shutil.copy(run / "metrics.jsonl", metrics_only / "metrics.jsonl")
    html = write_report(metrics_only).read_text()
    assert "No episodes written yet" in html and 'data-curve="tool-cost"' in html

    old = tmp_path / "old"
    shutil.copytree(run, old)
    for path in (old / "episodes").glob("*.jsonl.gz"):
        trajs = [t.to_dict() for t in read_trajectories(path)]
        crashed = RewardBreakdown.crashed("ZeroDivisionError: verifier bug").to_dict()
        for i, t in enumerate(trajs):  # half unscored (old runs), half with a crashed reward
            t["reward"] = None if i % 2 else crashed
        write_trajectories(path, [Trajectory.from_dict(t) for t in trajs])
    episodes = [e for e in iter_episodes(old) if e.phase == "train"]
    kinds = Counter(classify(e).kind for e in episodes)
    assert kinds["unscored"] and kinds["evaluator_crashed"]
    assert all(e.attribution == "evaluator" for e in episodes if e.reward is not None)
    assert "evaluator_crashed" in write_report(old).read_text()

    out = tmp_path / "eval"
    args = ["eval", "--model", "tiny-random", "--n", "2", "--out", str(out)]
    assert CliRunner().invoke(app, [*args, "--split", "heldout"]).exit_code == 0
    assert {e.phase for e in iter_episodes(out)} == {"eval"}
    html = write_report(out).read_text()
    assert "evaluation only" in html and "best held-out" in html and "best training" not in html


def test_a_crashed_reward_makes_the_episode_the_evaluators(run):
    from tracerl.rollout.episode import episode_from_trajectories, score_episode
    from tracerl.train.metrics import gradient_eligible, owner_metrics

    record = next(e for e in iter_episodes(run) if e.phase == "train" and e.succeeded)
    episode = episode_from_trajectories(record.trajectories)

    def broken(_):
        raise ZeroDivisionError("verifier bug")

    score_episode(episode, broken)
    assert episode.reward.error == "ZeroDivisionError: verifier bug" and not episode.reward.decided
    assert all(t.reward["attribution"] == "evaluator" for t in episode.trajectories)
    assert not gradient_eligible(episode)
    assert owner_metrics([episode])["attribution/episodes_evaluator"] == 1.0


def test_report_imports_only_types_and_the_run_directory_format():
    import ast

    root = Path(__file__).parents[2] / "src" / "tracerl" / "report"
    allowed = ("tracerl.types", "tracerl.jsonl", "tracerl.report", "tracerl.errors")
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tracerl"):
                assert node.module.startswith(allowed), f"{path.name} imports {node.module}"


def _figure(html: str, name: str) -> str | None:
    found = re.search(rf'<figure class="curve" data-curve="{name}">(.*?)</figure>', html, re.S)
    return found.group(1) if found else None


def test_the_sampler_learner_gap_is_charted_only_when_the_run_measured_it(run, report, tmp_path):
    gap = _figure(report.read_text(), GAP_CURVE)
    assert gap is not None and "Sampler–learner log-prob gap" in gap
    for series in ("mean", "max"):
        found = re.search(rf'<g class="series" data-series="{series}">(.*?)</g>', gap)
        assert found and "<circle" in found.group(1), series
    assert "dropped by the IS mask" not in gap  # the scripted run has no is_mask
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]

    def copy_with(name: str, edit) -> str:
        out = tmp_path / name
        shutil.copytree(run, out)
        shutil.rmtree(out / "report", ignore_errors=True)
        lines = [json.dumps(edit(dict(r))) for r in rows]
        (out / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        return write_report(out).read_text()

    def without_gap(r):
        return {k: v for k, v in r.items() if "logprob_gap" not in k}

    html = copy_with("no-gap", without_gap)
    assert _figure(html, GAP_CURVE) is None and "Sampler and learner" not in html

    def masked(r):
        return {**r, "train/is_masked_frac": 0.05} if r.get("phase") == "train" else r

    panel = _figure(copy_with("masked", masked), GAP_CURVE)
    assert panel and "dropped by the IS mask" in panel
    found = re.search(r'<g class="series" data-series="masked">(.*?)</g>', panel)
    assert found and "masked @ step 1: 5.0%" in found.group(1)
