"""The dashboard's tables: attribution, stop reasons, reward components, citations (when
the run measured them) and latency, sample episodes and triage (the run facts and the
headline cards: `tracerl.report.facts`)."""

from __future__ import annotations

from typing import Any

from tracerl.report.page import Raw, bar, esc, num, pct, table
from tracerl.report.run import EpisodeRecord, RunData
from tracerl.report.triage import BUCKETS, POLICY_KINDS, Triage
from tracerl.report.viewer import page_name

OWNERS = ("policy", "environment", "evaluator", "unknown")


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [float(r[key]) for r in rows if key in r]
    return sum(vals) / len(vals) if vals else None


def attribution(d: RunData) -> str:
    last, ev = (d.train[-1] if d.train else {}), d.last_eval(d.eval_split)
    split = d.eval_split
    rows = []
    for owner in OWNERS:
        key = f"attribution/episodes_{owner}"
        run = _mean(d.train, key)
        rows.append(
            [
                owner,
                pct(run),
                bar(run or 0.0),
                pct(last.get(key)),
                pct(ev.get(f"eval/{split}/{key}")),
            ]
        )
    steps = [
        [
            label,
            pct(_mean(d.train, f"attribution/{k}")),
            pct(last.get(f"attribution/{k}")),
            pct(ev.get(f"eval/{split}/attribution/{k}")),
        ]
        for label, k in (
            ("policy errors", "policy_error_rate"),
            ("environment errors", "env_error_rate"),
            ("unknown", "unknown_rate"),
        )
    ]
    return (
        table(
            ["episodes owned by", "training (run)", "", "last step", f"last eval ({split})"],
            rows,
            num={1, 3, 4},
        )
        + table(
            ["steps failing with", "training (run)", "last step", "last eval"], steps, {1, 2, 3}
        )
        + '<p class="note">Only policy-owned episodes (and successes) reach the gradient. A high '
        "unknown rate means: fix observation and logging before trusting the curves.</p>"
    )


def stops(d: RunData) -> str:
    split = d.eval_split
    ev = d.last_eval(split)
    reasons = sorted(
        {k.split("/", 1)[1] for r in d.train for k in r if k.startswith("stop/") and r[k] > 0}
        | {
            k.split("/stop/", 1)[1]
            for k, v in ev.items()
            if k.startswith(f"eval/{split}/stop/") and v > 0
        }
    )
    rows = [
        [
            r,
            pct(_mean(d.train, f"stop/{r}")),
            bar(_mean(d.train, f"stop/{r}") or 0.0),
            pct(ev.get(f"eval/{split}/stop/{r}")),
        ]
        for r in reasons
    ]
    budget = [
        [
            label,
            pct(_mean(d.train, k)),
            pct(d.train[-1].get(k) if d.train else None),
            pct(ev.get(f"eval/{split}/{k.split('/')[1]}")),
        ]
        for label, k in (
            ("premature_stop_rate", "rollout/premature_stop_rate"),
            ("unfinished_after_budget", "rollout/unfinished_after_budget"),
            ("routed to finalize (reserve)", "rollout/finalize_rate"),
        )
    ]
    return table(
        ["stop reason", "training (run)", "", f"last eval ({split})"], rows, {1, 3}
    ) + table(["budget", "training (run)", "last step", "last eval"], budget, {1, 2, 3})


