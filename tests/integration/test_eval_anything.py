"""`tracerl eval` of anything a run leaves: ``model.spec=run:RUN@step`` straight from its
checkpoint, or its export under any name; greedy (``eval.temperature=0``) evaluations are
the same episodes every time, and the run and its export score identically; k samples per
task (``eval.samples_per_task``) are k distinct episodes, reported as mean@k and pass@k with
standard errors; a run trains on from another run's checkpoint."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tracerl.cli import app
from tracerl.config.loading import load_config
from tracerl.models import load
from tracerl.rollout.persist import read_step_file
from tracerl.train.loop import train

CONFIG = "configs/learn-arithmetic.yaml"
ARGS = [
    "trainer.steps=2",
    "trainer.group_size=4",
    "env.tasks_per_step=2",
    "env.eval_tasks=4",
    "trainer.checkpoint_every=1",
    "trainer.lr=1e-2",
    "rollout.max_turn_tokens=6",
]
EVAL = [CONFIG, "env.parser=null", "env.eval_tasks=6", "rollout.max_turn_tokens=6"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    cfg = load_config(CONFIG, [f"out_dir={tmp_path_factory.mktemp('evalany')}", *ARGS])
    train(cfg, log=lambda _: None)
    return cfg.run_dir


def _eval(out, *args):
    r = CliRunner().invoke(app, ["eval", *EVAL, *args, "--out", str(out)])
    assert r.exit_code == 0, r.output
    (row,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return r.stdout, row


def _episodes(out):
    """Each evaluation episode's sampled tokens, by episode id."""
    (path,) = sorted((out / "eval" / "episodes").glob("step_0.jsonl*"))
    return {
        t.receipt["episode_id"]: [i for s in t.segments for i in s.token_ids]
        for t in read_step_file(path)
    }


def test_a_run_and_its_export_named_anything_evaluate_alike_and_greedy_repeats(run, tmp_path):
    spec = f"run:{run}@1"
    said, greedy = _eval(tmp_path / "a", f"model.spec={spec}", "eval.temperature=0")
    assert "eval/heldout/success_rate" in said and " ± " in said  # with its standard error
    assert {"eval/heldout/success_rate_stderr", "eval/heldout/pass@1"} <= set(greedy)
    _, again = _eval(tmp_path / "b", f"model.spec={spec}", "--temperature", "0")
    assert _episodes(tmp_path / "a") == _episodes(tmp_path / "b")  # greedy: the same episodes
    assert again["eval/heldout/success_rate"] == greedy["eval/heldout/success_rate"]

    export = tmp_path / "my-policy-final"  # a name that says nothing of the model
    r = CliRunner().invoke(app, ["export", str(run), "--step", "1", "--out", str(export)])
    assert r.exit_code == 0, r.output
    _, exported = _eval(tmp_path / "c", f"model.spec=hf:{export}", "eval.temperature=0")
    assert _episodes(tmp_path / "c") == _episodes(tmp_path / "a")
    success = [k for k in greedy if "success" in k or "@" in k]
    assert {k: exported[k] for k in success} == {k: greedy[k] for k in success}
    # the model id names the checkpoint: the export records the one `run:` loads
    receipt = json.loads((export / "tracerl_export.json").read_text())
    assert receipt["model_id"] == load(spec).model_id and "+" in receipt["model_id"]

    # sampled at the training temperature (the default), the checkpoint's episodes differ
    _, sampled = _eval(tmp_path / "d", f"model.spec={spec}")
    assert _episodes(tmp_path / "d") != _episodes(tmp_path / "a")
    assert sampled["eval/heldout/episodes"] == 6


def test_k_samples_per_task_are_distinct_episodes_with_pass_and_mean_at_k(run, tmp_path):
    said, m = _eval(tmp_path / "k", f"model.spec=run:{run}", "eval.samples_per_task=3")
    assert m["eval/heldout/episodes"] == 18  # 6 tasks x 3
    for key in ("mean@3", "pass@3", "mean@3_stderr", "pass@3_stderr", "success_rate_stderr"):
        assert f"eval/heldout/{key}" in m, sorted(m)
    assert m["eval/heldout/pass@3"] >= m["eval/heldout/mean@3"]
    assert m["eval/heldout/mean@3"] == pytest.approx(m["eval/heldout/success_rate"])
    assert "eval/heldout/pass@3" in said
    episodes = _episodes(tmp_path / "k")
    assert len(episodes) == 18  # distinct ids: ...:g0, :g1, :g2 per task
    by_task: dict[str, list] = {}
    for eid, tokens in episodes.items():
        by_task.setdefault(eid.rsplit(":g", 1)[0], []).append(tokens)
    assert len(by_task) == 6 and all(len(v) == 3 for v in by_task.values())
    # each sample its own seed: a task's samples are not all one episode
    assert any(len({tuple(t) for t in v}) > 1 for v in by_task.values())


def test_a_checkpoint_that_is_not_there_is_two_lines_naming_those_that_are(run, tmp_path):
    for spec in (f"run:{run}@5", str(run / "checkpoints" / "step_5")):
        r = CliRunner().invoke(app, ["eval", *EVAL, f"model.spec={spec}", "--out", str(tmp_path)])
        assert r.exit_code == 2, r.output
        lines = [x for x in r.output.splitlines() if x.strip()]
        assert len(lines) == 2 and "Traceback" not in r.output, r.output
        assert lines[0].startswith("error: ") and "model.spec: " in lines[0]
        assert "checkpoints: 0, 1" in lines[1]
    assert not any(tmp_path.iterdir())


def test_a_run_trains_on_from_another_runs_checkpoint(run, tmp_path):
    spec = f"run:{run}@0"
    given = [f"out_dir={tmp_path}", "name=from-ckpt", f"model.spec={spec}", *ARGS]
    cfg = load_config(CONFIG, given)
    cfg = cfg.model_copy(
        update={"trainer": cfg.trainer.model_copy(update={"steps": 1, "checkpoint_every": 1})}
    )
    train(cfg, log=lambda _: None)
    # its baseline is the checkpoint's: the very episodes `tracerl eval` of it plays
    _eval(tmp_path / "of-checkpoint", f"model.spec={spec}", "env.eval_tasks=4")
    assert _episodes(cfg.run_dir) == _episodes(tmp_path / "of-checkpoint")
    _eval(tmp_path / "of-base", "model.spec=tiny-chars", "env.eval_tasks=4")
    assert _episodes(cfg.run_dir) != _episodes(tmp_path / "of-base")
    # and its own checkpoints load through the one it started from
    assert load(f"run:{cfg.run_dir}").model_id.startswith(load(spec).model_id + "+")
