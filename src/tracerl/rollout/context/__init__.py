"""Context policies for long episodes (``rollout.context``, docs/long-horizon.md).

When the next turn of a native episode would not fit in ``budgets.context_tokens``, the
episode either stops (``stop``, the default), or continues in a new sample of the same
episode: ``compact`` (a summary, written by the policy or by a configured summarizer, and
the last turns verbatim) or ``drop_observations`` (older tool outputs replaced by a
marker). Every token keeps its author across the break: the policy's summarize turn
trains, everything in the new sample's prompt is prompt. `EpisodeContext` holds one
episode's state and is what the runner calls; `ContextConfig` is the config section.

This package never imports the runner, the budget or the turns modules (they import it).
"""

from tracerl.rollout.context.config import ContextConfig, SubagentConfig, SummarizerConfig
from tracerl.rollout.context.manager import EpisodeContext
from tracerl.rollout.context.summarizers import Summarize, SummarizerError, recorded_summaries

__all__ = [
    "ContextConfig",
    "EpisodeContext",
    "SubagentConfig",
    "Summarize",
    "SummarizerConfig",
    "SummarizerError",
    "recorded_summaries",
]
