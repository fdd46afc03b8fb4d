"""vLLM on a GPU, without one (issue 51): the server's command line and environment on the
CPU (pinned byte for byte) and on CUDA, the GPU config keys, sleep mode around the learner's
update and the in-place weight push through CUDA IPC, each against recorded requests. None
of the CUDA paths has run on a GPU (docs/gpu.md)."""

from __future__ import annotations

import base64
import copy
import json
import pickle
import sys
from pathlib import Path

import pytest
import torch

import tracerl.engines as engines
from tracerl.config import RunConfig
from tracerl.engines import HFEngine, VLLMEngine
from tracerl.engines.vllm import ServerSettings, VLLMServer, visible_gpu
from tracerl.engines.vllm_weights import IpcWeightSync
from tracerl.envs import get_parser, make
from tracerl.rollout import ScriptedSampler
from tracerl.rollout.budget import Budgets, RetryPolicy, RolloutConfig
from tracerl.rollout.runner import Policy
from tracerl.train.grpo import GRPOConfig, grpo_step
from tracerl.train.learner import Learner, LearnerConfig

BASE = [
    "py", "-m", "vllm.entrypoints.openai.api_server",
    "--model", "/models/m",
    "--served-model-name", "m",
    "--dtype", "bfloat16",
    "--host", "127.0.0.1",
    "--port", "8000",
]  # fmt: skip


def _server(**settings) -> VLLMServer:
    return VLLMServer(
        Path("/models/m"), "m", ServerSettings(python="py", **settings), Path("/tmp/x/vllm.log")
    )


def test_the_cpu_command_is_what_it_was_before_the_gpu_options():
    """Today's CPU command, as the code before issue 51 built it, byte for byte."""
    assert _server().command(8000) == [
        *BASE,
        "--seed", "0",
        "--max-model-len", "2048",
        "--logprobs-mode", "processed_logprobs",
        "--generation-config", "vllm",
        "--disable-uvicorn-access-log",
        "--kv-cache-memory-bytes", "1073741824",
        "--no-enable-chunked-prefill",
        "--max-num-batched-tokens", "8192",
    ]  # fmt: skip
    busy = _server(
        kv_cache_gb=0.25,
        threads=2,
        executor="uni",
        lora_rank=16,
        seed=3,
        extra_args=("--enforce-eager",),
        # GPU options do nothing on the CPU
        sleep_mode=False,
        gpu_memory_utilization=0.9,
    )
    assert busy.command(8000) == [
        *BASE,
        "--seed", "3",
        "--max-model-len", "2048",
        "--logprobs-mode", "processed_logprobs",
        "--generation-config", "vllm",
        "--disable-uvicorn-access-log",
        "--kv-cache-memory-bytes", "268435456",
        "--no-enable-chunked-prefill",
        "--max-num-batched-tokens", "8192",
        "--distributed-executor-backend", "uni",
        "--enable-lora", "--max-lora-rank", "16", "--max-loras", "2",
        "--enforce-eager",
    ]  # fmt: skip


