"""The guard that ends a server's whole process group with the process that started it
(`tracerl.engines.guard`), and the engine's configuration checks, without vLLM: a shell
that starts children stands in for the server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tracerl.config import RunConfig
from tracerl.engines.guard import group_alive
from tracerl.engines.vllm import EngineError, find_vllm_python, served_name

# a "server" of three processes: the shell and two children that would outlive it
SERVER = ["bash", "-c", "sleep 300 & sleep 300 & wait"]

OWNER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    read, write = os.pipe()
    guard = subprocess.Popen(
        [sys.executable, "-m", "tracerl.engines.guard", str(read), sys.argv[1], "--",
         *sys.argv[2:]],
        pass_fds=(read,),
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


def test_an_owner_killed_with_sigkill_takes_the_whole_group_with_it(tmp_path):
    pidfile = tmp_path / "server.pid"
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(pidfile), *SERVER], stdout=subprocess.PIPE, text=True
    )
    try:
        guard = int(owner.stdout.readline())
        server = _wait_for(pidfile)
        time.sleep(0.3)  # the shell has started its children
        assert os.getpgid(server) == server != os.getpgid(guard)  # a group of its own
        assert group_alive(server)
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=10)
        assert _gone(server), "the server's processes outlived their owner"
    finally:
        owner.kill()


def test_a_server_that_exits_takes_its_leftovers_and_the_guard_reports_its_status(tmp_path):
    pidfile = tmp_path / "server.pid"
    read, write = os.pipe()
    exits = ["bash", "-c", "sleep 300 & sleep 0.5; exit 3"]
    guard = subprocess.Popen(
        [sys.executable, "-m", "tracerl.engines.guard", str(read), str(pidfile), "--", *exits],
        pass_fds=(read,),
    )
    os.close(read)
    try:
        server = _wait_for(pidfile)
        assert guard.wait(timeout=20) == 3
        assert _gone(server, timeout=5)  # the background sleep did not survive it
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