def components(d: RunData) -> str:
    layers: dict[str, str] = {}
    scored: dict[str, int] = {}
    pool = [e for e in d.episodes if e.phase == "train" and e.reward is not None] or [
        e for e in d.episodes if e.reward is not None
    ]
    for e in pool:
        for c in e.reward.components:  # type: ignore[union-attr]
            per_step = ", per step" if c.steps is not None else ""
            if not c.gated:  # a gated component's record does not say how it is scored
                layers[c.name] = c.layer.value + per_step
            layers.setdefault(c.name, c.layer.value)
            scored[c.name] = scored.get(c.name, 0) + (c.decided and not c.gated)
    split, ev = d.eval_split, d.last_eval(d.eval_split)
    last = d.train[-1] if d.train else {}
    rows = [
        [
            name,
            layer,
            pct(scored[name] / len(pool)),
            num(_mean(d.train, f"train/reward/{name}")),
            num(last.get(f"train/reward/{name}")),
            num(ev.get(f"eval/{split}/reward/{name}")),
        ]
        for name, layer in layers.items()
    ]
    if not rows:
        return "<p>No reward breakdowns in this run's episodes.</p>"
    return (
        table(
            ["component", "layer", "scored in", "training (run mean)", "last step", "last eval"],
            rows,
            {2, 3, 4, 5},
        )
        + '<p class="note">Each mean is over the episodes the component scored: a component '
        "behind a gate (such as exact match) is scored only where the gate opened, so read its "
        "mean beside its share. A component scored per step sums what the episode's steps "
        "earned; the episode viewer's step table shows each step's share.</p>"
    )


SEARCH_ROWS = (("invalid citation rate", "invalid_citation_rate", pct),)
"""Rows only a run that measured them shows (an environment with documents to cite): label,
metric (``train/<key>`` or ``eval/<split>/<key>``), format. (``searches_mean`` is not one:
every evaluation writes it, 0 where no tool is called ``search``.)"""


def has_metric(d: RunData, key: str) -> bool:
    """Did the run record `key`, in training (``train/<key>``) or in an evaluation of any
    split (``eval/<split>/<key>``)?"""
    rows = d.train + d.evals
    return any(
        k == f"train/{key}" or (k.startswith("eval/") and k.split("/", 2)[-1] == key)
        for r in rows
        for k in r
    )


def quality(d: RunData) -> str:
    split, ev = d.eval_split, d.last_eval(d.eval_split)
    last = d.train[-1] if d.train else {}
    stale = [k for r in d.train for k in r if "staleness" in k]
    dropped = sum(float(r.get("train/ineligible_episodes", 0.0)) for r in d.train)
    rows = [
        [label, fmt(last.get(f"train/{key}")), fmt(ev.get(f"eval/{split}/{key}"))]
        for label, key, fmt in SEARCH_ROWS
        if has_metric(d, key)  # a reward without citations has no citation rows
    ] + [
        [
            "P95 episode latency",
            _secs(last.get("rollout/latency_p95_s")),
            _secs(ev.get(f"eval/{split}/latency_p95_s")),
        ],
        [
            "evaluator errors",
            pct(last.get("train/evaluator_error_rate")),
            pct(ev.get(f"eval/{split}/evaluator_error_rate")),
        ],
        ["episodes left out of the gradient (run total)", f"{dropped:.0f}", "–"],
        [
            "groups with no signal: all advantages zero (run mean, of sampled groups)",
            pct(_mean(d.train, "train/zero_signal_group_rate")),
            "–",
        ],
        [
            "staleness (policy versions behind)",
            num(_mean(d.train, stale[0]))
            if stale
            else "0 (synchronous: sampled by the policy being updated)",
            "–",
        ],
    ]
    if (d.config.get("trainer") or {}).get("dynamic_sampling"):  # groups were replaced

        def per_step(key: str) -> str:
            total = sum(float(r.get(key, 0.0)) for r in d.train)
            return f"{_mean(d.train, key) or 0.0:.1f} ({total:.0f})"

        rows.append(
            [
                "dynamic sampling: groups set aside without signal per step (mean; total)",
                per_step("train/filtered_groups"),
                "–",
            ]
        )
        if any("train/resampled_groups" in r for r in d.train):  # synchronous
            rows.append(
                [
                    "dynamic sampling: replacement groups sampled per step (mean; total)",
                    per_step("train/resampled_groups"),
                    "–",
                ]
            )
    if any(r.get("rollout/worker_reruns") for r in d.train):  # Ray workers died in this run
        rows.append(
            [
                "episodes rerun after their rollout worker died (run mean)",
                pct(_mean(d.train, "rollout/worker_reruns")),
                "–",
            ]
        )
    if any("agent/history_break_rate" in r for r in d.train):  # an agent harness drove it
        rows += [
            [
                "agent episodes whose harness rewrote its history (run mean)",
                pct(_mean(d.train, "agent/history_break_rate")),
                "–",
            ],
            [
                "agent episodes with a break recognized as compaction (run mean)",
                pct(_mean(d.train, "agent/compaction_rate")),
                "–",
            ],
            [
                "agent episodes whose agent raised (run mean)",
                pct(_mean(d.train, "agent/exception_rate")),
                "–",
            ],
        ]
    return table(["", "training (last step)", f"last eval ({split})"], rows, {1, 2})


