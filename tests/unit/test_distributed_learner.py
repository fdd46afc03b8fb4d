"""One update of the ``ddp`` and ``fsdp2`` learners on 2 CPU processes (gloo) equals the
single-process learner's on the same batch: loss, gradient norm, gradient and updated
weights, for token-mean and sequence-mean losses, with ranks running unequal numbers of
micro-batches (and one rank none at all), a KL term and LoRA, the other ranks starting from
other weights than rank 0 (as after rank 0's warm start).

Tolerances, float32 throughout:
* the loss is a float64 sum of micro-batch losses, each the same float32 computation: 1e-6;
* the gradient norm is a float32 reduction over 3.2 million elements, whose rounding error
  (measured against float64: 1.3e-5 relative for one process, 0.6e-5 for two shards) is
  larger than the gradients' own differences: 5e-5 relative;
* gradients are sums in another order (per rank, then across ranks): 1e-4 relative plus
  1e-6 absolute (the largest entries are ~0.1);
* updated weights: Adam's first step moves each weight by -lr * g / (|g| + eps), which
  amplifies a difference in g by up to lr / eps = 1e5 where g is near 0 (and the tied
  embedding has millions of such entries). So the test checks that the distributed
  learner's weights moved by exactly that step of *its* gradient (1e-7: float rounding of
  the step), and its gradient is the single process's (above): the weights are then the
  single process's, up to what Adam itself makes of a float difference.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.distributed.learner_worker import CASES, initial_model, run_case, trajectories
from tracerl.train.batch import bucketed_batches, shared_prefix_batches
from tracerl.train.distributed import balance

ROOT = Path(__file__).resolve().parents[2]


def torchrun(args: list[str], nproc: int = 2, timeout: float = 600, **env: str) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}"]
    cmd += ["--standalone", *args]  # a free port of its own: tests may run side by side
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **env}
    done = subprocess.run(
        cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout
    )
    if done.returncode != 0:
        raise AssertionError(f"torchrun failed ({done.returncode}):\n{done.stderr[-4000:]}")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("two-ranks")
    torchrun(["-m", "tests.distributed.learner_worker", str(out)])
    return out


def test_the_cases_give_ranks_unequal_shares():
    trajs, adv = trajectories()
    with_prefix = shared_prefix_batches(trajs, adv, 100)
    per_row = bucketed_batches(trajs, adv, 100)
    for batches in (with_prefix, per_row):
        shares = [len(s) for s in balance([b.cost for b in batches], 2)]
        assert shares[0] != shares[1], shares
    one = bucketed_batches(trajs, adv, 100_000)
    assert [len(s) for s in balance([b.cost for b in one], 2)] == [1, 0]


@pytest.mark.parametrize("case", list(CASES))
def test_a_distributed_update_equals_the_single_process_one(two_ranks, case):
    got = torch.load(two_ranks / f"{case}.pt", weights_only=False)
    want = run_case(case)
    gm, wm = got["metrics"], want["metrics"]
    assert gm["train/policy_tokens"] == wm["train/policy_tokens"]
    assert gm["train/micro_batches"] == wm["train/micro_batches"]
    assert gm["train/loss"] == pytest.approx(wm["train/loss"], rel=1e-6, abs=1e-9)
    assert gm["train/grad_norm"] == pytest.approx(wm["train/grad_norm"], rel=5e-5)
    for name, g in want["grads"].items():
        torch.testing.assert_close(got["grads"][name], g, rtol=1e-4, atol=1e-6, msg=name)
    before = _initial_weights(case)
    assert set(got["weights"]) == set(before)
    for name, w in got["weights"].items():
        if name not in got["grads"] and "lora" in case:  # frozen under LoRA: unchanged
            assert torch.equal(w, before[name]), name
            continue
        # tied weights (the LM head is the embedding) are one parameter with one gradient
        grad = got["grads"].get(name, got["grads"].get("model.embed_tokens.weight"))
        adam = -1e-3 * grad / (grad.abs() + 1e-8)  # Adam's first step, lr 1e-3, eps 1e-8
        torch.testing.assert_close(w - before[name], adam, rtol=1e-4, atol=1e-7, msg=name)
    if case.startswith("ddp"):
        assert got["replicas_equal"]  # every rank took the same step, bit for bit


def _initial_weights(case: str) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in initial_model(case).state_dict().items()}


def test_a_strategy_outside_a_launch_is_the_single_process_learner():
    from tracerl.train.distributed import make_strategy

    assert make_strategy("fsdp2").name == "single"
    with pytest.raises(ValueError, match="valid: single, ddp, fsdp2"):
        make_strategy("zero3")


def test_several_processes_need_a_distributed_strategy(monkeypatch):
    from tracerl.config import RunConfig
    from tracerl.train.distributed.group import LaunchError, launch

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(LaunchError, match="launched as 2 processes") as e, launch(RunConfig()):
        pass
    assert "trainer.learner.strategy=ddp" in e.value.hint  # refused before joining any group


_SIGNAL_DURING_EXIT = """
import os, signal, sys
from tracerl.train.distributed.group import _quiet_once_lost
from tracerl.train.distributed.ranks import RankLost
lost = sys.argv[1] == "lost"
try:
    with _quiet_once_lost():
        try:
            if lost:
                raise RankLost("a learner rank stopped")
            raise RuntimeError("rank 0's own failure")
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # torchrun's, while the error unwinds
except RankLost as e:
    os.kill(os.getpid(), signal.SIGTERM)  # and once more, as the message is printed
    print(e.message, "/", e.hint)
    sys.exit(2)
"""


@pytest.mark.parametrize("lost", [True, False])
def test_torchruns_sigterm_after_a_lost_rank_cannot_cut_the_message_short(lost):
    # torchrun sends SIGTERM as soon as it sees a rank die: whether it comes before or after
    # rank 0's collective fails, rank 0 still says which rank stopped and how to resume
    done = subprocess.run(
        [sys.executable, "-c", _SIGNAL_DURING_EXIT, "lost" if lost else "own"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if lost:
        assert done.returncode == 2, done.stderr
        assert "a learner rank stopped" in done.stdout and "--resume" in done.stdout
    else:  # any other failure: SIGTERM acts as it always did
        assert done.returncode == -15 and done.stdout == "", done.stderr
