"""Ctrl-C during a run (`tracerl.train.interrupt`): acknowledged at once, the run stops at the
next safe point of whatever phase is running (the baseline evaluation, the warm start, a
step), keeps what is finished, prints the command that resumes it, and that command
resumes; a second Ctrl-C aborts at once.

The environment (`tests/interrupting.py`) blocks every episode from a chosen reset on, so the
phase under test can only end by being stopped: the verdicts do not depend on timing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.interrupting import Gated
from tracerl.config.loading import load_config
from tracerl.rollout.persist import read_step_file
from tracerl.train.loop import train

ROOT = Path(__file__).resolve().parents[2]
RUN = [
    "env.name=tests.interrupting:Gated",
    "trainer.steps=3",
    "trainer.group_size=2",
    "env.tasks_per_step=1",
    "env.eval_tasks=3",
    "trainer.checkpoint_every=100",
]
# resets, in order: 1 the rehearsal; 2-4 the baseline evaluation; with a warm start of two
# tasks, 5-6 its episodes and 7-9 its evaluation; then two per step
PHASES = {
    "the baseline evaluation": ([], 3),  # the 2nd reset's episode finishes, the others block
    "the warm start": (["warm_start={tasks: 2}"], 6),
    "step 1": ([], 8),  # baseline 2-4, step 0 5-6, step 1 7 (finishes) and 8 (blocks)
}


def _rows(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _episodes(folder: Path) -> int:
    return sum(1 for p in folder.glob("step_*.jsonl*") for _ in read_step_file(p))


def _interrupt_when_gated(gate: Path) -> threading.Thread:
    def watch() -> None:
        while not (gate.exists() and gate.read_text()):
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _gated_command(tmp_path: Path, gate_from: int, **popen: object) -> subprocess.Popen:
    """`tracerl train` on the gated environment (blocking from reset `gate_from`), started as
    a user would start it, once that reset is under way."""
    gate = tmp_path / "gate"
    env = {
        **os.environ,
        "TRACERL_TEST_GATE_FROM": str(gate_from),
        "TRACERL_TEST_GATE_FILE": str(gate),
        "PYTHONPATH": str(ROOT),
        **popen.pop("env", {}),  # type: ignore[dict-item]
    }
    exe = Path(sys.executable).with_name("tracerl")
    proc = subprocess.Popen(
        [str(exe), "train", "configs/learn-arithmetic.yaml", f"out_dir={tmp_path}", *RUN],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        **popen,  # type: ignore[arg-type]
    )
    deadline = time.time() + 600
    while not (gate.exists() and gate.read_text()) and time.time() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    return proc


@pytest.mark.parametrize("phase", list(PHASES))
def test_ctrl_c_stops_the_phase_keeps_what_is_done_and_the_printed_command_resumes(
    phase, tmp_path, monkeypatch, capfd
):
    extra, gate_from = PHASES[phase]
    gate = tmp_path / "gate"
    monkeypatch.setenv("TRACERL_TEST_GATE_FROM", str(gate_from))
    monkeypatch.setenv("TRACERL_TEST_GATE_FILE", str(gate))
    monkeypatch.setattr(Gated, "resets", 0)
    cfg = load_config("configs/learn-arithmetic.yaml", [f"out_dir={tmp_path}", *RUN, *extra])
    run = cfg.run_dir
    lines: list[str] = []
    watcher = _interrupt_when_gated(gate)
    train(cfg, log=lines.append)  # returns: the stop is not an error
    watcher.join(timeout=5)

    said = capfd.readouterr().err
    assert f"SIGINT: stopping at the next safe point of {phase}" in said
    assert "Ctrl-C again to abort now" in said
    command = f"tracerl train {run / 'config.yaml'} --resume"
    assert any(f"stopped by a signal during {phase}" in x and command in x for x in lines), lines
    rows = _rows(run)
    checkpoints = sorted(p.name for p in (run / "checkpoints").glob("step_*"))
    if phase == "the baseline evaluation":
        assert not [r for r in rows if r["phase"] == "eval"] and not checkpoints
        assert _episodes(run / "eval" / "episodes") == 1  # the finished one, kept
    elif phase == "the warm start":
        assert [r["stage"] for r in rows if r["phase"] == "eval"] == ["baseline"]
        assert not [r for r in rows if r["phase"] == "warm_start"] and not checkpoints
        assert _episodes(run / "warm_start" / "episodes") == 1
    else:  # step 0 was learned but not checkpointed (every 100 steps): it is, on the stop
        assert [r["step"] for r in rows if r["phase"] == "train"] == [0]
        assert checkpoints == ["step_0"]
        assert _episodes(run / "episodes") == 2 + 1  # step 0's two, step 1's finished one

    # the printed command resumes: the finished episodes reused, the rest done once
    monkeypatch.delenv("TRACERL_TEST_GATE_FROM")
    before = {p: _episodes(p) for p in (run / "eval" / "episodes", run / "episodes")}
    resumed = load_config(run / "config.yaml", [])
    train(resumed, resume=True, log=lines.append)
    rows = _rows(run)
    assert [r["step"] for r in rows if r["phase"] == "train"] == [0, 1, 2]
    stages = [r["stage"] for r in rows if r["phase"] == "eval"]
    assert stages == ["baseline", *(["warm_start"] if extra else []), "train"]
    assert _episodes(run / "episodes") == 3 * 2  # none twice
    assert all(_episodes(p) >= n for p, n in before.items())


def test_a_second_ctrl_c_aborts_at_once(tmp_path):
    """The run is stuck where no safe point comes (an environment blocking the event loop):
    the first Ctrl-C is acknowledged, the second ends the process with status 130."""
    env = {"TRACERL_TEST_GATE_BLOCKING": "1"}
    proc = _gated_command(tmp_path, 3, env=env, stderr=subprocess.PIPE)
    try:
        proc.send_signal(signal.SIGINT)
        acknowledged = ""
        while "Ctrl-C again to abort now" not in acknowledged:  # the first, acknowledged
            acknowledged += proc.stderr.readline()
        assert proc.poll() is None  # still stuck: no safe point came
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        assert proc.returncode == 130
        assert "aborting now" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_ctrl_c_while_starting_stops_at_once_and_says_what_was_kept(tmp_path):
    """Before the run's own handlers (checking the environment, loading the model, starting
    the engine) there is nothing to finish: the first Ctrl-C stops the command there. The
    command starts with SIGINT ignored (as a script's background job does): a run still
    takes it as a stop."""
    # the rehearsal's reset, before anything is written
    ignored = lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)  # noqa: E731
    proc = _gated_command(tmp_path, 1, stderr=subprocess.STDOUT, preexec_fn=ignored)
    out = _ctrl_c(proc)
    assert proc.returncode == 130, out
    assert "Ctrl-C while starting" in out and "Nothing was written." in out, out
    assert "Traceback" not in out, out
    assert not (tmp_path / "learn-arithmetic").exists()  # the same command starts it afresh


def test_ctrl_c_in_the_baseline_evaluation_ends_the_command_as_a_stop_not_an_error(tmp_path):
    """The command as a user runs it: Ctrl-C during the baseline evaluation, before any of
    its episodes finished, prints the resume line and ends as any stopped phase does (status
    0), saying there is no dashboard yet — not exit 2 with a report error about a run with
    nothing in it."""
    # every baseline episode blocks (reset 2 on): the stop comes before any is recorded
    proc = _gated_command(tmp_path, 2, stderr=subprocess.STDOUT, env={"COLUMNS": "200"})
    out = _ctrl_c(proc)
    run = tmp_path / "learn-arithmetic"
    said = " ".join(out.split())  # the terminal wraps long paths
    assert proc.returncode == 0, out
    assert f"tracerl train {run / 'config.yaml'} --resume" in said, out
    assert f"no report: {run} has no metrics or episodes yet" in said, out
    assert "error" not in out.lower() and "Traceback" not in out, out


def _ctrl_c(proc: subprocess.Popen) -> str:
    """One Ctrl-C to the gated command; all it printed once it has ended."""
    try:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return out
