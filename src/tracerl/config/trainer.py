"""The ``trainer`` section: the RL algorithm, the learner, sync or async training, and where
rollouts run (``trainer.rollout``: `tracerl.rollout.backend_config`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from tracerl.config.base import _Config
from tracerl.config.distill import DistillConfig
from tracerl.rewards.compose import ComponentSpec
from tracerl.rollout.backend_config import RolloutBackendConfig


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
    sample_weighting: Literal["episode", "sample"] = "episode"
    """How an episode of several samples (compacted, delegated to sub-agents, a template
    that strips earlier reasoning: `docs/long-horizon.md`) weighs in the loss: ``episode``
    (its samples share one episode's weight: each weighs 1/n inside the aggregation, so a
    compacted episode of five samples weighs what a one-sample episode weighs under the
    ``seq-mean-*`` modes, and its mean sample's length under ``token-mean``) or ``sample``
    (each sample weighs as a one-sample episode would). Every sample gets its episode's
    advantage either way, and the episode counts once in its group's baseline."""
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
    distill: DistillConfig | None = None
    """On-policy distillation (docs/distillation.md): a teacher scores every policy token
    of the student's own episodes; its per-token advantage (log p_teacher - log p_student)
    is added to the outcome's, weighted. None: off."""
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
    micro_batch_tokens: Annotated[int, Field(ge=16)] | Literal["auto"] = 4096
    """Padded tokens per micro-batch (a longer sequence gets one of its own). Gradients are
    accumulated over a step's micro-batches, so this trades memory for speed without
    changing the update. ``auto``: on a GPU, sized from its free memory when the learner
    starts (`tracerl.train.memory`: the free memory less the update's gradients and AdamW
    state, over an estimate of each token's activations; the run's log prints the figures);
    on a CPU 4096. An RL update that runs out of device memory before its optimizer
    step halves it and redoes the update (the same update; ``train/micro_batch_tokens``
    shows the size in use, kept for later steps); with several learner ranks, or at one row
    per micro-batch, it stops and says what to set. The warm start uses it too (there, one
    optimizer step per micro-batch)."""
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
    precision: Literal["auto", "fp32", "bf16-mixed", "bf16"] = "auto"
    """How the trained weights are kept and the forward computes (`tracerl.models.placement`,
    docs/gpu.md). ``fp32``: both fp32 (16 bytes a parameter with AdamW). ``bf16-mixed``: fp32
    master weights and optimizer state, the forward in bf16 under `torch.autocast` (the
    learner's, the reference's and the in-process sampler's; FSDP2 gathers bf16 shards); the
    standard recipe on GPUs. ``bf16``: weights and optimizer state in bf16 (8 bytes a
    parameter; updates smaller than bf16's precision are lost). ``auto``: fp32 where
    ``model.dtype`` resolves to float32 (a CPU), bf16-mixed where it resolves to bfloat16
    (a GPU)."""
    learner: LearnerPlacement = Field(default_factory=lambda: LearnerPlacement())
    """Across processes: data-parallel or sharded (``torchrun``); one process by default."""
    eval_every: int = Field(0, ge=0)
    """Evaluate every N steps (0: only before the first and after the last step)."""
    checkpoint_every: int = Field(1, ge=1)
    """Checkpoint every N steps (and always after the last step, or when a signal stops the
    run); ``--resume`` continues from the latest."""
    keep_last: int = Field(2, ge=1)
    """Checkpoints kept (the newest; older ones are deleted once a newer one is complete).
    Each holds the weights and the optimizer's state: about 1.6 GB for SmolLM2-135M in fp32
    (0.54 GB of weights and AdamW's two moments, 1.08 GB: what an exact resume needs; with
    LoRA only the adapters and theirs). The run says when it writes one, and what it wrote.
    `tracerl export RUN --out DIR` takes one away as a Hugging Face folder."""
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
    stop_unlearnable_steps: int | None = Field(3, ge=1)
    """Stop the run (exit 2, checkpoint written, resumable) when every episode of this many
    consecutive steps was ineligible for the same owner: the environment's (outages, a
    reset that raises) or the evaluator's (a reward that crashes or returns no number).
    Such steps teach nothing (`tracerl.train.futility`). None: never stop."""
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
