"""Typed configuration: the nested pydantic models of a run config.

    cfg = tracerl.config.loading.load_config("configs/demo.yaml", ["trainer.lr=1e-5"])

One module per section: `model`, `env`, `trainer` (its ``trainer.rollout`` section is
`tracerl.rollout.backend_config`, read by the rollout layer), and `run` (the root
`RunConfig`, its small sections and `dump_config`); `base` holds the models' base and
`ConfigError`. Reading YAML files and dotted overrides, and explaining what does not
validate (file, line, key, "did you mean"), is `tracerl.config.loading`. Every key is
documented in docs/config.md (`tracerl.config.reference`).
"""

from tracerl.config.base import ConfigError
from tracerl.config.env import EnvConfig
from tracerl.config.eval import EvalConfig
from tracerl.config.loading import apply_overrides, load_config
from tracerl.config.model import LORA_TARGETS, LoraConfig, ModelConfig, VLLMConfig
from tracerl.config.run import (
    AgentConfig,
    ReportConfig,
    RunConfig,
    WarmStartConfig,
    dump_config,
)
from tracerl.config.trainer import (
    DynamicSamplingConfig,
    LearnerPlacement,
    StalenessLR,
    TrainerConfig,
)
from tracerl.rollout.backend_config import RolloutBackendConfig
from tracerl.rollout.budget import RolloutConfig

__all__ = [
    "LORA_TARGETS",
    "AgentConfig",
    "ConfigError",
    "DynamicSamplingConfig",
    "EnvConfig",
    "EvalConfig",
    "LearnerPlacement",
    "LoraConfig",
    "ModelConfig",
    "ReportConfig",
    "RolloutBackendConfig",
    "RolloutConfig",
    "RunConfig",
    "StalenessLR",
    "TrainerConfig",
    "VLLMConfig",
    "WarmStartConfig",
    "apply_overrides",
    "dump_config",
    "load_config",
]
