"""Scale-out settings that cannot work, through the real `tracerl train`: exit status 2,
two lines naming the key and what to do, no traceback, no model loaded and no run folder
written. Before, each of these loaded the model (and started Ray), then ended in a
traceback: a Ray cluster nothing answers at, ``auto`` with no cluster, a sampling server
that is not there, a vLLM Python without vllm."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from tests.command import run_tracerl

SMALL = ["trainer.steps=1", "trainer.group_size=2", "env.tasks_per_step=1", "env.eval_tasks=2"]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PORT = _closed_port()
# (overrides, environment, what the first line says, what the hint says)
CASES = {
    "ray address nothing listens at": (
        ["trainer.rollout.backend=ray", f"trainer.rollout.address=127.0.0.1:{PORT}"],
        {},
        f"trainer.rollout.address: cannot join the Ray cluster at '127.0.0.1:{PORT}': "
        f"127.0.0.1:{PORT} refused the connection",
        "ray start --head",
    ),
    "ray address auto, $RAY_ADDRESS gone": (
        ["trainer.rollout.backend=ray", "trainer.rollout.address=auto"],
        {"RAY_ADDRESS": f"127.0.0.1:{PORT}"},
        f"trainer.rollout.address: cannot join the Ray cluster at '127.0.0.1:{PORT}' "
        "(auto: $RAY_ADDRESS)",
        "leave trainer.rollout.address unset",
    ),
    "sampler url nothing answers at, given as a base_url": (
        [
            "trainer.rollout.backend=ray",
            f"trainer.rollout.sampler_url=http://127.0.0.1:{PORT}/v1",
            "model.lora={}",
        ],
        {},
        f"trainer.rollout.sampler_url: no server answers at http://127.0.0.1:{PORT}: ",
        "tracerl serve MODEL --port",
    ),
    "vllm python without vllm": (
        ["model.engine=vllm", f"model.vllm.python={sys.executable}"],
        {},
        f"model.vllm.python={sys.executable}: vllm is not installed in that Python",
        "make vllm",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_a_scaleout_mistake_is_two_lines_exit_2_and_writes_nothing(case, tmp_path):
    overrides, environment, first, hint = CASES[case]
    runs = tmp_path / "runs"
    args = ["train", "configs/learn-arithmetic.yaml", *SMALL, *overrides]
    r = run_tracerl(
        [*args, "name=scaleout", f"out_dir={runs}"],
        Path(__file__).resolve().parents[2],
        tmp_path / "cache",
        env=environment,
        timeout=120,
    )
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stderr
    assert len(lines) == 2 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith("error: ") and first in lines[0], lines[0]
    assert hint in lines[1], lines[1]
    assert "loading" not in r.stdout  # refused before the model loads
    assert not runs.exists()  # and before the run folder is made
