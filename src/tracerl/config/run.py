"""The root `RunConfig` (its small sections: warm start, agent, report) and `dump_config`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, field_validator, model_validator

from tracerl.config.base import _Config
from tracerl.config.distill import vocabulary_mismatch
from tracerl.config.env import EnvConfig
from tracerl.config.eval import EvalConfig
from tracerl.config.model import ModelConfig
from tracerl.config.trainer import TrainerConfig
from tracerl.envs.registry import declared_agent
from tracerl.rollout.budget import RolloutConfig


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
    port: int = Field(0, ge=0, le=65535)
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
    eval: EvalConfig = Field(default_factory=lambda: EvalConfig())
    """How evaluations sample: their temperature (0: greedy) and episodes per task."""
    warm_start: WarmStartConfig | None = None
    """None: RL from the model as loaded."""
    agent: AgentConfig | None = None
    """An agent function to train through the gateway instead of tracerl's own episode
    runner (``agent: mypkg.agent:solve`` is short for ``agent: {entry: ...}``); the
    environment then supplies the tasks and the reward. None: the environment's tools,
    run by tracerl (or, for an environment registered with an agent of its own, such as
    ``verifiers``, that agent)."""
    report: ReportConfig = Field(default_factory=lambda: ReportConfig())
    """Where metrics go."""

    @field_validator("agent", mode="before")
    @classmethod
    def _agent_shorthand(cls, value: Any) -> Any:
        return {"entry": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _environment_agent(self) -> RunConfig:
        """An environment whose episodes are another framework's own (``verifiers``) comes
        with the agent that plays it; the config may still name another."""
        if self.agent is None and (entry := declared_agent(self.env.name)) is not None:
            self.agent = AgentConfig(entry=entry)
        return self

    @model_validator(mode="after")
    def _precision(self) -> RunConfig:
        """``model.dtype`` (what the forward computes in) and ``trainer.precision`` agree."""
        from tracerl.models.precision import precision_conflict

        why = precision_conflict(self.model.dtype, self.trainer.precision)
        if why:
            raise ValueError(why)
        return self

    @model_validator(mode="after")
    def _teacher_tokenizer(self) -> RunConfig:
        """A teacher must read the student's token ids as the student does: refused here
        when both resolve (a run that does not exist yet is `tracerl train`'s preflight's to
        report)."""
        d = self.trainer.distill
        if d is None or d.teacher is None:
            return self
        from tracerl.models import ModelNotFoundError
        from tracerl.models.refs import teacher_vocabulary

        try:
            ref, differs = teacher_vocabulary(self.model.spec, d.teacher)
        except ModelNotFoundError:
            return self
        if differs:
            raise ValueError(vocabulary_mismatch(d.teacher, ref.spec, self.model.spec, differs))
        return self

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
        if (
            self.model.engine == "vllm"
            and self.trainer.mode == "async"
            and self.model.vllm.sleep_mode
        ):
            raise ValueError(
                "model.vllm.sleep_mode puts the vLLM server to sleep while the learner updates; "
                "with trainer.mode=async it samples during the updates: use trainer.mode=sync, "
                "or set sleep_mode to false"
            )
        if r.sampler_url is not None and r.weight_sync == "lora" and self.model.lora is None:
            raise ValueError(
                "trainer.rollout.weight_sync=lora hot-loads LoRA adapters into the server at "
                "sampler_url: set model.lora, or give a full-weight hook "
                "(weight_sync: package.module:factory)"
            )
        t = self.eval.temperature
        if r.backend == "ray" and t is not None and t != self.model.temperature:
            raise ValueError(
                f"eval.temperature={t}: Ray rollout workers sample at model.temperature "
                f"({self.model.temperature}), evaluations included; leave eval.temperature "
                "unset, or use trainer.rollout.backend=inprocess"
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


def dump_config(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
