"""One run, built once from its config.

A `Run` is everything a config turns into: the checked config and what it resolved to
(`tracerl.preflight`: the environment, its probe instance, the reward), the model bundle,
the batched sampler and the policy around them, the environment factory, each step's tasks,
the learner's settings and the GRPO step's. It also opens what runs beside a run: the
sampling engine (`tracerl.engines`), where episodes run (in process, Ray workers, an agent
harness through the gateway), the metrics sinks and the learner.

`tracerl train` (sync and async), `tracerl eval CONFIG`, `tracerl readiness`, the learner
ranks under ``torchrun`` and `tracerl demo` all build through it, so one config means one
thing to each of them (`Run.describe` says what was built; a test compares it across the
commands), and the training loop (`tracerl.train.loop`) reads as the algorithm.

Parts are built on first use and kept: a learner rank (`tracerl.train.distributed`) builds
the model and the learner's settings, never a sampler or an environment.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator, Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

from tracerl.algos.losses import ClipConfig
from tracerl.config import ConfigError, RunConfig
from tracerl.engines import Engine, open_engine
from tracerl.envs import get_parser
from tracerl.models.placement import Placement, place
from tracerl.models.placement import resolve as resolve_placement
from tracerl.preflight import Prepared, check_model, prepare
from tracerl.report.sinks import MetricsLog
from tracerl.rollout import BatchedHFSampler
from tracerl.rollout.groups import RolloutBackend
from tracerl.rollout.runner import Policy
from tracerl.train.configure import Config, run_config
from tracerl.train.distill import build_distiller
from tracerl.train.distributed.group import current
from tracerl.train.dynamic_sampling import DynamicSampling, replacement_tasks
from tracerl.train.grpo import GRPOConfig
from tracerl.train.learner import Learner, LearnerConfig
from tracerl.train.lora import apply_lora
from tracerl.train.memory import micro_batch_tokens

Log = Callable[[str], None]


class Run:
    """A run's parts, built once from its config (`prepared`: `tracerl.preflight.prepare`'s
    result; `Run.from_config` prepares it)."""

    def __init__(self, prepared: Prepared) -> None:
        self.prepared = prepared

    @classmethod
    def from_config(
        cls,
        config: Config = None,
        *,
        env: Any = None,
        reward: Any = None,
        overrides: list[str] | Mapping[str, Any] | None = None,
        **sections: Any,
    ) -> Run:
        """The run of `config` (a `RunConfig`, a dict of config keys, a YAML path, or None:
        the defaults), with keyword `sections` merged into it (``trainer={"steps": 3}``,
        ``name="x"``), `env` (``env.name``: a name, or an environment class or factory),
        `reward` (``trainer.reward``: a name, a function, or a list of components) and
        `overrides` (dotted keys, as the command line takes them) applied
        (`tracerl.train.configure`). Checked, refusing what the run cannot complete, before
        anything loads."""
        if env is not None:
            sections["env"] = env
        if isinstance(config, RunConfig) and reward is None and not overrides and not sections:
            cfg = config
        else:
            cfg = run_config(config, reward=reward, overrides=overrides, **sections)
        try:
            return cls(prepare(cfg))
        except ConfigError as e:  # named after the file, as `tracerl train FILE` names it
            if isinstance(config, str | Path):
                raise ConfigError(f"{config}: {e.message}", e.hint) from e
            raise

    @classmethod
    def model_only(cls, cfg: RunConfig) -> Run:
        """A run of `cfg`'s model, sampler, policy and environment factory alone, its
        splits and reward not resolved (`tracerl demo` samples episodes and scores none):
        only the model spec is checked. `probe` and `reward` are None."""
        check_model(cfg.model.spec)
        return cls(Prepared(cfg, env=None, probe=None, reward=None))  # type: ignore[arg-type]

    # -- what the config resolved to --------------------------------------------------

    @property
    def cfg(self) -> RunConfig:
        """The checked config (the environment's split defaults filled in)."""
        return self.prepared.cfg

    @property
    def probe(self) -> Any:
        """An instance of the environment: task sampling, citation lookups."""
        return self.prepared.probe

    @property
    def reward(self) -> Any:
        """The run's reward (`tracerl.rewards.run_reward.RunReward`)."""
        return self.prepared.reward

    def rehearse(self) -> None:
        """One episode before the model loads or anything is written: the environment
        resets on a training task and the reward scores an empty answer
        (`tracerl.preflight.rehearsal`); a `ConfigError` if either would fail every
        episode of the run."""
        from tracerl.preflight import reward_key
        from tracerl.preflight.rehearsal import rehearse

        cfg = self.cfg
        task = self.probe.sample_tasks(1, seed=cfg.trainer.seed, split=cfg.env.train_split)[0]
        rehearse(cfg, task, self.reward, reward_key=reward_key(cfg))

    # -- the model and the policy -----------------------------------------------------

    @cached_property
    def trained_placement(self) -> Placement:
        """Where a model of the run lives and in which precision it trains (``model.device``,
        ``model.dtype``, ``trainer.precision``: `tracerl.models.placement`)."""
        m = self.cfg.model
        return resolve_placement(m.device, m.dtype, self.cfg.trainer.precision)

    @property
    def placement(self) -> Placement:
        """The run's own model's: with LoRA, the frozen base's (its weights in the compute
        dtype, the adapters fp32)."""
        full = self.trained_placement
        return full.for_lora_base() if self.cfg.model.lora is not None else full

    @cached_property
    def bundle(self) -> Any:
        """The configured model's bundle, placed (device, dtype), with LoRA when configured:
        what every learner rank builds."""
        return self.model_bundle(self.cfg.model.spec)

    def model_bundle(self, spec: str) -> Any:
        """`spec`'s bundle placed as the configured model is (LoRA only on the configured
        model: another spec is, e.g., an SFT checkpoint to compare with)."""
        from tracerl.models import load

        cfg = self.cfg
        bundle = load(spec)
        lora = cfg.model.lora is not None and spec == cfg.model.spec
        bundle.model = place(bundle.model, self.placement if lora else self.trained_placement)
        if lora:
            bundle.model = apply_lora(
                bundle.model, **cfg.model.lora.model_dump(), seed=cfg.trainer.seed
            )
        return bundle

    @cached_property
    def sampler(self) -> BatchedHFSampler:
        """The batched sampler over the run's model; its ``policy_version`` is the run's."""
        return self.sampler_of(self.bundle)

    def sampler_of(self, bundle: Any) -> BatchedHFSampler:
        m = self.cfg.model
        return BatchedHFSampler(
            bundle.model,
            temperature=m.temperature,
            seed=self.cfg.trainer.seed,
            max_batch_size=m.max_batch_size,
            kv_cache=m.kv_cache,
            compile=m.compile,
            prefix_cache_gb=m.prefix_cache_gb,
        )

    @cached_property
    def policy(self) -> Policy:
        """The policy in this process: the model, its sampler and the action parser."""
        return Policy.from_bundle(self.bundle, self.sampler, self._parser())

    def policy_of(self, spec: str) -> Policy:
        """Another model (`spec`: an SFT checkpoint, ``hf:DIR``) as a policy of this run:
        placed, sampled and parsed as the run's own."""
        bundle = self.model_bundle(spec)
        return Policy.from_bundle(bundle, self.sampler_of(bundle), self._parser())

    def _parser(self) -> Any:
        return get_parser(self.cfg.env.parser) if self.cfg.env.parser else None

    # -- the environment and its tasks ------------------------------------------------

    @cached_property
    def env(self) -> Callable[[], Any]:
        """A fresh environment per episode (picklable: Ray workers build it too)."""
        return self.cfg.env.factory()

    def tasks(self, step: int, n: int | None = None) -> list[dict[str, Any]]:
        """Step `step`'s training tasks: a function of the seed and the step (the data order
        survives a resume)."""
        cfg = self.cfg
        return self.probe.sample_tasks(
            n or cfg.env.tasks_per_step,
            seed=cfg.trainer.seed * 1_000_003 + step,
            split=cfg.env.train_split,
        )

    def refill(self, step: int) -> Callable[[int, int, set[str]], list[dict[str, Any]]]:
        """Dynamic sampling's replacement tasks for step `step` (round, n, ids drawn)."""

        def draw(round_: int, n: int, drawn: set[str]) -> list[dict[str, Any]]:
            return replacement_tasks(self.cfg, self.probe, step, round_, n, drawn)

        return draw

    # -- the learner ------------------------------------------------------------------

    @cached_property
    def micro_batch_sizing(self) -> tuple[int, str]:
        """``trainer.micro_batch_tokens`` as a number (``auto``: sized from the device's free
        memory, `tracerl.train.memory`), and how it was reached (the run prints it)."""
        t = self.cfg.trainer
        model = self.bundle.model if t.micro_batch_tokens == "auto" else None  # a number: none
        return micro_batch_tokens(
            t.micro_batch_tokens, model, checkpointing=t.gradient_checkpointing
        )

    @cached_property
    def learner_config(self) -> LearnerConfig:
        t = self.cfg.trainer
        return LearnerConfig(
            lr=t.lr,
            epochs=t.epochs,
            micro_batch_tokens=self.micro_batch_sizing[0],
            max_grad_norm=t.max_grad_norm,
            temperature=self.cfg.model.temperature,
            clip=ClipConfig(
                clip_low=t.clip_low,
                clip_high=t.clip_high,
                tis_cap=t.tis_cap,
                is_mask=t.is_mask,
                is_mask_low=t.is_mask_low,
                is_mask_high=t.is_mask_high,
                agg=t.agg,
            ),
            kl_coef=t.kl_coef,
            kl_estimator=t.kl_estimator,
            compile=t.compile,
            gradient_checkpointing=t.gradient_checkpointing,
        )

    @cached_property
    def grpo(self) -> GRPOConfig:
        t = self.cfg.trainer
        return GRPOConfig(
            group_size=t.group_size,
            advantage=t.advantage,
            credit=t.credit,
            sample_weighting=t.sample_weighting,
            credit_gamma=t.credit_gamma,
            step_group_weight=t.step_group_weight,
            dynamic_sampling=DynamicSampling.of(t.dynamic_sampling),
            distill=build_distiller(self.cfg, self.bundle.tokenizer),
            rollout=self.cfg.rollout,
            timeouts=t.timeouts,
            timeout_reward_cap=t.timeout_reward_cap,
        )

    def learner(self, *, follower: bool = False) -> Learner:
        """The learner over the run's model, with this launch's strategy: rank 0's sends
        each of its calls to the other ranks under ``torchrun``; a `follower` rank's makes
        the calls it receives (`tracerl.train.distributed.group.follow`)."""
        here = current()
        channel = None if follower else here.channel
        return Learner(self.bundle.model, self.learner_config, here.strategy(), channel=channel)

    # -- what runs beside it ----------------------------------------------------------

    def engine(self, run_dir: Path, log: Log = print) -> contextlib.AbstractContextManager[Engine]:
        """The configured sampling engine (``model.engine``) on the run's weights as they
        are, started; stopped on exit. Its ``policy`` is what samples."""
        return open_engine(self.cfg, self.bundle, self.policy, run_dir, log)

    @contextlib.contextmanager
    def rollouts(self, engine: Engine, *, workers: bool = True) -> Iterator[RolloutBackend | None]:
        """Where episodes run (None: tracerl's runner in this process): an agent harness of
        the user's through the gateway (``agent``), or, with `workers`, Ray actors
        (``trainer.rollout.backend: ray``). Started and stopped around the block."""
        cfg = self.cfg
        if cfg.agent is not None:
            from tracerl.gateway.agent import agent_backend

            with agent_backend(cfg, engine.policy, engine) as backend:
                yield backend
            return
        if not workers:
            yield None
            return
        from tracerl.rollout.ray_workers import rollout_backend

        with rollout_backend(cfg, self.bundle, self.sampler, engine.policy, engine) as backend:
            yield backend

    def sink(self, run_dir: Path, kinds: list[str] | None = None) -> MetricsLog:
        """The metrics sinks (``report.sinks``, or `kinds`), ``metrics.jsonl`` first."""
        cfg = self.cfg
        return MetricsLog.open(
            run_dir,
            cfg.report.sinks if kinds is None else kinds,
            name=cfg.name,
            project=cfg.report.wandb_project,
            config=cfg.model_dump(mode="json"),
        )

    # -- what was built ---------------------------------------------------------------

    def describe(self, *, model: bool = True) -> dict[str, Any]:
        """What this run is built of, for people and for the test that checks every command
        builds a config the same way: the model (spec, placement, a digest of its weights),
        the sampler's settings, the learner's, the environment, the reward and step 0's
        tasks. `model`: False skips what needs the model loaded."""
        cfg = self.cfg
        out: dict[str, Any] = {
            "model": cfg.model.spec,
            "env": [cfg.env.name, cfg.env.kwargs, cfg.env.train_split, cfg.env.eval_split],
            "reward": getattr(self.reward, "source", None),
            "learner": repr(self.learner_config),
            "grpo": repr(self.grpo),
            "tasks": [str(t.get("id")) for t in self.tasks(0)] if self.probe else None,
        }
        if model:
            digest = hashlib.sha256()
            for name, p in sorted(self.bundle.model.state_dict().items()):
                digest.update(name.encode())
                digest.update(p.detach().float().cpu().numpy().tobytes())
            s = self.sampler
            out["weights"] = digest.hexdigest()
            out["sampler"] = [s.temperature, s.generator.initial_seed(), s.max_batch_size]
            out["lora"] = cfg.model.lora is not None
        return out
