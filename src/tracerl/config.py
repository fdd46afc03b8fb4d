"""Typed configuration: nested pydantic models, YAML files, dotted overrides.

    cfg = load_config("configs/demo.yaml", ["trainer.lr=1e-5", "trainer.steps=3"])

Unknown keys and bad values fail before anything loads, naming the field path and what
was expected (``trainer.lr: Input should be a valid number (got 'fast')``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tracerl.rollout.budget import RolloutConfig

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class LoraConfig(_Config):
    r: int = Field(16, ge=1)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] = Field(default_factory=lambda: list(LORA_TARGETS))
    """Module names that get adapters (every attention and MLP projection by default)."""


class ModelConfig(_Config):
    spec: str = "smollm2-135m-instruct"
    """A model spec: smollm2-135m-instruct, tiny-random, tiny-chars or hf:<folder>."""
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature (the learner computes log-probs at the same temperature)."""
    max_batch_size: int = Field(32, ge=1)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """auto: fp32 on CPU (bf16 matmul is several times slower there), bf16 on a GPU."""
    lora: LoraConfig | None = None
    """LoRA adapters (needs `peft`); None trains every weight."""


class EnvConfig(_Config):
    name: str = "search"
    """A registered environment."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Passed to `make(name, **kwargs)` (e.g. corpus, protocol)."""
    parser: str | None = None
    """The action parser; None picks the model family's default."""
    tasks_per_step: int = Field(4, ge=1)
    train_split: str = "train"
    eval_split: str = "heldout"
    eval_tasks: int = Field(20, ge=1)
    adversarial_eval_tasks: int = Field(0, ge=0)
    """Also evaluate this many tasks of the ``adversarial`` split (search: look-alike, dead
    link, conflict and timeout traps), each kind its own curve on the dashboard; 0: none."""


class StalenessLR(_Config):
    """``lr_eff = lr * f(s)`` for a sample `s` policy versions old (async training)."""

    kind: Literal["off", "inverse", "exponential"] = "inverse"
    """``inverse``: f(s) = 1 / (1 + alpha s); ``exponential``: f(s) = gamma ** s."""
    alpha: float = Field(0.5, ge=0)
    gamma: float = Field(0.7, gt=0, le=1)


class RolloutBackendConfig(_Config):
    """Where episodes run (`tracerl.rollout.ray_workers`)."""

    backend: Literal["inprocess", "ray"] = "inprocess"
    """``ray``: environments and episode loops in Ray actors (the ``ray`` extra), sampling
    from a completion server the learner runs over its live weights."""
    workers: int = Field(2, ge=1)
    episodes_per_worker: int = Field(32, ge=1)
    """Episodes one worker runs at once (its actor's concurrency)."""
    worker_cpus: float = Field(1.0, gt=0)
    """CPUs Ray reserves per worker (tool-bound workers need little)."""
    max_attempts: int = Field(3, ge=1)
    """Losses of its worker an episode may see before it is an infrastructure failure."""
    max_restarts: int | None = Field(None, ge=0)
    """Replacement workers over the run; None: twice `workers`. With none left and no live
    worker, the run stops (resume it once the cause is fixed)."""
    sampler_timeout_s: float = Field(600.0, gt=0)
    """How long a worker waits for one turn from the server (queueing included)."""
    sampler_retries: int = Field(3, ge=0)
    """Retries of a turn the server did not answer, before the episode is an infra failure."""
    address: str | None = None
    """A Ray cluster to join (``auto``: this node's); None starts a local one."""
    serve_host: str = "127.0.0.1"
    """Where the learner's completion server listens (``0.0.0.0`` for workers on other
    nodes)."""
    serve_port: int = Field(0, ge=0)
    """0: any free port."""
    advertise_host: str | None = None
    """The address workers reach the server at; None: `serve_host` (with ``0.0.0.0``,
    this node's address as Ray sees it)."""
    sampler_url: str | None = None
    """An OpenAI-compatible server to sample from instead (vLLM, SGLang, `tracerl serve`
    elsewhere), kept in step with the learner by `weight_sync`."""
    served_model: str | None = None
    """The model name that server serves (vLLM's ``--served-model-name``); None: the
    model's spec."""
    weight_sync: str = "lora"
    """How `sampler_url`'s server gets each update: ``lora`` (adapters hot-loaded through
    ``/v1/load_lora_adapter``; needs ``model.lora``), or ``package.module:factory`` for a
    full-weight hook (`tracerl.rollout.weight_sync`)."""


