"""Rollout workers on a real local Ray cluster (2 workers), sampling from the learner's own
`tracerl serve` server on loopback: training through them writes the episodes the in-process
path writes for the same seeds (tokens, masks, log-probs, rewards, receipts), a worker
killed mid-run loses nothing, and workers that all die leave infrastructure failures, never
policy failures."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from pathlib import Path

import httpx
import pytest
import ray

from tests.serve import tracerl_serve
from tracerl.config import RolloutBackendConfig
from tracerl.config.loading import load_config
from tracerl.envs import get_parser, make
from tracerl.models import load
from tracerl.report.html import write_report
from tracerl.rollout import BatchedHFSampler
from tracerl.rollout import ray_workers as rw
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.groups import run_groups
from tracerl.rollout.persist import read_run_trajectories
from tracerl.rollout.runner import Policy
from tracerl.rollout.serve import ServerThread
from tracerl.train.loop import train
from tracerl.types import Attribution, StopReason

# A hang (a worker that never answers) fails its test instead of holding CI; each takes
# ~10-90 s here (the most on a loaded machine), far from the bound.
pytestmark = pytest.mark.timeout(900)

# Small, and slow enough that a kill finds episodes in flight: one request sampled at a time
# (also what makes the two paths bit-identical), a few turns of a few dozen tokens each.
ARGS = [
    "trainer.steps=3",
    "trainer.group_size=4",
    "env.tasks_per_step=2",
    "env.eval_tasks=4",
    "model.max_batch_size=1",
    "rollout.max_turn_tokens=24",
    "rollout.budgets.steps=2",
]
RAY = [
    "trainer.rollout.backend=ray",
    "trainer.rollout.workers=2",
    "trainer.rollout.worker_cpus=0.5",
]
# What differs between two runs of the same episode: when and where it ran.
VOLATILE = {"replay_id", "started_at", "wall_time_s", "steps", "worker", "ledger"}


@pytest.fixture(scope="module")
def cluster():
    # a cluster of this process's own (never another test worker's, running beside it)
    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=128 << 20)
    yield
    ray.shutdown()


def _train(out: Path, *extra: str) -> Path:
    cfg = load_config("configs/learn-arithmetic.yaml", [f"out_dir={out}", *ARGS, *extra])
    train(cfg, log=lambda line: None)
    return cfg.run_dir


def _episodes(run: Path) -> dict[str, dict]:
    """Every written episode (training and evaluation) by file and id, as compared."""
    out = {}
    written = [*read_run_trajectories(run), *read_run_trajectories(run / "eval")]
    for path, t in written:
        key = f"{path.parent.parent.name}/{path.name}/{t.episode_id}"
        assert key not in out, f"{key} written twice"
        receipt = {k: v for k, v in t.receipt.items() if k not in VOLATILE}
        out[key] = {
            "token_ids": t.token_ids,
            "loss_mask": t.loss_mask,
            "sources": [str(s) for s in t.sources],
            "logprobs": t.logprobs,
            "reward": t.reward,
            "receipt": receipt,
        }
    return out


def _metrics(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    keep = ("train/reward_mean", "train/loss", "eval/heldout/success_rate")
    return [{k: r[k] for k in ("step", "phase", *keep) if k in r} for r in rows]


@pytest.fixture(scope="module")
def in_process(tmp_path_factory):
    return _train(tmp_path_factory.mktemp("inprocess"))


def test_training_through_ray_workers_writes_the_in_process_episodes(cluster, in_process, tmp_path):
    run = _train(tmp_path, *RAY)
    want, got = _episodes(in_process), _episodes(run)
    assert got.keys() == want.keys() and len(got) == 3 * 8 + 2 * 4  # 3 steps, 2 evaluations
    for key in want:
        assert got[key] == want[key], key
    assert _metrics(run) == _metrics(in_process)  # the same updates, the same curves
    where = [t.receipt["worker"] for _, t in read_run_trajectories(run)]
    assert {w["worker"] for w in where} == {0, 1} and all(w["backend"] == "ray" for w in where)
    assert all(w["failed_attempts"] == [] for w in where)
    assert all(t.receipt["worker"] is None for _, t in read_run_trajectories(in_process))


def test_a_worker_killed_mid_run_loses_nothing(cluster, in_process, tmp_path, monkeypatch):
    pools: list[rw.RayRollouts] = []
    real_init = rw.RayRollouts.__init__

    def capture(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        pools.append(self)

    monkeypatch.setattr(rw.RayRollouts, "__init__", capture)
    killed: list[int] = []

    def killer() -> None:  # during step 1: worker 0 dies with episodes in flight
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            metrics = tmp_path / "learn-arithmetic" / "metrics.jsonl"
            step0 = metrics.exists() and '"phase": "train"' in metrics.read_text()
            if pools and step0 and pools[0].slots[0].in_flight >= 2:
                killed.append(pools[0].slots[0].index)
                ray.kill(pools[0].slots[0].handle, no_restart=True)
                return
            time.sleep(0.005)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    run = _train(tmp_path, *RAY)
    thread.join()
    assert killed == [0], "the worker was never seen with episodes in flight"
    # nothing lost, nothing twice, nothing changed: every episode is the uninterrupted one
    want, got = _episodes(in_process), _episodes(run)
    assert got.keys() == want.keys()
    assert all(got[key] == want[key] for key in want)
    assert _metrics(run) == _metrics(in_process)
    retried = [t.receipt["worker"] for _, t in read_run_trajectories(run)]
    retried = [w for w in retried if w["failed_attempts"]]
    assert retried, "no episode was in flight on the killed worker"
    for w in retried:
        assert [f["worker"] for f in w["failed_attempts"]] == [0]
        assert "ActorDiedError" in w["failed_attempts"][0]["error"]
        assert w["worker"] != 0  # finished elsewhere
    assert pools[0].deaths == 1 and len([s for s in pools[0].slots if s.alive]) == 2
    # the dashboard counts them: infrastructure churn, apart from the policy's curves
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    reruns = [r["rollout/worker_reruns"] for r in rows if r["phase"] == "train"]
    assert reruns[0] == 0 and reruns[1] == len(retried) / 8
    html = write_report(run).read_text()
    assert "episodes rerun after their rollout worker died" in html


def test_async_training_through_ray_workers(cluster, tmp_path):
    run = _train(tmp_path, *RAY, "trainer.mode=async", "trainer.max_staleness=1")
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if r["phase"] == "train"]
    assert [r["step"] for r in train_rows] == [0, 1, 2]
    assert all(r["async/staleness_max"] <= 1 for r in train_rows)
    written = [t for path, t in read_run_trajectories(run) if path.parent.name == "episodes"]
    for t in written:  # each turn carries the version the server sampled it with
        versions = [s.policy_version for s in t.policy_segments()]
        assert versions and all(v is not None and 0 <= v <= 3 for v in versions)
        assert t.receipt["worker"]["backend"] == "ray"
        assert t.receipt["rollout"]["weight_sync"] == "between_turns"
    assert max(s.policy_version for t in written for s in t.policy_segments()) >= 1


def _kill_when_in_flight(pool, slots, n: int, batch):
    """Run `batch` (a coroutine); once `n` episodes are in flight, kill `slots`' workers."""

    async def go():
        task = asyncio.ensure_future(batch)
        while sum(s.in_flight for s in pool.slots) < n:
            await asyncio.sleep(0.005)
        for s in slots(pool):
            ray.kill(s.handle, no_restart=True)
        return await task

    return asyncio.run(go())


