"""Model judges as reward components (issue 25; in progress).

Here so far: the rubric (`rubric.Rubric`: what a judge is asked, with the episode's text
quoted as data, never as instructions) and its strict verdict (`rubric.parse_verdict`);
the judge (`judge.Judge`: cached verdicts, retries, `JudgeFailed` when none comes, and what
each verdict cost).
Like the rest of `tracerl.rewards`, nothing here talks to a network: the endpoint client
is given to the judge from outside (a protocol: messages in, a reply out).
"""

from tracerl.rewards.judge.judge import (
    Judge,
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