def _secs(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f} s"


# ---- episodes ------------------------------------------------------------------------------


def episode_links(d: RunData, tri: Triage, linked: dict[int, EpisodeRecord]) -> str:
    def link(e: EpisodeRecord) -> Raw:
        linked[id(e)] = e
        return Raw(f'<a href="episodes/{esc(page_name(e))}">{esc(e.episode_id)}</a>')

    rows = []
    scored = [e for e in d.episodes if e.total is not None]
    unused = never_trained(d)
    for label, pool in (
        ("training", [e for e in scored if e.phase == "train" and e.episode_id not in unused]),
        ("held-out", [e for e in scored if e.phase == "eval"]),
    ):
        if pool:
            best = max(pool, key=lambda e: (e.total, e.step))
            worst = min(pool, key=lambda e: (e.total, -e.step))
            rows.append(
                [f"best {label}", link(best), best.where, f"{best.total:.3f}", best.stop_reason]
            )
            rows.append(
                [
                    f"worst {label}",
                    link(worst),
                    worst.where,
                    f"{worst.total:.3f}",
                    worst.stop_reason,
                ]
            )
    for bucket in BUCKETS[1:]:
        kinds = POLICY_KINDS if bucket == "policy" else sorted(tri.kinds(bucket))
        for kind in kinds:
            for e, v in tri.examples(bucket, kind, 1):
                rows.append([f"{bucket}: {kind}", link(e), e.where, num(e.total), v.why])
    if not rows:
        return "<p>No episodes written yet.</p>"
    return table(["sample", "episode", "where", "reward", "why"], rows, {3})


def never_trained(d: RunData) -> set[str]:
    """The training episodes an asynchronous run sampled that no update used (its ledger:
    neither trained on, dropped as stale nor set aside): sampled past the last step, or
    still waiting for the learner when the run ended. Empty for a synchronous run."""
    if not d.ledger:
        return set()
    used = {
        i
        for r in d.ledger.values()
        for key in ("trained", "dropped_stale", "filtered")
        for i in r.get(key, [])
    }
    return {e.episode_id for e in d.episodes if e.phase == "train"} - used


def triage_table(tri: Triage, linked: dict[int, EpisodeRecord]) -> str:
    n = len(tri.verdicts)
    if not n:
        return "<p>No episodes to triage yet.</p>"
    rows = []
    counts = tri.counts()
    for bucket in BUCKETS:
        kinds = tri.kinds(bucket)
        for kind, k in sorted(kinds.items(), key=lambda kv: -kv[1]):
            examples = tri.examples(bucket, kind, 3)
            for e, _ in examples:
                linked[id(e)] = e
            links = Raw(
                " ".join(
                    f'<a href="episodes/{esc(page_name(e))}">{esc(e.episode_id)}</a>'
                    for e, _ in examples
                )
            )
            rows.append([bucket, kind, k, pct(k / n), links])
        if not kinds:
            rows.append([bucket, "–", 0, pct(0.0), ""])
    summary = ", ".join(f"{b} {counts.get(b, 0)}" for b in BUCKETS)
    return (
        f"<p>The last {n} training episodes: {esc(summary)}. The same tables print with "
        "<code>tracerl triage RUN</code>.</p>"
        + table(["bucket", "kind", "episodes", "share", "examples"], rows, {2, 3})
    )
