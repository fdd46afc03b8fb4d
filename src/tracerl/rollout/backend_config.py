"""Where episodes run: the ``trainer.rollout`` section of a run config (`tracerl.config`
nests it). It lives in the rollout layer, which reads it (`tracerl.rollout.ray_workers`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tracerl.rollout.endpoints import server_root


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


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
    """A Ray cluster to join: ``host:port`` (its head, as ``ray start --head`` prints it),
    ``ray://host:port`` (Ray Client) or ``auto`` (``$RAY_ADDRESS``, else the cluster ``ray
    start`` last started on this node); None starts a local one."""
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
    elsewhere), kept in step with the learner by `weight_sync`: ``http://host:8000`` or, as
    the OpenAI SDK's base URL, ``http://host:8000/v1`` (the same server)."""
    served_model: str | None = None
    """The model name that server serves (vLLM's ``--served-model-name``); None: the
    model's spec."""
    weight_sync: str = "lora"
    """How `sampler_url`'s server gets each update: ``lora`` (adapters hot-loaded through
    ``/v1/load_lora_adapter``; needs ``model.lora``), or ``package.module:factory`` for a
    full-weight hook (`tracerl.rollout.weight_sync`)."""

    @field_validator("sampler_url")
    @classmethod
    def _server_root(cls, url: str | None) -> str | None:
        return None if url is None else server_root(url)
