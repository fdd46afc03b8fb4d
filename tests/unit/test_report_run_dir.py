"""What counts as a run directory (`tracerl.report.run.check_run_dir`): every layout tracerl
writes is read (a training run, an `eval --out` folder with or without a config, a run with
only evaluations, a run copied elsewhere); a folder that holds runs is refused in two lines
naming them, and no episode outside a run's own folders is counted as its own."""

from __future__ import annotations

import json
import shutil

import pytest

from tracerl.report.run import RunDirError, check_run_dir, iter_episodes
from tracerl.rollout.persist import EpisodeWriter
from tracerl.types import Segment, Source, Trajectory


def _write(folder, step, *ids):
    EpisodeWriter(folder, step=step).append(
        [
            Trajectory(
                segments=(Segment(Source.PROMPT, (1, 2)), Segment(Source.POLICY, (3,), (-0.1,))),
                episode_id=i,
            )
            for i in ids
        ]
    )


def _training_run(run):
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("name: x\n")
    (run / "metrics.jsonl").write_text(json.dumps({"step": 0, "phase": "train"}) + "\n")
    _write(run, 0, "t0", "t1")
    _write(run / "eval", 0, "e0")
    _write(run / "eval" / "warm_start", 0, "w0")
    _write(run / "eval" / "adversarial", 0, "a0")
    _write(run / "warm_start", 0, "r0")
    return run


def _phases(run):
    return sorted((e.episode_id, e.phase) for e in iter_episodes(check_run_dir(run)))


def test_every_layout_tracerl_writes_is_a_run(tmp_path):
    run = _training_run(tmp_path / "runs" / "train")
    assert _phases(run) == [
        ("a0", "eval"),
        ("e0", "eval"),
        ("r0", "warm_start"),
        ("t0", "train"),
        ("t1", "train"),
        ("w0", "eval"),
    ]
    copied = tmp_path / "elsewhere" / "copy"
    shutil.copytree(run, copied)
    assert _phases(copied) == _phases(run)

    # `tracerl eval --out DIR` without a config: metrics rows per split, DIR/episodes/
    search = tmp_path / "search-eval"
    _write(search, 0, "q0")
    (search / "metrics.jsonl").write_text(json.dumps({"step": 0, "split": "heldout"}) + "\n")
    assert _phases(search) == [("q0", "eval")]

    # `tracerl eval CONFIG --out DIR`: DIR/eval/episodes/
    config_eval = tmp_path / "config-eval"
    _write(config_eval / "eval", 0, "c0")
    (config_eval / "metrics.jsonl").write_text(
        json.dumps({"step": 0, "phase": "eval", "stage": "baseline"}) + "\n"
    )
    assert _phases(config_eval) == [("c0", "eval")]

    # stopped after its first evaluation, before metrics.jsonl was written
    evals_only = tmp_path / "evals-only"
    _write(evals_only / "eval", 0, "b0")
    assert _phases(evals_only) == [("b0", "eval")]

    # `tracerl demo` and `tracerl gateway`: episodes/ alone
    demo = tmp_path / "demo"
    _write(demo, 0, "d0")
    assert _phases(demo) == [("d0", "train")]


def test_a_folder_of_runs_is_refused_naming_the_runs_in_it(tmp_path):
    runs = tmp_path / "runs"
    _training_run(runs / "a")
    evaluated = runs / "b-eval"
    _write(evaluated, 0, "q0")
    (evaluated / "metrics.jsonl").write_text(json.dumps({"step": 0, "split": "heldout"}) + "\n")
    _training_run(runs / "group" / "c")
    (runs / "notes").mkdir()
    with pytest.raises(RunDirError) as e:
        check_run_dir(runs)
    assert e.value.message == (
        f"{runs}: not a run directory (one has metrics.jsonl, config.yaml and episodes/ in it)"
    )
    assert (
        e.value.hint
        == f"it holds 3 runs ({runs / 'a'}, {runs / 'b-eval'}, {runs / 'group' / 'c'}): pass one"
    )


def test_a_folder_with_no_run_below_it_and_a_run_that_recorded_nothing(tmp_path):
    with pytest.raises(RunDirError) as e:
        check_run_dir(tmp_path)
    assert "not a run directory" in e.value.message
    assert "tracerl train" in e.value.hint
    (tmp_path / "config.yaml").write_text("name: x\n")
    with pytest.raises(RunDirError, match="the run has recorded nothing yet") as e:
        check_run_dir(tmp_path)
    assert "train it" in e.value.hint


def test_a_run_reads_only_its_own_folders_not_a_run_kept_inside_it(tmp_path):
    run = _training_run(tmp_path / "run")
    _write(run / "old-attempt", 0, "x0")  # a run (or an eval --out) put inside this one
    _write(run / "old-attempt" / "eval", 0, "x1")
    assert "x0" not in dict(_phases(run)) and "x1" not in dict(_phases(run))
