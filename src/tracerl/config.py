"""Typed configuration: the nested pydantic models of a run config.

    cfg = tracerl.config_loading.load_config("configs/demo.yaml", ["trainer.lr=1e-5"])

Reading YAML files and dotted overrides, and explaining what does not validate (file, line,
key, "did you mean"), is `tracerl.config_loading`. Every key is documented in
docs/config.md (`tracerl.config_reference`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tracerl.envs.mcp.config import McpServer
from tracerl.errors import UserError
from tracerl.rewards.compose import ComponentSpec
from tracerl.rollout.budget import RolloutConfig

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


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
    kv_cache_gb: float = Field(1.0, gt=0)
    """CPU memory for its KV cache (vLLM would otherwise take most of the machine's)."""
    max_model_len: int | None = Field(None, ge=16)
    """The longest prompt plus completion it accepts; None: the model's context length, at
    most 4096 (the KV cache is sized for it)."""
    threads: int | None = Field(None, ge=1)
    """CPU cores for its compute (cores 0..threads-1); None: all of this process's cores
    (training alternates sampling and learning; vLLM's own default keeps one core for its
    scheduler, which on 2 cores halves its decode: 306 vs 380 tokens/s measured here)."""
    start_timeout_s: float = Field(600.0, gt=0)
    """How long a start may take before it is an error (a first start compiles kernels)."""
    extra_args: list[str] = Field(default_factory=list)
    """More ``vllm serve`` arguments, passed as they are."""


class ModelConfig(_Config):
    spec: str = "smollm2-135m-instruct"
    """A model spec: smollm2-135m-instruct, tiny-random, tiny-chars (and their -hd64 forms, which
    vLLM can serve) or hf:<folder>."""
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
    """auto: fp32 on CPU (bf16 matmul is several times slower there), bf16 on a GPU."""
    lora: LoraConfig | None = None
    """LoRA adapters (needs `peft`); None trains every weight."""
    engine: Literal["hf", "vllm"] = "hf"
    """What samples the policy's turns (`tracerl.engines`): ``hf``, the trainer's own model
    (shares the learner's weights); ``vllm``, a vLLM server tracerl starts, keeps in step
    after every update (LoRA hot-load or an in-place weight reload) and stops. Used by
    train, eval, readiness and the Ray backend."""
    vllm: VLLMConfig = Field(default_factory=lambda: VLLMConfig())
    """The vLLM server's options (``engine: vllm``)."""


class EnvConfig(_Config):
    name: str = "search"
    """The environment: a built-in (search, arithmetic, coderepair, refund_desk), an installed
    package's entry point (group ``tracerl.envs``), or an import path ``package.module:Class``."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Passed to `make(name, **kwargs)` (e.g. corpus, protocol)."""
    mcp: list[McpServer] = Field(default_factory=list)
    """MCP servers whose tools the environment (a ToolEnv) offers besides its own: each a
    ``command`` tracerl starts (stdio) or a ``url`` (streamable HTTP). Read-only tools run;
    the others are writes, budgeted and dry-run (docs/mcp.md, the ``mcp`` extra)."""
    parser: str | None = None
    """The action parser; None picks the model family's default."""
    tasks_per_step: int = Field(4, ge=1)
    """Training tasks drawn per RL step; each is played `trainer.group_size` times, so a step
    trains on ``tasks_per_step x group_size`` episodes."""
    train_split: str | None = None
    """The split training tasks come from; None: ``train`` if the environment declares it,
    else its first declared split (``train`` when it declares none)."""
    eval_split: str | None = None
    """The held-out split evaluations use; None: the first of heldout, test, validation, eval,
    dev the environment declares, else its first split other than the training split and
    ``adversarial`` (``heldout`` when it declares none). Naming the training split is allowed
    with a warning: evaluations then measure trained-on tasks."""
    eval_tasks: int = Field(20, ge=1)
    """Tasks of `eval_split` each evaluation plays, one episode each: the same tasks every
    time (drawn from `trainer.seed`), so evaluations compare."""
    adversarial_eval_tasks: int = Field(0, ge=0)
    """Also evaluate this many tasks of the ``adversarial`` split (search: look-alike, dead
    link, conflict and timeout traps), each kind its own curve on the dashboard; 0: none."""


class LearnerPlacement(_Config):
    """How the learner spans processes (`tracerl.train.distributed`); launch the run with
    ``torchrun --nproc-per-node N -m tracerl train CONFIG``. See docs/scaleout.md."""

    strategy: Literal["single", "ddp", "fsdp2"] = "single"
    """``single``: one process. ``ddp``: each rank a whole copy of the model, a share of
    each step's micro-batches (by token count), gradients summed across ranks. ``fsdp2``:
    parameters, gradients and optimizer state sharded across ranks (``fully_shard``), each
    decoder layer gathered only while it runs. Either way the step's loss, gradient norm
    and update are the single-process ones; rank 0 drives rollouts and writes the run."""
    timeout_s: float = Field(600.0, gt=0)
    """The most one learner collective may wait for a rank that hangs before the run stops
    with an error (a rank that dies is seen at once)."""
    wait_timeout_s: float = Field(86_400.0, gt=0)
    """The most the learner ranks wait for rank 0's next call (its rollouts and evaluations
    run in between)."""


class StalenessLR(_Config):
    """``lr_eff = lr * f(s)`` for a sample `s` policy versions old (async training)."""

    kind: Literal["off", "inverse", "exponential"] = "inverse"
    """``inverse``: f(s) = 1 / (1 + alpha s); ``exponential``: f(s) = gamma ** s."""
    alpha: float = Field(0.5, ge=0)
    """``inverse``: how fast the rate falls per version of staleness (0: not at all)."""
    gamma: float = Field(0.7, gt=0, le=1)
    """``exponential``: the factor kept per version of staleness (1: no slowdown)."""


class DynamicSamplingConfig(_Config):
    """Groups without signal are replaced (`tracerl.train.dynamic_sampling`; DAPO)."""

    max_rounds: int = Field(3, ge=2)
    """Sampling rounds per step, the first included: the cap on resampling (veRL's
    ``max_num_gen_batches``). After it the step trains on the informative groups it has."""
    max_oversample: float = Field(2.0, ge=1)
    """A replacement round draws at most this many times `env.tasks_per_step` groups."""


class RolloutBackendConfig(_Config):
    """Where episodes run (`tracerl.rollout.ray_workers`)."""

    backend: Literal["inprocess", "ray"] = "inprocess"
    """``ray``: environments and episode loops in Ray actors (the ``ray`` extra), sampling
    from a completion server the learner runs over its live weights."""
    workers: int = Field(2, ge=1)
    """Ray rollout workers (actors) kept running (``backend: ray`` only)."""
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
    """RL steps (policy updates), each on `env.tasks_per_step` tasks x `group_size` episodes.
    0: only evaluate the model as loaded (after the warm start, if one is set)."""
    group_size: int = Field(8, ge=2)
    """Episodes per task in a step: the group whose rewards give each other's baseline."""
    advantage: Literal["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"] = "grpo"
    """The advantage estimator (`tracerl.algos.advantages`): ``grpo`` (reward minus the
    group mean, over the group std), ``dr_grpo`` (minus the group mean, no std), ``rloo``
    (minus the mean of the other members), ``reinforce_pp_baseline`` (minus the group mean,
    then whitened over the batch). Episodes not eligible for the gradient get 0."""
    credit: Literal["episode", "turn_returns", "step_groups"] = "episode"
    """How credit reaches the turns (`tracerl.algos.turn_advantages`): ``episode`` (the
    episode's advantage on all its turns), ``turn_returns`` (each turn's return against the
    other members that reached the same turn), ``step_groups`` (the episode's advantage,
    plus each turn's return against other episodes' turns from the same state, GiGPO-style).
    A turn whose environment step failed gets 0."""
    credit_gamma: float = Field(1.0, ge=0, le=1)
    """``turn_returns``, ``step_groups``: the discount of later rewards in a turn's return."""
    step_group_weight: float = Field(1.0, ge=0)
    """``step_groups``: the weight of the step advantage beside the episode's."""
    dynamic_sampling: DynamicSamplingConfig | None = None
    """No step without signal (DAPO's dynamic sampling): a group whose advantages are all
    zero (e.g. its eligible rewards all equal, with credit per episode) is left out of the
    update and a replacement task is sampled, until the step has `env.tasks_per_step`
    informative groups or ``max_rounds`` rounds were sampled. Every sampled group is
    written and counted (``train/zero_signal_group_rate``, ``train/resampled_groups``).
    None: off (a zero-signal group then costs its sampling and teaches nothing)."""
    reward: str | None = None
    """How episodes are scored. None: the environment's own verifier (its ``reward`` method
    or ``reward_components``); a built-in (``search``, ``arithmetic``, ``coderepair``); an
    import path ``package.module:function``; or an entry point of group ``tracerl.rewards``
    (`tracerl.rewards.resolve`)."""
    reward_components: list[ComponentSpec] | None = None
    """The reward as layered components in the config (name, fn, layer, weight, gate, cap,
    params; ``fn``: a registered component, a method of the environment or an import path).
    Excludes `reward`."""
    lr: float = Field(1e-5, gt=0)
    """AdamW learning rate of the RL updates (async: scaled per update by `staleness_lr`)."""
    epochs: int = Field(1, ge=1)
    """Passes over a step's episodes per update, one optimizer step each (the PPO ratio is
    taken against the weights that sampled them)."""
    micro_batch_tokens: int = Field(4096, ge=16)
    """Padded tokens per micro-batch (a longer sequence gets one of its own). Gradients are
    accumulated over a step's micro-batches, so this trades memory for speed without
    changing the update. The warm start uses it too (there, one optimizer step per
    micro-batch)."""
    max_grad_norm: float = Field(1.0, gt=0)
    """Gradients are clipped to this global L2 norm before each optimizer step
    (``train/grad_norm`` logs the norm before clipping)."""
    clip_low: float = Field(0.2, ge=0)
    """PPO clip: the probability ratio is clipped below at 1 - clip_low."""
    clip_high: float = Field(0.28, ge=0)
    """PPO clip: the ratio is clipped above at 1 + clip_high (above `clip_low`: DAPO's
    clip-higher, which keeps exploration alive)."""
    tis_cap: float | None = Field(2.0, gt=0)
    """Truncated importance sampling, on by default: each policy token's loss is weighted by
    min(pi_learner / pi_sampler, tis_cap), from the sampler's own log-probs. It corrects the
    mismatch between the sampler and the learner: another engine or dtype (a bf16 vLLM
    server, ``model.engine: vllm`` or `trainer.rollout.sampler_url`, beside the fp32
    learner), as well as stale samples (async training; episodes reused on resume, which
    may come from lost weights). None disables it. ``train/logprob_gap_mean`` and
    ``train/sampler_kl`` measure the gap."""
    is_mask: Literal["token", "sequence", "geometric"] | None = None
    """Masked importance sampling (veRL's rollout correction, mode ``mask``): drop from the
    loss the policy tokens whose ratio pi_learner / pi_sampler is out of [`is_mask_low`,
    `is_mask_high`] (they keep counting in `agg`'s denominator). ``token``: each token on its
    own ratio; ``sequence``: a whole trajectory (usually the whole episode, every turn) on
    the product of its policy tokens' ratios; ``geometric``: on their geometric mean (which
    does not grow with length). Use it when the sampler is another engine or dtype than the
    learner (a bf16 vLLM server against the fp32 learner): `tis_cap` only bounds large
    ratios, the mask also drops tokens the two disagree on either way. ``sequence`` suits
    long multi-turn episodes, where one turn sampled off the learner's distribution makes
    the whole episode's credit suspect: it drops the episode as a whole (the product drifts
    with length, so widen the range for long episodes, or use ``geometric``). Composes with
    `tis_cap` (the truncated weight applies to the tokens kept). None: off.
    ``train/is_masked_frac`` logs the share of policy tokens dropped."""
    is_mask_low: float = Field(0.5, gt=0)
    """`is_mask`: the lowest ratio pi_learner / pi_sampler kept (below `is_mask_high`)."""
    is_mask_high: float = Field(2.0, gt=0)
    """`is_mask`: the highest ratio pi_learner / pi_sampler kept."""
    agg: Literal[
        "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
    ] = "token-mean"
    """How per-token losses reduce to the step's loss (`tracerl.algos.losses.aggregate`):
    ``token-mean`` (every policy token weighs the same; DAPO), ``seq-mean-token-sum``,
    ``seq-mean-token-mean`` (every sequence weighs the same; the original GRPO) or
    ``seq-mean-token-sum-norm`` (token sums over one constant length; Dr. GRPO)."""
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
    learner: LearnerPlacement = Field(default_factory=lambda: LearnerPlacement())
    """Across processes: data-parallel or sharded (``torchrun``); one process by default."""
    eval_every: int = Field(0, ge=0)
    """Evaluate every N steps (0: only before the first and after the last step)."""
    checkpoint_every: int = Field(1, ge=1)
    """Checkpoint every N steps (and always after the last step, or when a signal stops the
    run); ``--resume`` continues from the latest."""
    seed: int = 0
    """Seeds each step's training tasks, the sampler, the LoRA adapters' initial weights and
    the evaluation tasks: one seed, one run."""
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
    """Async: how the learning rate slows for samples from older policy versions (ignored by
    ``sync``)."""
    timeouts: Literal["exclude", "grade"] = "exclude"
    """Episodes that ran out of wall time: left out of the gradient (``exclude``), or scored
    on what they did with the reward clamped to at most `timeout_reward_cap` (``grade``).
    Either way they are counted as timeouts, never as policy failures."""
    timeout_reward_cap: float = 0.0
    """With ``timeouts: grade``: a timed-out episode's reward is at most this (ignored with
    ``exclude``)."""
    rollout: RolloutBackendConfig = Field(default_factory=lambda: RolloutBackendConfig())
    """Where episodes run: in this process (default) or in Ray rollout workers."""

    @model_validator(mode="after")
    def _compile_unsharded(self) -> TrainerConfig:
        if self.compile and self.learner.strategy == "fsdp2":
            raise ValueError(
                "trainer.compile is not supported with trainer.learner.strategy=fsdp2: "
                "turn one of them off"
            )
        return self

    @model_validator(mode="after")
    def _is_mask_range(self) -> TrainerConfig:
        if self.is_mask_low >= self.is_mask_high:
            raise ValueError(
                f"is_mask_low ({self.is_mask_low}) must be below is_mask_high "
                f"({self.is_mask_high}): the importance-sampling mask keeps ratios between them"
            )
        return self


class WarmStartConfig(_Config):
    """SFT on the environment's reference agent before RL (`tracerl.train.warm_start`)."""

    tasks: int = Field(32, ge=1)
    """How many training tasks the reference agent plays (its successes are imitated)."""
    epochs: int = Field(1, ge=1)
    """Passes over the kept reference episodes (one optimizer step per micro-batch of
    `trainer.micro_batch_tokens`)."""
    lr: float = Field(5e-5, gt=0)
    """AdamW learning rate of the warm start's SFT."""
    seed: int = 1
    """Which training tasks (a different draw from the RL steps' tasks)."""


class AgentConfig(_Config):
    """An agent someone already wrote, trained through the gateway (`tracerl.gateway`)."""

    entry: str
    """The agent, ``package.module:function``: ``async def solve(task, client) -> answer``,
    `client` a standard ``openai.AsyncOpenAI`` (a plain function gets ``openai.OpenAI``).
    Each episode is one call; what it returns is the answer the reward reads."""
    timeout_s: float = Field(300.0, gt=0)
    """An agent call's wall-time limit (``rollout.budgets.wall_time_s`` wins when smaller):
    past it the call is cancelled and the episode is a ``timeout``."""
    policy_exceptions: list[str] = Field(default_factory=list)
    """Exception classes (``module:Class``, e.g. ``json:JSONDecodeError``) that mean the
    agent could not use the model's answer: such a crash is the policy's fault. Any other
    exception the agent raises is the environment's (unless the model's last turn was
    unreadable)."""
    host: str = "127.0.0.1"
    """Where the gateway listens (the agents run in this process; another host only for
    agents that call it from elsewhere)."""
    port: int = Field(0, ge=0)
    """0: a free port."""


class ReportConfig(_Config):
    sinks: list[Literal["jsonl", "tensorboard", "wandb"]] = Field(default_factory=lambda: ["jsonl"])
    """Where metrics go. ``metrics.jsonl`` is always written (the report reads it); add
    ``tensorboard`` (``RUN/tensorboard``, needs the ``track`` extra) or ``wandb`` (offline,
    ``RUN/wandb``; sync later with ``wandb sync``)."""
    wandb_project: str = "tracerl"
    """The W&B project the offline run is filed under (with ``wandb`` in `sinks`)."""


class RunConfig(_Config):
    name: str = Field("run", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    """The run's name (letters, digits, ``.``, ``_``, ``-``; no path): its directory is
    ``out_dir/name`` (an existing run there is refused unless resumed); also the W&B run's
    name."""
    out_dir: str = "runs"
    """The folder run directories are made in."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    """The policy: which model, where it runs, how it samples, LoRA."""
    env: EnvConfig = Field(default_factory=EnvConfig)
    """The environment, its parser, and the tasks of training and evaluation."""
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    """The RL algorithm, the learner, sync or async training, and where rollouts run."""
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    """What shapes one episode: budgets, the terminal reserve, retries, token limits."""
    warm_start: WarmStartConfig | None = None
    """None: RL from the model as loaded."""
    agent: AgentConfig | None = None
    """An agent function to train through the gateway instead of tracerl's own episode
    runner (``agent: mypkg.agent:solve`` is short for ``agent: {entry: ...}``); the
    environment then supplies the tasks and the reward. None: the environment's tools,
    run by tracerl."""
    report: ReportConfig = Field(default_factory=lambda: ReportConfig())
    """Where metrics go."""

    @field_validator("agent", mode="before")
    @classmethod
    def _agent_shorthand(cls, value: Any) -> Any:
        return {"entry": value} if isinstance(value, str) else value

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
        if self.model.engine == "vllm" and r.sampler_url is not None:
            raise ValueError(
                "model.engine=vllm starts a vLLM server of the run's own; "
                "trainer.rollout.sampler_url names a server someone else runs: set one of them"
            )
        if self.model.engine == "vllm" and self.trainer.mode == "async" and not self.model.lora:
            raise ValueError(
                "model.engine=vllm with trainer.mode=async needs model.lora: a full-weight "
                "reload cannot say which version sampled a turn in flight across it, while an "
                "adapter's name can; use trainer.mode=sync for full fine-tuning on vLLM"
            )
        if r.sampler_url is not None and r.weight_sync == "lora" and self.model.lora is None:
            raise ValueError(
                "trainer.rollout.weight_sync=lora hot-loads LoRA adapters into the server at "
                "sampler_url: set model.lora, or give a full-weight hook "
                "(weight_sync: package.module:factory)"
            )
        if self.agent is not None and r.backend == "ray":
            raise ValueError(
                "agent runs its episodes through the training process's gateway; "
                "trainer.rollout.backend=ray is not supported with it: use inprocess"
            )
        return self

    @property
    def run_dir(self) -> Path:
        return Path(self.out_dir) / self.name


class ConfigError(UserError, ValueError):
    """A config that cannot run: what, where (file, line, key) and what to do."""


def dump_config(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
