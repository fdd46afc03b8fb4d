"""``rollout.context``: what an episode does when its context fills up."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tracerl.rollout.endpoints import openai_base_url

SUMMARY_INSTRUCTION = (
    "Your context is full and will be cleared. Write a short summary to continue from: "
    "what you found so far and what is left to do."
)


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)


class SummarizerConfig(_Config):
    """Who writes a compaction's summary."""

    by: Literal["policy", "function", "endpoint"] = "policy"
    """``policy``: the policy itself, in a summarize turn (its tokens are policy tokens and
    train with the episode's advantage); ``function``: `fn` (environment-authored text, no
    loss; its failure is the environment's); ``endpoint``: an OpenAI-compatible chat
    completions server that is not the policy's (`base_url`, `model`), the same way."""
    instruction: str = SUMMARY_INSTRUCTION
    """``policy``: shown as a user turn (environment tokens, never trained on) before the
    summarize turn; ``endpoint``: the system message of the request."""
    max_tokens: int = Field(128, ge=8)
    """The longest summary, in tokens (``policy``: the summarize turn's limit, within what
    the context and the sampled-token budget leave; ``endpoint``: the request's; a longer
    text a function or an endpoint returns is cut to it, with a marker)."""
    fn: str | None = None
    """``function``: ``module:function`` taking the conversation's messages (a list of
    ``{"role", "content"}``) and returning the summary (a str, or an awaitable of one)."""
    base_url: str | None = None
    """``endpoint``: the server's OpenAI base URL (``http://host:port/v1``; a bare
    ``http://host:port`` gets ``/v1``)."""

    @field_validator("base_url")
    @classmethod
    def _a_server(cls, url: str | None) -> str | None:
        return None if url is None else openai_base_url(url)

    model: str | None = None
    """``endpoint``: the model name sent in the request."""
    api_key_env: str | None = None
    """``endpoint``: the environment variable holding its API key (None: none sent); a named
    variable that is not set stops the run before it starts."""
    timeout_s: float = Field(60.0, gt=0)
    """``function``, ``endpoint``: the longest a summary may take; past it, the
    environment's failure."""

    @model_validator(mode="after")
    def _needs(self) -> SummarizerConfig:
        if self.by == "function" and not self.fn:
            raise ValueError(
                "rollout.context.summarizer.by=function needs summarizer.fn "
                "(module:function returning the summary text)"
            )
        if self.by == "endpoint" and not (self.base_url and self.model):
            raise ValueError(
                "rollout.context.summarizer.by=endpoint needs summarizer.base_url and "
                "summarizer.model (an OpenAI-compatible server that is not the policy's)"
            )
        return self


class SubagentConfig(_Config):
    """Sub-agents (`tracerl.rollout.context.subagents`): a call to `tool` runs a child
    episode of the same policy, whose answer is the call's observation."""

    tool: str = "delegate"
    """The tool whose calls delegate (`tracerl.envs.delegation.Delegating` declares it);
    the runner runs them, the environment never sees them."""
    steps: int = Field(6, ge=1)
    """A child's model turns. Its tool calls and sampled tokens come out of what its parent
    has left (less one final turn of the parent's)."""
    max_depth: int = Field(1, ge=1)
    """How deep delegation nests: 1, children only (a child's delegate call is refused)."""
    own_reward: bool = True
    """A child trains with its own reward where the environment defines one
    (``subagent_reward(task, subtask, answer)``, a number or None), its advantage taken
    against the children at the same place in the other episodes of its group; false, or
    where the environment defines none: with its parent's advantage."""


class ContextConfig(_Config):
    """What a native episode does when the next turn would not fit in
    ``budgets.context_tokens`` (`tracerl.rollout.context`, docs/long-horizon.md)."""

    policy: Literal["stop", "compact", "drop_observations"] = "stop"
    """``stop``: the episode ends ``context_overflow``; ``compact``: it continues in a new
    sample whose prompt is the task, a summary and the last `keep_turns` turns verbatim;
    ``drop_observations``: it continues in a new sample whose older tool outputs are
    replaced by `marker`."""
    reserve_tokens: int | None = Field(None, ge=1)
    """Room kept for what comes next: a compaction happens when the context after an
    observation would leave less. None: ``max_turn_tokens`` (the next turn); with
    policy-written summaries ``max_turn_tokens + observation_max_tokens`` (the next turn
    and its observation: the summary is asked for one step early, and the instruction and
    the summary must still fit after that)."""
    keep_turns: int = Field(1, ge=0)
    """The last model turns (each with its observation) a compaction keeps verbatim."""
    max_compactions: int = Field(8, ge=1)
    """The most compactions in one episode; after them, a full context stops it."""
    summarizer: SummarizerConfig = SummarizerConfig()
    """Who writes a compaction's summary (``compact`` only)."""
    summary_prefix: str = "Summary of your work so far (your earlier turns were cleared):\n"
    """Put before the summary in the new sample's prompt (a user message)."""
    marker: str = "[tool output removed to save context]"
    """``drop_observations``: what replaces a dropped tool output."""
