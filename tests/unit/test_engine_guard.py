"""The guard that ends a server's whole process group with the process that started it
(`tracerl.engines.guard`), and the engine's configuration checks, without vLLM: a shell
that starts children stands in for the server."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from tracerl.config import RunConfig
from tracerl.engines.guard import group_alive
from tracerl.engines.vllm import SOCKET_PATH_MAX, served_name, server_tmpdir
from tracerl.engines.vllm_python import EngineError, find_vllm_python

# a "server" of three processes: the shell and two children that would outlive it
SERVER = ["bash", "-c", "sleep 300 & sleep 300 & wait"]

OWNER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    read, write = os.pipe()
    guard = subprocess.Popen(
        [sys.executable, "-m", "tracerl.engines.guard", "--scratch", sys.argv[1], str(read),
         sys.argv[2], "--", *sys.argv[3:]],
        pass_fds=(read,),
        env={**os.environ, "TMPDIR": sys.argv[1]},
    )
    os.close(read)
    print(guard.pid, flush=True)
    time.sleep(600)  # holds `write` until it is killed
    """
)


def _wait_for(path: Path, timeout: float = 20) -> int:
    deadline = time.monotonic() + timeout
    while not path.is_file():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    return int(path.read_text())


def _gone(pgid: int, timeout: float = 20) -> bool:
    deadline = time.monotonic() + timeout
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not group_alive(pgid)


def test_an_owner_killed_with_sigkill_takes_the_whole_group_and_its_files_with_it(tmp_path):
    pidfile, scratch = tmp_path / "server.pid", tmp_path / "scratch"
    scratch.mkdir()
    # like vLLM: a socket-like file in its TMPDIR, never removed by the server itself
    leaves = ["bash", "-c", 'mkdir "$TMPDIR/d" && touch "$TMPDIR/d/sock" && ' + SERVER[2]]
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(scratch), str(pidfile), *leaves],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        guard = int(owner.stdout.readline())
        server = _wait_for(pidfile)
        time.sleep(0.3)  # the shell has started its children
        assert os.getpgid(server) == server != os.getpgid(guard)  # a group of its own
        assert group_alive(server)
        assert (scratch / "d" / "sock").exists()  # the server's TMPDIR is the scratch folder
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=10)
        assert _gone(server), "the server's processes outlived their owner"
        deadline = time.monotonic() + 10
        while (scratch.exists() or pidfile.exists()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not scratch.exists(), "the server's temporary files outlived it"
        assert not pidfile.exists(), "a pid file names a process that has ended"
    finally:
        owner.kill()


def test_a_server_that_exits_takes_its_leftovers_and_the_guard_reports_its_status(tmp_path):
    pidfile, scratch = tmp_path / "server.pid", tmp_path / "scratch"
    scratch.mkdir()
    read, write = os.pipe()
    exits = ["bash", "-c", "sleep 300 & sleep 0.5; exit 3"]
    guard = [sys.executable, "-m", "tracerl.engines.guard", "--scratch", str(scratch)]
    guard = subprocess.Popen([*guard, str(read), str(pidfile), "--", *exits], pass_fds=(read,))
    os.close(read)
    try:
        server = _wait_for(pidfile)
        assert guard.wait(timeout=20) == 3
        assert _gone(server, timeout=5)  # the background sleep did not survive it
        # left for the starter to read (its log, say) and remove: its server ended
        assert pidfile.read_text() == str(server) and scratch.is_dir()
    finally:
        os.close(write)
        guard.kill()


def test_ctrl_c_leaves_the_server_to_the_trainer_and_closing_the_pipe_stops_it(tmp_path):
    pidfile = tmp_path / "server.pid"
    read, write = os.pipe()
    guard = subprocess.Popen(
        [sys.executable, "-m", "tracerl.engines.guard", str(read), str(pidfile), "--", *SERVER],
        pass_fds=(read,),
    )
    os.close(read)
    server = _wait_for(pidfile)
    guard.send_signal(signal.SIGINT)  # Ctrl-C: the trainer finishes its step on this server
    time.sleep(0.5)
    assert guard.poll() is None and group_alive(server)
    os.close(write)  # what the trainer's exit does
    assert guard.wait(timeout=20) == 0
    assert _gone(server, timeout=5)
    assert not pidfile.exists()


def test_a_guard_that_cannot_understand_its_command_line_or_run_its_command_says_so(tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    for args in (["--parent", "me", "-", "--", "true"], ["--scratch", str(scratch), "x"]):
        run = subprocess.run(
            [sys.executable, "-m", "tracerl.engines.guard", *args], capture_output=True, text=True
        )
        assert run.returncode == 2 and "usage:" in run.stderr, args
    assert scratch.exists()  # nothing was started: nothing of its to remove
    run = subprocess.run(
        [sys.executable, "-m", "tracerl.engines.guard", "-1", "-", "--", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 127 and f"cannot run {tmp_path / 'nope'}" in run.stderr


def test_a_vllm_servers_temporary_folder_fits_its_sockets_paths(tmp_path, monkeypatch):
    """vLLM makes <TMPDIR>/<uuid4> sockets; a path over 107 bytes kills its engine."""
    uuid = "0" * 36
    short = Path(tempfile.mkdtemp(dir="/tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(short))  # short enough: used
    made = Path(server_tmpdir())
    assert made.parent == short and made.name.startswith("tracerl-vllm-")
    shutil.rmtree(short)
    deep = tmp_path / ("d" * 60) / ("e" * 40)
    deep.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(deep))  # a cluster job's TMPDIR: too deep
    made = Path(server_tmpdir())
    try:
        assert len(str(made / uuid)) <= SOCKET_PATH_MAX and made.parent == Path("/tmp")
    finally:
        made.rmdir()


def test_vllm_python_that_is_not_there_is_a_clear_error(tmp_path, monkeypatch):
    with pytest.raises(EngineError, match=r"model.vllm.python=.*no such file"):
        find_vllm_python(str(tmp_path / "nope" / "python"))
    monkeypatch.setenv("TRACERL_VLLM_PYTHON", str(tmp_path / "missing"))
    with pytest.raises(EngineError, match=r"\$TRACERL_VLLM_PYTHON=.*no such file"):
        find_vllm_python()
    fake = tmp_path / "python"
    fake.write_text("")
    assert find_vllm_python(str(fake)) == str(fake)


def test_served_names_are_url_safe():
    assert served_name("hf:/data/my model/v1") == "hf-data-my-model-v1"
    assert served_name("smollm2-135m-instruct") == "smollm2-135m-instruct"


@pytest.mark.parametrize(
    "settings, message",
    [
        (
            {
                "model": {"engine": "vllm"},
                "trainer": {"rollout": {"backend": "ray", "sampler_url": "http://x:1"}},
            },
            "starts a vLLM server of the run's own",
        ),
        (
            {"model": {"engine": "vllm"}, "trainer": {"mode": "async"}},
            "needs model.lora",
        ),
    ],
)
def test_engine_settings_that_cannot_work_are_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        RunConfig(**settings)
    assert RunConfig(model={"engine": "vllm", "lora": {"r": 8}}, trainer={"mode": "async"})