class TrainerConfig(_Config):
    steps: int = Field(10, ge=0)
    group_size: int = Field(8, ge=2)
    advantage: Literal["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"] = "grpo"
    reward: Literal["search", "arithmetic", "coderepair"] = "search"
    """How episodes are scored: the layered search reward, the arithmetic digit reward, or
    the code-repair reward (hidden tests behind a forbidden-edit gate)."""
    lr: float = Field(1e-5, gt=0)
    epochs: int = Field(1, ge=1)
    micro_batch_tokens: int = Field(4096, ge=16)
    max_grad_norm: float = Field(1.0, gt=0)
    clip_low: float = Field(0.2, ge=0)
    clip_high: float = Field(0.28, ge=0)
    tis_cap: float | None = Field(2.0, gt=0)
    """Truncated importance sampling on the sampler's log-probs (episodes reused on resume
    may come from lost weights)."""
    agg: Literal[
        "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
    ] = "token-mean"
    kl_coef: float = Field(0.0, ge=0)
    """beta of a KL(policy || reference) loss term (reference: LoRA adapters disabled, or a
    frozen copy of the initial weights); 0: no KL, no reference."""
    kl_estimator: Literal["k1", "k2", "k3", "low_var_kl"] = "k3"
    """Per-token KL estimate (`tracerl.algos.kl`): k1, k2, k3, or low_var_kl (veRL's k3 with
    the log-ratio clamped to [-20, 20] and the estimate to [-10, 10])."""
    compile: bool = False
    """torch.compile the decoder for the learner's forward and backward."""
    gradient_checkpointing: bool = False
    """Recompute decoder activations in backward: less memory, ~30% more learner time."""
    eval_every: int = Field(0, ge=0)
    """Evaluate every N steps (0: only before the first and after the last step)."""
    checkpoint_every: int = Field(1, ge=1)
    seed: int = 0
    mode: Literal["sync", "async"] = "sync"
    """``async``: rollout workers keep sampling while the learner trains
    (`tracerl.train.async_loop`); ``sync``: sample a batch, then train on it."""
    max_staleness: int = Field(1, ge=0)
    """Async: the most policy versions a trained-on token may lag the learner; older
    samples are dropped and counted (`async/dropped_stale`), never trained on."""
    max_outstanding_groups: int | None = Field(None, ge=1)
    """Async: groups started and not yet trained on (running, or finished and waiting for
    the learner). Default ``(max_staleness + 1) x`` tasks per step. More keeps a learner
    busy that is slower than its slowest groups, at the price of groups that expire."""
    staleness_lr: StalenessLR = Field(default_factory=lambda: StalenessLR())
    timeouts: Literal["exclude", "grade"] = "exclude"
    """Episodes that ran out of wall time: left out of the gradient (``exclude``), or scored
    on what they did with the reward clamped to at most `timeout_reward_cap` (``grade``).
    Either way they are counted as timeouts, never as policy failures."""
    timeout_reward_cap: float = 0.0
    rollout: RolloutBackendConfig = Field(default_factory=lambda: RolloutBackendConfig())
    """Where episodes run: in this process (default) or in Ray rollout workers."""


class WarmStartConfig(_Config):
    """SFT on the environment's reference agent before RL (`tracerl.train.warm_start`)."""

    tasks: int = Field(32, ge=1)
    """How many training tasks the reference agent plays (its successes are imitated)."""
    epochs: int = Field(1, ge=1)
    lr: float = Field(5e-5, gt=0)
    seed: int = 1
    """Which training tasks (a different draw from the RL steps' tasks)."""


class ReportConfig(_Config):
    sinks: list[Literal["jsonl", "tensorboard", "wandb"]] = Field(default_factory=lambda: ["jsonl"])
    """Where metrics go. ``metrics.jsonl`` is always written (the report reads it); add
    ``tensorboard`` (``RUN/tensorboard``, needs the ``track`` extra) or ``wandb`` (offline,
    ``RUN/wandb``; sync later with ``wandb sync``)."""
    wandb_project: str = "tracerl"


class RunConfig(_Config):
    name: str = "run"
    out_dir: str = "runs"
    model: ModelConfig = Field(default_factory=ModelConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    warm_start: WarmStartConfig | None = None
    """None: RL from the model as loaded."""
    report: ReportConfig = Field(default_factory=lambda: ReportConfig())

    @model_validator(mode="after")
    def _remote_sampling(self) -> RunConfig:
        r = self.trainer.rollout
        if r.sampler_url is not None and r.backend != "ray":
            raise ValueError("trainer.rollout.sampler_url needs trainer.rollout.backend=ray")
        if r.served_model is not None and r.sampler_url is None:
            raise ValueError(
                "trainer.rollout.served_model names the model of the server at sampler_url; "
                "without sampler_url the learner serves its own weights under the model's spec"
            )
        if r.sampler_url is not None and r.weight_sync == "lora" and self.model.lora is None:
            raise ValueError(
                "trainer.rollout.weight_sync=lora hot-loads LoRA adapters into the server at "
                "sampler_url: set model.lora, or give a full-weight hook "
                "(weight_sync: package.module:factory)"
            )
        return self

    @property
    def run_dir(self) -> Path:
        return Path(self.out_dir) / self.name


class ConfigError(ValueError):
    pass


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``a.b.c=value`` (value parsed as YAML: numbers, booleans, lists, null)."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected key.path=value")
        path, raw = item.split("=", 1)
        keys = path.strip().split(".")
        node = data
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {k!r} is not a section")
        node[keys[-1]] = yaml.safe_load(raw) if raw.strip() else ""
    return data


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"{path}: no such config file")
        loaded = yaml.safe_load(path.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping at the top level")
        data = loaded
    data = apply_overrides(data, overrides or [])
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        where = f"{path}: " if path else ""
        lines = [
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']} (got {err.get('input')!r})"
            if err["loc"]
            else err["msg"].removeprefix("Value error, ")  # a check across fields
            for err in e.errors()
        ]
        raise ConfigError(where + "; ".join(lines)) from None


def dump_config(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
