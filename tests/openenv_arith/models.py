"""The arithmetic environment's action and observation (openenv's pydantic models)."""

from __future__ import annotations

from openenv.core.env_server.types import Action, Observation
from pydantic import Field


class ArithAction(Action):
    """The agent's answer."""

    message: str = Field(..., description="The reply: the sum")


class ArithObservation(Observation):
    """The question, and after an answer, the gold answer."""

    prompt: str = Field(default="", description="The question")
    answer: str | None = Field(default=None, description="The gold answer, once answered")
