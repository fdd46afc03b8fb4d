"""What a batch's judges cost and how often they failed, from the reward breakdowns.

A judged component is one whose evidence names a ``judge`` (a verdict's, or a failure's).
Per batch of episodes (``train/...`` and ``eval/<split>/...`` alike):

    judge_requests_mean     requests sent per episode (retries count; cached verdicts not)
    judge_tokens_mean       prompt + completion tokens per episode (failed attempts count)
    judge_latency_s_mean    seconds spent waiting on judges per episode
    judge_cache_hit_rate    verdicts that came from the cache, over verdicts given
    judge_failure_rate      judged components left undecided by a judge failure (timeouts,
                            endpoint errors, replies that are not verdicts, budget refusals),
                            over judged components: those episodes are the evaluator's
    judge_budget_refusals   questions the step's judge budget refused (a count)
"""

from __future__ import annotations

from collections.abc import Sequence

from tracerl.types import RewardBreakdown


def judge_metrics(rewards: Sequence[RewardBreakdown]) -> dict[str, float]:
    """The metrics above; empty when no episode was judged."""
    components = [c for r in rewards for c in r.judged()]
    if not components:
        return {}
    n = max(1, len(rewards))
    failed = [c for c in components if not c.decided and "error" in c.evidence]
    given = [c for c in components if c.decided and "error" not in c.evidence]
    verdicts = [c.evidence for c in given if "verdict" in c.evidence or "judged" in c.evidence]
    return {
        "judge_requests_mean": sum(int(c.evidence.get("attempts", 0)) for c in components) / n,
        "judge_tokens_mean": sum(int(c.evidence.get("tokens", 0)) for c in components) / n,
        "judge_latency_s_mean": sum(float(c.evidence.get("latency_s", 0.0)) for c in given) / n,
        "judge_cache_hit_rate": (
            sum(bool(e.get("cached")) for e in verdicts) / len(verdicts) if verdicts else 0.0
        ),
        "judge_failure_rate": len(failed) / len(components),
        "judge_budget_refusals": float(sum("budget" in c.evidence for c in failed)),
    }
