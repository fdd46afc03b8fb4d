"""What long horizons cost, per batch of episodes (the ``context/*`` metrics)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def context_metrics(episodes: Sequence[Any]) -> dict[str, float]:
    """* ``context/samples_per_episode``: samples an episode trains on (compactions, prefix
      breaks and sub-agents each add some);
    * ``context/compaction_rate``: the share of episodes compacted at least once, and
      ``context/compactions_mean`` per episode;
    * ``context/summary_tokens_mean``: the length of a summary the policy wrote (tokens;
      absent when it wrote none);
    * ``context/subagents_mean``: sub-agents (child episodes) per episode;
    * ``context/overflow_rate``: the share that ended ``context_overflow``."""
    n = max(1, len(episodes))
    comps = [c for e in episodes for c in e.receipt.compactions]
    written = [c["summary_tokens"] for c in comps if c.get("summary_tokens")]
    m = {
        "context/samples_per_episode": sum(len(e.trajectories) for e in episodes) / n,
        "context/compaction_rate": sum(bool(e.receipt.compactions) for e in episodes) / n,
        "context/compactions_mean": len(comps) / n,
        "context/subagents_mean": sum(len(e.receipt.children) for e in episodes) / n,
        "context/overflow_rate": sum(e.stop_reason.value == "context_overflow" for e in episodes)
        / n,
    }
    if written:
        m["context/summary_tokens_mean"] = sum(written) / len(written)
    return m