def test_workers_lost_are_the_environments_failures_and_none_left_stops_the_run(cluster):
    tiny = load("tiny-random")
    sampler = BatchedHFSampler(tiny.model, temperature=1.0, seed=0, max_batch_size=1)
    policy = Policy(sampler, tiny.renderer, get_parser("json_list"), "tiny-random")
    server = ServerThread(sampler, "tiny-random", tiny.tokenizer)
    url = server.start()
    rollout = RolloutConfig(budgets=Budgets(steps=3), max_turn_tokens=32, reserve=None)
    tasks = make("refund_desk").sample_tasks(2, seed=0)

    def batch(pool):
        return run_groups("refund_desk", tasks, policy, rollout, group_size=4, backend=pool)

    try:
        # one attempt per episode: those in flight on the killed worker are not rerun
        once = RolloutBackendConfig(workers=2, worker_cpus=0.5, max_attempts=1)
        pool = rw.RayRollouts(policy, url, settings=once)
        try:
            groups = _kill_when_in_flight(pool, lambda p: p.slots[:1], 8, batch(pool))
            assert pool.deaths == 1 and sum(s.alive for s in pool.slots) == 2  # replaced
        finally:
            pool.close()
        episodes = [e for g in groups for e in g]
        lost = [e for e in episodes if e.receipt.worker["failed_attempts"]]
        assert len(episodes) == 8 and lost
        for e in lost:
            assert e.stop_reason is StopReason.INFRA_FAILURE
            assert e.attribution is Attribution.ENVIRONMENT and not e.gradient_eligible
            assert e.receipt.worker["worker"] is None
            assert "its rollout worker was lost 1 times (worker 0: ActorDiedError" in (
                e.receipt.error
            )
        assert all(e.stop_reason is not StopReason.INFRA_FAILURE for e in episodes if e not in lost)
        # no replacement left and no live worker: nothing can run, the run stops
        none = RolloutBackendConfig(workers=2, worker_cpus=0.5, max_restarts=0)
        pool = rw.RayRollouts(policy, url, settings=none)
        try:
            with pytest.raises(RuntimeError, match="no live rollout worker is left: 2 died"):
                _kill_when_in_flight(pool, lambda p: p.slots, 8, batch(pool))
        finally:
            pool.close()
    finally:
        server.stop()