def test_the_cpu_environment_pins_threads_and_leaves_the_gpus_alone(monkeypatch):
    monkeypatch.delenv("VLLM_USE_AOT_COMPILE", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    env = _server(threads=2, executor="uni").environment()
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert env["VLLM_USE_AOT_COMPILE"] == "0"
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert env["CUDA_VISIBLE_DEVICES"] == "3"  # untouched
    assert "VLLM_ALLOW_INSECURE_SERIALIZATION" not in env


def test_on_cuda_the_command_shares_the_gpu_and_drops_the_cpu_workarounds():
    cmd = _server(device="cuda", gpu=0, threads=2).command(8000)
    assert cmd[-2:] == ["--gpu-memory-utilization", "0.5"]
    for cpu_only in (
        "--kv-cache-memory-bytes",
        "--no-enable-chunked-prefill",
        "--max-num-batched-tokens",
        "--enable-sleep-mode",
        "--weight-transfer-config",
    ):
        assert cpu_only not in cmd
    assert cmd[: len(BASE)] == BASE and "processed_logprobs" in cmd

    full = _server(
        device="cuda",
        gpu=0,
        gpu_memory_utilization=0.35,
        kv_cache_gb=2.0,  # set: it sizes the cache (vLLM: it overrides the share)
        sleep_mode=True,
        weight_sync="ipc",
        lora_rank=8,
        extra_args=("--enforce-eager",),
    ).command(8000)
    tail = full[full.index("--disable-uvicorn-access-log") + 1 :]
    assert tail == [
        "--gpu-memory-utilization", "0.35",
        "--kv-cache-memory-bytes", str(2 * 2**30),
        "--enable-sleep-mode",
        "--weight-transfer-config", '{"backend": "ipc"}',
        "--enable-lora", "--max-lora-rank", "8", "--max-loras", "2",
        "--enforce-eager",
    ]  # fmt: skip
    assert json.loads(tail[6]) == {"backend": "ipc"}


def test_on_cuda_the_server_gets_the_learners_gpu_and_no_cpu_settings(monkeypatch):
    monkeypatch.delenv("VLLM_USE_AOT_COMPILE", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    env = _server(device="cuda", gpu=1, threads=2, weight_sync="ipc").environment()
    assert env["CUDA_VISIBLE_DEVICES"] == "6"  # this process's cuda:1
    assert env["VLLM_ALLOW_INSECURE_SERIALIZATION"] == "1"  # the IPC handles arrive pickled
    assert "VLLM_CPU_OMP_THREADS_BIND" not in env and "VLLM_USE_AOT_COMPILE" not in env
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    files = _server(device="cuda", gpu=0).environment()
    assert "VLLM_ALLOW_INSECURE_SERIALIZATION" not in files


def test_the_visible_gpu_is_this_processs_own(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert visible_gpu(0) == "0" and visible_gpu(2) == "2"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaa, GPU-bbb")
    assert visible_gpu(1) == "GPU-bbb"


@pytest.mark.parametrize("value", [0, -0.1, 1.01])
def test_a_gpu_share_outside_zero_to_one_is_refused(value):
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        RunConfig(model={"engine": "vllm", "vllm": {"gpu_memory_utilization": value}})


def test_gpu_keys_have_defaults_that_change_nothing_and_bad_values_are_refused():
    v = RunConfig().model.vllm
    assert (v.gpu_memory_utilization, v.sleep_mode, v.weight_sync, v.kv_cache_gb) == (
        None,
        False,
        "files",
        None,
    )
    with pytest.raises(ValueError, match="weight_sync"):
        RunConfig(model={"vllm": {"weight_sync": "nccl"}})


def test_sleep_mode_is_refused_with_async_training():
    async_lora = {"model": {"engine": "vllm", "lora": {"r": 8}}, "trainer": {"mode": "async"}}
    assert RunConfig(**async_lora)
    async_lora["model"]["vllm"] = {"sleep_mode": True}
    with pytest.raises(ValueError, match=r"sleep_mode.*trainer\.mode=sync"):
        RunConfig(**async_lora)
    assert RunConfig(model={"engine": "vllm", "vllm": {"sleep_mode": True}})


class Requests:
    """Every weight-sync and sleep request, as (route, body), answered 200."""

    def __init__(self, monkeypatch, log: list):
        self.log = log
        import tracerl.engines.vllm_weights as vllm_weights
        import tracerl.rollout.weight_sync as weight_sync

        monkeypatch.setattr(weight_sync, "post", self)
        monkeypatch.setattr(vllm_weights, "post", self)

    def __call__(self, url, body, timeout_s, *, missing_route=""):
        self.log.append((url.removeprefix("http://server"), body))

    @property
    def routes(self) -> list[str]:
        return [route for route, _ in self.log]


def _engine(tiny, tmp_path, monkeypatch, *, gpu, lora=False, **vllm) -> VLLMEngine:
    monkeypatch.setattr(engines, "_learner_gpu", lambda device: gpu)
    monkeypatch.setattr(engines, "base_folder", lambda bundle, workdir: tmp_path / "base")
    model = {"engine": "vllm", "spec": "tiny-random", "vllm": {"python": sys.executable, **vllm}}
    if lora:
        model["lora"] = {"r": 8}
    cfg = RunConfig(model=model, name="gpu", out_dir=str(tmp_path))
    policy = Policy(ScriptedSampler([]), tiny.renderer, get_parser("json_list"), "t")
    lines: list[str] = []
    engine = VLLMEngine(cfg, tiny, policy, tmp_path / "run", lines.append)
    engine.lines = lines
    monkeypatch.setattr(engine.server, "start", lambda: "http://server")
    monkeypatch.setattr(engine.server, "healthy", lambda attempts=3: True)
    engine.start()
    return engine


def test_without_a_gpu_the_gpu_options_are_ignored_with_a_warning(tiny, tmp_path, monkeypatch):
    log: list = []
    Requests(monkeypatch, log)
    engine = _engine(tiny, tmp_path, monkeypatch, gpu=None, sleep_mode=True, weight_sync="ipc")
    s = engine.server.settings
    assert (s.device, s.sleep_mode, s.weight_sync) == ("cpu", False, "files")
    assert any("sleep_mode, weight_sync=ipc" in line and "CPU" in line for line in engine.lines)
    assert "--no-enable-chunked-prefill" in engine.server.command(1)
    engine.pause()
    assert log == []  # nothing to put to sleep on the CPU


def test_a_server_in_sleep_mode_sleeps_through_the_update_and_wakes_for_the_push(
    tiny, tmp_path, monkeypatch
):
    """Sleep before the learner's update (grpo_step's `before_update`, what the training loop
    passes `engine.pause` as), then wake_up and the weight push after it."""
    order: list = []
    requests = Requests(monkeypatch, order)
    engine = _engine(tiny, tmp_path, monkeypatch, gpu=0, sleep_mode=True)
    s = engine.server.settings
    assert (s.device, s.gpu, s.sleep_mode, s.gpu_memory_utilization) == ("cuda", 0, True, 0.5)
    assert "--enable-sleep-mode" in engine.server.command(1)

    model = copy.deepcopy(tiny.model)
    learner = Learner(model, LearnerConfig(lr=1e-4))
    update = learner.update
    learner.update = lambda *a, **k: (order.append("update"), update(*a, **k))[1]
    sampler = ScriptedSampler.from_texts(tiny.renderer, lambda r: "Answer 1.")
    policy = Policy(sampler, tiny.renderer, get_parser("json_list"), "t")
    rollout = RolloutConfig(budgets=Budgets(steps=1), max_turn_tokens=6, reserve=None)
    cfg = GRPOConfig(
        group_size=2, rollout=rollout.model_copy(update={"retry": RetryPolicy(max_retries=0)})
    )
    grpo_step(
        lambda: make("refund_desk"),
        make("refund_desk").sample_tasks(1),
        policy,
        learner,
        lambda e: float(e.episode_id.endswith("g0")),
        cfg,
        step=0,
        before_update=engine.pause,
    )
    engine.publish(model, 1)
    routes = [r if isinstance(r, str) else r[0] for r in order]
    assert routes == [
        "/sleep?level=2",  # full fine-tuning: the weights go; the push replaces them
        "update",
        "/wake_up",
        "/pause?mode=wait",
        "/collective_rpc",
        "/reset_prefix_cache",
        "/resume",
    ]
    assert order[4][1]["method"] == "reload_weights"
    del order[:]
    engine.publish(model, 2)  # awake already: no wake_up
    assert requests.routes[0] == "/pause?mode=wait" and not engine.asleep


def test_lora_sleeps_at_level_one_and_a_restarted_server_is_awake(tiny, tmp_path, monkeypatch):
    log: list = []
    requests = Requests(monkeypatch, log)
    engine = _engine(tiny, tmp_path, monkeypatch, gpu=0, lora=True, sleep_mode=True)
    engine.pause()
    engine.pause()  # asleep already: once
    assert requests.routes == ["/sleep?level=1"]
    monkeypatch.setattr(engine.server, "healthy", lambda attempts=3: False)
    monkeypatch.setattr(engine.server, "restart", lambda: "http://server")
    engine.ensure_running()  # it died asleep; the new one is awake
    assert not engine.asleep


def test_a_server_that_cannot_sleep_leaves_the_update_to_run(tiny, tmp_path, monkeypatch):
    log: list = []
    Requests(monkeypatch, log)
    engine = _engine(tiny, tmp_path, monkeypatch, gpu=0, sleep_mode=True)

    def refuses(url, body, timeout_s, *, missing_route=""):
        raise RuntimeError("weight sync: http://server/sleep answered HTTP 500")

    import tracerl.rollout.weight_sync as weight_sync

    monkeypatch.setattr(weight_sync, "post", refuses)
    engine.pause()
    assert not engine.asleep and "could not sleep" in engine.lines[-1]


def test_without_sleep_mode_pause_sends_nothing(tiny, tmp_path, monkeypatch):
    log: list = []
    requests = Requests(monkeypatch, log)
    engine = _engine(tiny, tmp_path, monkeypatch, gpu=0)
    assert "--enable-sleep-mode" not in engine.server.command(1)
    engine.pause()
    engine.publish(copy.deepcopy(tiny.model), 1)
    assert requests.routes == [
        "/pause?mode=wait",
        "/collective_rpc",
        "/reset_prefix_cache",
        "/resume",
    ]
    HFEngine(engine.policy).pause()  # the in-process engine has nothing to pause


def _fake_share(tensor):
    return "GPU-fake", ("handle", tuple(tensor.shape), str(tensor.dtype))


def test_ipc_weight_sync_sends_the_weights_in_place(tiny, monkeypatch):
    log: list = []
    requests = Requests(monkeypatch, log)
    sync = IpcWeightSync("http://server", "bfloat16", share=_fake_share)
    model = tiny.model
    sync.push(model, 3)
    sync.push(model, 4)  # the transfer engine is initialised once
    routes = requests.routes
    per_update = [
        "/pause?mode=wait",
        "/start_weight_update",
        "/update_weights",
        "/finish_weight_update",
        "/reset_prefix_cache",
        "/resume",
    ]
    assert routes == ["/init_weight_transfer_engine", *per_update, *per_update]
    bodies = dict(log[:7])
    assert bodies["/init_weight_transfer_engine"] == {"init_info": {"packed": False}}
    assert bodies["/finish_weight_update"] == {"weight_version": "3"}
    info = bodies["/update_weights"]["update_info"]
    state = model.state_dict()
    assert info["names"] == list(state)
    assert info["dtype_names"] == ["bfloat16"] * len(state)
    assert info["shapes"] == [list(v.shape) for v in state.values()]
    handles = pickle.loads(base64.b64decode(info["ipc_handles_pickled"]))
    assert handles == [
        {"GPU-fake": ("handle", tuple(v.shape), "torch.bfloat16")} for v in state.values()
    ]
    assert set(info) == {"names", "dtype_names", "shapes", "ipc_handles_pickled"}
    json.dumps(bodies["/update_weights"])  # what the HTTP request carries


def test_ipc_weight_sync_resumes_the_server_when_the_update_fails(tiny, monkeypatch):
    log: list = []
    requests = Requests(monkeypatch, log)

    def failing(url, body, timeout_s, *, missing_route=""):
        requests(url, body, timeout_s)
        if url.endswith("/update_weights"):
            raise RuntimeError("weight sync: HTTP 500")

    import tracerl.engines.vllm_weights as vllm_weights

    monkeypatch.setattr(vllm_weights, "post", failing)
    with pytest.raises(RuntimeError, match="500"):
        IpcWeightSync("http://server", "float32", share=_fake_share).push(tiny.model, 1)
    assert requests.routes[-1] == "/resume"


def test_ipc_needs_the_weights_on_a_gpu():
    from tracerl.engines.vllm_weights import cuda_ipc_handle

    with pytest.raises(RuntimeError, match="weight_sync=files"):
        cuda_ipc_handle(torch.zeros(2))


def test_the_engine_pushes_full_weights_through_ipc_on_a_gpu(tiny, tmp_path, monkeypatch):
    log: list = []
    requests = Requests(monkeypatch, log)
    engine = _engine(tiny, tmp_path, monkeypatch, gpu=0, weight_sync="ipc", sleep_mode=True)
    assert isinstance(engine.sync, IpcWeightSync)
    engine.sync.share = _fake_share
    engine.pause()
    engine.publish(copy.deepcopy(tiny.model), 1)
    assert requests.routes[:4] == [
        "/sleep?level=2",
        "/wake_up",
        "/init_weight_transfer_engine",
        "/pause?mode=wait",
    ]
    assert not (tmp_path / "run" / "engine" / "weights").exists()  # nothing on disk
