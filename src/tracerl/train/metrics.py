"""What a batch of scored episodes measures, beyond the rollout's own metrics.

The same function serves training rows (``train/...``) and evaluation rows
(``eval/<split>/...``), so these curves mean the same thing on both (``reward_mean`` does
not: training averages the decided episodes, the rewards GRPO sees; evaluation averages the
episodes eligible for it).

An undecided episode (its reward not decided: a reward function that returned None, a judge
that could not decide, a near miss, a crashed evaluator) is never a reward of 0: every mean
of rewards and every success figure counts decided episodes only, and is absent from the
row (printed "undefined", "–" on the dashboard) when none was decided. Beside them:

    undecided_rate             episodes whose reward could not decide, the evaluator healthy:
                               they wait for a person in ``RUN/review.sqlite``
                               (`tracerl.train.review_queue`)
    success_rate               the first outcome component reached 1.0 (exact match), over
                               the decided episodes
    reward/<component>         each component's mean over the episodes it scored
    constraint_violation_rate  policy-owned episodes where a constraint-layer component
                               (format, forbidden tools, permissions) failed (an outage that
                               cut an episode short broke nothing); ``constraint/<name>`` each
    invalid_citation_rate      (`citation_metrics`, given the env's document lookup) citations
                               whose chain fails, over all citations of all answers
    evaluator_error_rate       episodes whose reward code crashed (never scored 0)
    judge_*                    what model judges cost and how often they failed
                               (`tracerl.rewards.judge.metrics`; only when something was judged)

An evaluation that plays each task k times (``eval.samples_per_task``) also reports, per
split (`sample_metrics`):

    mean@k, pass@k             the tasks' mean success over their k samples; the share of
                               tasks solved at least once in k (pass@k >= mean@k; both equal
                               success_rate's estimate when k = 1)
    <metric>_stderr            the standard error of success_rate, mean@k and pass@k across
                               tasks: the sample standard deviation (n - 1) of the per-task
                               values over sqrt(n tasks); with k = 1, sqrt(p (1 - p) / (n - 1))

Episodes left out of the gradient are counted where the timeout policy is applied
(``train/ineligible_episodes``, `tracerl.train.grpo.update_on_groups`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from tracerl.rewards import RewardContext, verify_citation
from tracerl.rewards.judge.metrics import judge_metrics
from tracerl.rollout.groups import rollout_metrics
from tracerl.rollout.runner import Episode
from tracerl.types import Attribution, Layer, RewardBreakdown

Lookup = Callable[[str], str | None]


def gradient_eligible(e: Episode) -> bool:
    """May this episode train the policy? Its rollout must be the policy's (or a success
    despite the environment) and its reward decided by a healthy evaluator."""
    return e.gradient_eligible and (e.reward is None or e.reward.eligible)


def owner(e: Episode) -> Attribution:
    """Whose outcome the episode is: the rollout's owner, unless the reward code crashed on
    it (then the evaluator's, whatever the rollout said)."""
    if e.reward is not None and e.reward.attribution is Attribution.EVALUATOR:
        return Attribution.EVALUATOR
    return e.attribution


def owner_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """``attribution/episodes_<owner>``: each owner's share of the episodes (see `owner`)."""
    n = max(1, len(episodes))
    return {
        f"attribution/episodes_{o.value}": sum(owner(e) is o for e in episodes) / n
        for o in Attribution
    }


def decided(e: Episode) -> bool:
    """Did the episode's reward decide (the episode counts in means and success)? An
    unscored episode (no reward) counts as unsolved, as before."""
    return e.reward is None or bool(getattr(e.reward, "decided", True))


def rate(values: Sequence[float]) -> dict[str, float]:
    """``{"": mean}``, or nothing where there is nothing to average: an absent figure is
    "undefined", never a 0 (prefix the key with `with_key`)."""
    return {"": sum(values) / len(values)} if values else {}


def with_key(key: str, m: dict[str, float]) -> dict[str, float]:
    return {key + k: v for k, v in m.items()}


def shown(value: float | None) -> str:
    """A figure for people: ``0.375``, or ``undefined`` where it is absent (nothing
    decided to average)."""
    return "undefined" if value is None else f"{value:.3f}"


def scored_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    rewards = [e.reward for e in episodes if e.reward is not None]
    n = max(1, len(rewards))
    m: dict[str, float] = {
        **with_key("success_rate", rate([r.succeeded for r in rewards if r.decided])),
        "undecided_rate": sum(not r.decided and r.error is None for r in rewards) / n,
        "evaluator_error_rate": sum(r.error is not None for r in rewards) / n,
        # the policy's own failures: a healthy environment, a decided reward, not a success
        # (timeouts and outages are the environment's: `rollout/timeout_rate`, `.../infra_...`)
        "policy_failure_rate": sum(
            owner(e) is Attribution.POLICY and e.reward.decided and not e.reward.succeeded
            for e in episodes
            if e.reward is not None
        )
        / n,
    }
    scored = [e for e in episodes if e.reward is not None and e.reward.decided]
    if any(e.receipt.compactions for e in episodes if e.reward is not None):
        # success split by whether the context was compacted (decided episodes)
        for key, compacted in (("success_compacted", True), ("success_uncompacted", False)):
            of = [e.reward.succeeded for e in scored if bool(e.receipt.compactions) is compacted]
            m.update(with_key(key, rate(of)))
    names = list(dict.fromkeys(c.name for r in rewards for c in r.components))
    for name in names:
        scored = [
            c for r in rewards for c in r.components if c.name == name and c.decided and not c.gated
        ]
        if scored:
            m[f"reward/{name}"] = sum(c.value for c in scored) / len(scored)
    # an outage that cut an episode short broke no constraint: only policy-owned count
    violated = [_violations(r) for r in rewards if r.attribution is Attribution.POLICY]
    k = max(1, len(violated))
    m["constraint_violation_rate"] = sum(bool(v) for v in violated) / k
    for name in dict.fromkeys(
        c.name for r in rewards for c in r.components if c.layer is Layer.CONSTRAINT
    ):
        m[f"constraint/{name}"] = sum(name in v for v in violated) / k
    m.update(judge_metrics(rewards))
    return m


def citation_metrics(episodes: Sequence[Episode], lookup: Lookup) -> dict[str, float]:
    """``invalid_citation_rate`` and ``citations`` (a count), given the env's documents."""
    verdicts = _citation_verdicts(episodes, lookup)
    return {
        "invalid_citation_rate": (
            sum(not v["valid"] for v in verdicts) / len(verdicts) if verdicts else 0.0
        ),
        "citations": float(len(verdicts)),
    }


def _violations(r: RewardBreakdown) -> set[str]:
    """The constraint components this reward found broken (scored, decided, below 1)."""
    return {
        c.name
        for c in r.components
        if c.layer is Layer.CONSTRAINT and c.decided and not c.gated and c.value < 1.0
    }


def _citation_verdicts(episodes: Sequence[Episode], lookup: Lookup) -> list[dict]:
    # every citation of every answer, wrong answers included (not only those the reward's
    # gates let through): invalid citations matter most where the answer is wrong
    out = []
    for e in episodes:
        ctx = RewardContext.from_trajectories(e.trajectories, lookup)
        if ctx.answer:
            text = str(ctx.answer.get("text") or "")
            out += [verify_citation(c, text, lookup) for c in ctx.answer.get("citations") or []]
    return out


def stderr(values: Sequence[float]) -> float:
    """The standard error of `values`' mean: their sample standard deviation (n - 1) over
    sqrt(n); 0 for fewer than two values."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def sample_metrics(groups: Sequence[Sequence[Episode]]) -> dict[str, float]:
    """``mean@k``, ``pass@k`` and the standard errors across tasks of them and of
    ``success_rate`` (see the module docstring), `groups` holding each task's k episodes
    (k: the largest group; an episode without a reward counts as unsolved). Over decided
    samples only: none at all, no figures."""
    k = max((len(g) for g in groups), default=1)
    # undecided samples are left out; a task none of whose samples decided, too
    solved_G = [
        [e.reward is not None and e.reward.succeeded for e in g if decided(e)] for g in groups
    ]
    means = [sum(s) / len(s) for s in solved_G if s]
    passes = [float(any(s)) for s in solved_G if s]
    if not means:  # nothing decided: undefined, not 0
        return {}
    n = len(means)
    return {
        "success_rate_stderr": stderr(means),
        f"mean@{k}": sum(means) / n,
        f"mean@{k}_stderr": stderr(means),
        f"pass@{k}": sum(passes) / n,
        f"pass@{k}_stderr": stderr(passes),
    }


def eval_metrics(
    episodes: Sequence[Episode],
    split: str,
    lookup: Lookup | None = None,
    groups: Sequence[Sequence[Episode]] | None = None,
) -> dict[str, float]:
    """One evaluation's metrics, named ``eval/<split>/...``: the scored metrics above,
    ``reward_mean`` over eligible episodes (absent when none is), searches per episode, P95
    latency, tool cost, stop reasons and attribution; on the adversarial split each trap
    kind's success as ``eval/adversarial/<kind>/success_rate``. `groups`: the episodes by
    task (each task's k samples; None: one episode per task), for `sample_metrics`."""
    eligible = [e.reward.total for e in episodes if e.reward is not None and e.reward.eligible]
    n = max(1, len(episodes))
    m = {
        **with_key("reward_mean", rate(eligible)),  # none eligible: undefined, not 0
        "searches_mean": sum(
            c["action"]["tool"] == "search"
            for e in episodes
            for s in e.steps
            for c in s.get("calls", [])
        )
        / n,
        "episodes": float(len(episodes)),
        **scored_metrics(episodes),
        **sample_metrics([[e] for e in episodes] if groups is None else groups),
    }
    if lookup is not None:
        m.update(citation_metrics(episodes, lookup))
    rollout = rollout_metrics(episodes) | owner_metrics(episodes)
    m["latency_p95_s"] = rollout.pop("rollout/latency_p95_s")
    m.update(
        {
            k: v
            for k, v in rollout.items()
            if k.split("/")[0] in ("stop", "attribution", "cost", "context")
        }
    )
    m.update(
        {
            k.split("/")[1]: rollout[k]
            for k in (
                "rollout/premature_stop_rate",
                "rollout/unfinished_after_budget",
                "rollout/finalize_rate",
            )
        }
    )
    out = {f"eval/{split}/{k}": v for k, v in m.items()}
    if split == "adversarial":
        for kind in sorted({str(e.receipt.task.get("kind", "")) for e in episodes}):
            of_kind = [e for e in episodes if e.receipt.task.get("kind") == kind]
            if (ok := scored_metrics(of_kind).get("success_rate")) is not None:
                out[f"eval/adversarial/{kind}/success_rate"] = ok
    return out


def train_reward_mean(episodes: Sequence[Episode], totals: Sequence[float]) -> dict[str, float]:
    """``train/reward_mean``: the mean of `totals` (each episode's reward as training sees
    it, one per episode) over the decided episodes; absent when none decided (a reward
    that never decides trains nothing and scores nothing, not 0)."""
    of = [x for e, x in zip(episodes, totals, strict=True) if decided(e)]
    return with_key("train/reward_mean", rate(of))


def signal_metrics(signal: Sequence[bool]) -> dict[str, float]:
    """How many of a step's groups can teach anything (`signal`: one per group, from
    `tracerl.train.grpo.has_signal`): a group whose advantages are all zero (its eligible
    rewards all equal, or fewer than two eligible members) bought nothing with its sampling.
    ``train/zero_signal_groups`` (a count) and ``train/zero_signal_group_rate`` (its share
    of the step's sampled groups)."""
    empty = sum(not s for s in signal)
    return {
        "train/zero_signal_groups": float(empty),
        "train/zero_signal_group_rate": empty / (len(signal) or 1),
    }