def test_an_external_server_kept_in_step_by_lora_hot_loads(cluster, tmp_path):
    """The workers sample from a `tracerl serve` the learner does not own (its own copy of
    the base model, as a vLLM server would be); after every update the learner's adapters
    are hot-loaded into it: the run is the in-process run, token for token."""
    lora = ["model.lora={r: 4, alpha: 8}"]
    want_run = _train(tmp_path / "inprocess", *lora)
    with tracerl_serve("tiny-chars", "--enable-lora", "--max-batch-size", "1") as url:
        run = _train(tmp_path / "remote", *lora, *RAY, f"trainer.rollout.sampler_url={url}")
        served = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    want, got = _episodes(want_run), _episodes(run)
    assert got.keys() == want.keys()
    assert all(got[key] == want[key] for key in want)
    assert _metrics(run) == _metrics(want_run)
    # not vacuous: the adapters really moved (before the arithmetic split of issue 18 every
    # reward here was 0, no update happened, and unseeded LoRA init went unnoticed)
    assert any(m.get("train/loss") for m in _metrics(run))
    # step s was sampled by adapter v<s>, which the server named in its answers
    for path, t in read_run_trajectories(run):
        step = int(path.name.split("_")[1].split(".")[0])
        assert {s.policy_version for s in t.policy_segments()} == {step}
    assert re.fullmatch(r"tiny-chars-[0-9a-f]{8}@v3", served)  # this run's own adapter
    assert sorted(p.name for p in (run / "adapters").iterdir()) == ["v2", "v3"]  # the last 2


def test_a_server_the_workers_cannot_reach_is_a_start_up_error(cluster):
    tiny = load("tiny-random")
    policy = Policy(BatchedHFSampler(tiny.model), tiny.renderer, get_parser("json_list"), "t")
    settings = RolloutBackendConfig(workers=1, worker_cpus=0.5, sampler_retries=0)
    with pytest.raises(RuntimeError, match=r"rollout worker 0 on .* cannot sample from "):
        rw.RayRollouts(policy, "http://127.0.0.1:9", settings=settings)
    assert ray.is_initialized()  # the cluster it did not start is left alone


def test_workers_build_a_users_env_by_import_path(cluster, tmp_path, monkeypatch):
    """A user's environment named by import path, found in the driver's working directory:
    each Ray worker (another process, started before the module existed) builds it too."""
    import sys

    from tests.ownpkg import TINY_RUN, write_package

    site = write_package(tmp_path, dist_info=False)
    monkeypatch.chdir(site)
    overrides = [
        f"out_dir={tmp_path / 'runs'}",
        "name=unit-ray",
        "env.name=unitpkg.envs:UnitConv",
        "trainer.reward=unitpkg.rewards:within_tolerance",
        *TINY_RUN,
        *RAY,
    ]
    try:
        cfg = load_config(None, overrides)
        train(cfg, log=lambda line: None)
    finally:  # the driver imported it from the working directory: leave nothing behind
        for name in [m for m in sys.modules if m == "unitpkg" or m.startswith("unitpkg.")]:
            del sys.modules[name]
        while str(site) in sys.path:
            sys.path.remove(str(site))
    written = list(read_run_trajectories(cfg.run_dir))
    assert len(written) == 2 * 4
    assert {t.receipt["worker"]["backend"] for _, t in written} == {"ray"}
    assert {t.receipt["env"]["import"] for _, t in written} == {"unitpkg.envs:UnitConv"}
    assert {c["name"] for _, t in written for c in t.reward["components"]} == {
        "attribution",
        "within_tolerance",
    }
