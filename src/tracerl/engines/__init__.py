"""Sampling engines: what generates the policy's turns (``model.engine``).

    with open_engine(cfg, bundle, policy, run_dir) as engine:
        engine.policy         # the policy to run episodes with
        engine.pause()        # before an update (sync training): a vLLM server in sleep
                              # mode sleeps, giving the learner its GPU memory
        engine.publish(model, version)   # after an update: the engine samples from it
        engine.url            # a completion server Ray workers can sample from (or None)

* ``hf`` (default): `BatchedHFSampler` in the trainer's process, sharing the learner's
  weights: nothing to sync, same dtype (fp32 on CPU) as the learner.
* ``vllm``: a vLLM server tracerl starts and owns (`tracerl.engines.vllm`), sampled
  through `RemoteSampler` (token ids in and out, with log-probs). LoRA runs hot-load each
  update's adapters, full fine-tuning reloads the weights in place; every turn carries the
  version that sampled it. A server that died is restarted (and given the current weights)
  before the next step or evaluation; episodes it failed are the environment's
  infrastructure failures. The server is stopped on every exit path, a trainer killed with
  ``kill -9`` included (`tracerl.engines.guard`). On a GPU the server shares the learner's
  GPU (``model.vllm.gpu_memory_utilization``, ``sleep_mode``, ``weight_sync: ipc``;
  unmeasured there, docs/gpu.md).

A vLLM server samples in bf16 by default (fast on this CPU's AMX) while the learner trains in
fp32, so the sampler's log-probs differ from the learner's: the truncated importance
sampling correction (``trainer.tis_cap``) is on by default, and the dashboard plots the
sampler-learner log-prob gap every step (``train/logprob_gap_mean``).

`tracerl.engines.judge_client` is the other model endpoint a run may call: a reward judge
behind any OpenAI-compatible chat endpoint (`tracerl.rewards.judge`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tracerl.rollout.episode import Policy

Log = Callable[[str], None]


class HFEngine:
    """The in-process engine: the policy's own sampler shares the learner's weights."""

    kind = "hf"
    url: str | None = None

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def push(self, model: Any, version: int) -> str | None:
        return None

    def publish(self, model: Any, version: int) -> None:
        pass

    def pause(self) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        return {}


class VLLMEngine:
    """A vLLM server of this process's, its weight sync and a `RemoteSampler` to it."""

    kind = "vllm"

    def __init__(self, cfg: Any, bundle: Any, policy: Policy, run_dir: Path, log: Log) -> None:
        from tracerl.engines.vllm import (
            GPU_MEMORY_UTILIZATION,
            ServerSettings,
            VLLMServer,
            served_name,
        )
        from tracerl.engines.vllm_python import find_vllm_python
        from tracerl.rollout.remote import RemoteSampler

        v, r = cfg.model.vllm, cfg.trainer.rollout
        self.cfg, self.bundle, self.log_line = cfg, bundle, log
        self.folder = run_dir / "engine"
        self.lora = cfg.model.lora is not None
        gpu = _learner_gpu(cfg.model.device)  # the server runs where the learner does
        if gpu is None:
            ignored = [k for k in ("sleep_mode", "gpu_memory_utilization") if getattr(v, k)]
            ignored += ["weight_sync=ipc"] if v.weight_sync == "ipc" else []
            if ignored:
                log(
                    f"warning: model.vllm.{', '.join(ignored)}: GPU options, ignored: the "
                    "vLLM server runs on the CPU here (weights sync through files)"
                )
        settings = ServerSettings(
            python=find_vllm_python(v.python),
            dtype=v.dtype,
            host=v.host,
            port=v.port,
            kv_cache_gb=v.kv_cache_gb,
            max_model_len=v.max_model_len or _context_length(bundle.model, 4096),
            # sync training alternates sampling and learning: sampling gets every core
            threads=v.threads or len(os.sched_getaffinity(0)),
            start_timeout_s=v.start_timeout_s,
            executor=v.executor,
            lora_rank=cfg.model.lora.r if self.lora else None,
            seed=cfg.trainer.seed,
            extra_args=tuple(v.extra_args),
            device="cpu" if gpu is None else "cuda",
            gpu=gpu,
            gpu_memory_utilization=v.gpu_memory_utilization or GPU_MEMORY_UTILIZATION,
            sleep_mode=v.sleep_mode and gpu is not None,
            weight_sync="ipc" if v.weight_sync == "ipc" and gpu is not None else "files",
        )
        # LoRA keeps its base weights through the sleep (level 1: offloaded to CPU memory);
        # full fine-tuning lets them go (level 2): the push after the update replaces them
        self.sleep_level = 1 if self.lora else 2
        self.asleep = False
        self.name = served_name(bundle.spec)
        self.server = VLLMServer(
            base_folder(bundle, self.folder),
            self.name,
            settings,
            self.folder / "vllm.log",
            on_stage=log,
        )
        self.sampler = RemoteSampler(
            "http://unstarted",
            self.name,
            temperature=cfg.model.temperature,
            timeout_s=r.sampler_timeout_s,
            retries=r.sampler_retries,
        )
        self.policy = dataclasses.replace(policy, sampler=self.sampler)
        self.sync: Any = None
        self.url: str | None = None
        self.sync_s = 0.0
        self.restarts = 0

    def start(self) -> None:
        t0 = time.perf_counter()
        self._connect(self.server.start())
        compiled = {"cached": ", compiled graphs from the cache", "compiled": ", compiled"}
        self.log_line(
            f"vLLM engine ({self.server.settings.dtype}) up at {self.url} in "
            f"{time.perf_counter() - t0:.0f} s{compiled.get(self.server.compile or '', '')}"
        )

    def _connect(self, url: str) -> None:
        from tracerl.engines.vllm_weights import FullWeightSync, IpcWeightSync
        from tracerl.rollout.weight_sync import LoraAdapterSync

        self.url = url
        self.sampler.base_url = url
        self.sampler.model = self.name
        self.asleep = False  # a server just started is awake
        s = self.server.settings
        if self.lora:
            self.sync = LoraAdapterSync(url, self.name, self.folder.parent / "adapters")
        elif s.weight_sync == "ipc":
            self.sync = IpcWeightSync(url, s.dtype)
        else:
            self.sync = FullWeightSync(url, self.folder / "weights", s.dtype)

    def _sleep_route(self, route: str) -> None:
        from tracerl.rollout.weight_sync import post

        post(
            f"{self.url}{route}",
            None,
            300,
            missing_route="sleep mode needs VLLM_SERVER_DEV_MODE=1 and --enable-sleep-mode",
        )

    def pause(self) -> None:
        """Before the learner's update (sync training): a server started in sleep mode
        (``model.vllm.sleep_mode``, on the learner's GPU) sleeps, giving the update its
        memory; the next `push` wakes it. Otherwise nothing. A server that cannot sleep
        (gone, or refusing) is said so and left as it is: the update runs all the same, and
        the next `push` restarts a server that died."""
        if not self.server.settings.sleep_mode or self.asleep or self.url is None:
            return
        try:
            self._sleep_route(f"/sleep?level={self.sleep_level}")
        except RuntimeError as e:
            self.log_line(f"warning: the vLLM server could not sleep for the update ({e})")
            return
        self.asleep = True

    def _wake(self) -> None:
        if self.asleep:
            self._sleep_route("/wake_up")
            self.asleep = False

    def ensure_running(self) -> None:
        """A server that died (crashed, killed) is started again; `push` then gives it the
        current weights."""
        if self.server.healthy():
            return
        self.restarts += 1
        self.log_line(
            f"the vLLM server is gone (restart {self.restarts}); starting it again "
            f"(its log: {self.server.log})"
        )
        self._connect(self.server.restart())

    def push(self, model: Any, version: int) -> str | None:
        """`WeightSync.push`: make the server sample from `model` (`version`); returns the
        model name to ask for (LoRA: the adapter's), or None (unchanged)."""
        self.ensure_running()
        t0 = time.perf_counter()
        try:
            self._wake()  # asleep since `pause`: awake before its weights change
            name = self.sync.push(model, version)
        except RuntimeError as e:  # it died during the sync: once more, on a new server
            self.log_line(f"weight sync failed ({e}); restarting the vLLM server")
            self.server.stop()
            self.ensure_running()
            name = self.sync.push(model, version)
        self.sync_s = time.perf_counter() - t0
        return name

    def publish(self, model: Any, version: int) -> None:
        name = self.push(model, version)
        self.sampler.model = name or self.name
        self.sampler.policy_version = version

    def metrics(self) -> dict[str, float]:
        return {"time/weight_sync_s": self.sync_s, "engine/restarts": float(self.restarts)}

    def close(self) -> None:
        # the sampler's HTTP clients belong to event loops that have ended: nothing to close
        self.server.stop()


