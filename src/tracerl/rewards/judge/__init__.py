"""Model judges as reward components (issue 25; in progress).

Here so far: the rubric (`rubric.Rubric`: what a judge is asked, with the episode's text
quoted as data, never as instructions) and its strict verdict (`rubric.parse_verdict`).
Like the rest of `tracerl.rewards`, nothing here talks to a network: the endpoint client
is given to the judge from outside (a protocol: messages in, a reply out).
"""

from tracerl.rewards.judge.rubric import Rubric, Verdict, VerdictError, VerdictSchema, parse_verdict

__all__ = ["Rubric", "Verdict", "VerdictError", "VerdictSchema", "parse_verdict"]
