"""The base of every config model, and the error a config that cannot run raises."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from tracerl.errors import UserError


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class ConfigError(UserError, ValueError):
    """A config that cannot run: what, where (file, line, key) and what to do."""