Engine = HFEngine | VLLMEngine


@contextlib.contextmanager
def open_engine(
    cfg: Any, bundle: Any, policy: Policy, run_dir: Path, log: Log = print
) -> Iterator[Engine]:
    """The configured engine (``model.engine``), started; stopped on exit."""
    if cfg.model.engine == "hf":
        yield HFEngine(policy)
        return
    engine = VLLMEngine(cfg, bundle, policy, run_dir, log)
    try:
        engine.start()
        yield engine
    finally:
        engine.close()


def _learner_gpu(device: str) -> int | None:
    """The index of the GPU the learner trains on (``model.device``, resolved as the trainer
    resolves it): the vLLM server shares it. None: the learner, and the server, are on the
    CPU."""
    from tracerl.models.placement import resolve_device

    resolved = resolve_device(device)
    if resolved.type != "cuda":
        return None
    return resolved.index or 0


def _context_length(model: Any, cap: int) -> int:
    n = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return min(int(n), cap) if n else cap


def base_folder(bundle: Any, workdir: Path) -> Path:
    """A Hugging Face folder with the model's initial weights (LoRA adapters left out) and
    tokenizer, for the server to load: the model cache's or the user's folder when the model
    came from one, else written once to the cache (``$TRACERL_CACHE/vllm/base/``), named by
    the model and a hash of its weights. The folder's path is part of vLLM's compile-cache
    key: a folder of its own per run (as ``workdir/base`` was) made every start compile
    again. `workdir` is kept for callers; nothing is written there."""
    import hashlib

    import torch
    from safetensors.torch import save_file

    from tracerl.cache import cache_dir, save_folder_atomically

    for key in ("cache", "path"):
        folder = Path(bundle.info.get(key) or "/nonexistent")
        if bundle.origin in ("cache", "gguf", "hf") and (folder / "config.json").is_file():
            return folder
    model = bundle.model
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    tensors = {}
    digest = hashlib.sha256()
    for key, value in sorted(base.state_dict().items()):
        if "lora_" in key:
            continue
        name = key.replace(".base_layer.", ".")
        tensors[name] = value.detach().to("cpu").clone().contiguous()
        digest.update(name.encode())
        digest.update(tensors[name].view(-1).view(torch.uint8).numpy().tobytes())
    label = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(bundle.model_id))
    target = cache_dir() / "vllm" / "base" / f"{label[:80]}-{digest.hexdigest()[:16]}"
    if (target / "model.safetensors").is_file():
        return target

    def write(folder: Path) -> None:
        folder.mkdir(parents=True)
        base.config.save_pretrained(folder)
        bundle.tokenizer.save_pretrained(folder)
        save_file(tensors, str(folder / "model.safetensors"))

    save_folder_atomically(target, write)
    return target
