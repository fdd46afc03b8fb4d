"""Model judges as reward components (docs/judges.md).

- `rubric`: what a judge is asked (`Rubric`), with the episode's text quoted as data, never
  as instructions, and its strict verdict (`parse_verdict`, `parse_group_verdict`);
- `judge`: a judge (`Judge`): verdicts cached on disk, retries, per-step budgets
  (`JudgeBudget`), `JudgeFailed` when none comes, and what each verdict cost;
- `component`: the ``judge`` reward component and the citation chain's judge, built from a
  reward spec's params (`JudgeParams`);
- `metrics`: what judges cost and how often they failed, per batch;
- `calibration`: the judge against people's verdicts in the review pool.

Like the rest of `tracerl.rewards`, nothing here talks to a network: the endpoint client
is loaded by import path (default `tracerl.engines.judge_client.OpenAIJudgeClient`) and
given to the judge (a protocol: messages in, a reply out).
"""

from tracerl.rewards.judge.judge import (
    Judge,
    JudgeBudget,
    JudgeBudgetSpent,
    JudgeClient,
    Judged,
    JudgeFailed,
    JudgeReply,
    JudgeUnavailable,
    VerdictCache,
)
from tracerl.rewards.judge.rubric import Rubric, Verdict, VerdictError, VerdictSchema, parse_verdict

__all__ = [
    "Judge",
    "JudgeBudget",
    "JudgeBudgetSpent",
    "JudgeClient",
    "JudgeFailed",
    "JudgeReply",
    "JudgeUnavailable",
    "Judged",
    "Rubric",
    "Verdict",
    "VerdictCache",
    "VerdictError",
    "VerdictSchema",
    "parse_verdict",
]
