"""`tracerl report RUN`: the dashboard, ``RUN/report/index.html``, and one page per linked
episode under ``RUN/report/episodes/``.

Reward going up is not the agent getting better, so the four curves never share an axis:
training reward, held-out success (each adversarial trap kind its own line), tool cost per
episode (calls and latency, each in its own panel) and the constraint-violation rate. Beside
them: whose fault the failures were, how episodes ended, the reward's components, and links
to real episodes (best, worst, one per failure kind) so every number can be checked by
reading what the agent did.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from tracerl.report.page import Raw, bar, esc, page, pct, table
from tracerl.report.run import EpisodeRecord, check_run_dir, iter_episodes, metric_rows
from tracerl.report.svg import Panel, Series, line_chart
from tracerl.report.triage import BUCKETS, POLICY_KINDS, Triage, triage
from tracerl.report.viewer import episode_page, page_name

CURVES = ("training-reward", "heldout-success", "tool-cost", "constraint-violations")
OWNERS = ("policy", "environment", "evaluator", "unknown")


@dataclass
class RunData:
    run_dir: Path
    train: list[dict[str, Any]]
    evals: list[dict[str, Any]]
    other: list[dict[str, Any]]
    episodes: list[EpisodeRecord]
    config: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, run_dir: str | os.PathLike[str]) -> RunData:
        root = check_run_dir(run_dir)
        rows = metric_rows(root)
        by_step: dict[int, dict[str, Any]] = {}
        for r in rows:  # a resumed run may repeat a step: its last row stands
            if r.get("phase") == "train":
                by_step[int(r.get("step", 0))] = r
        cfg_path = root / "config.yaml"
        config = yaml.safe_load(cfg_path.read_text()) if cfg_path.exists() else {}
        return cls(
            root,
            [by_step[k] for k in sorted(by_step)],
            [r for r in rows if r.get("phase") == "eval" or "split" in r],
            [r for r in rows if r.get("phase") not in ("train", "eval") and "split" not in r],
            list(iter_episodes(root)),
            config if isinstance(config, dict) else {},
        )

    def train_series(self, key: str, name: str, scale: float = 1.0, **kw: Any) -> Series:
        pts = [(float(r["step"]), float(r[key]) * scale) for r in self.train if key in r]
        return Series(name, pts, **kw)

    def eval_keys(self, test: Callable[[list[str]], bool]) -> list[str]:
        keys = dict.fromkeys(k for r in self.evals for k in r if test(k.split("/")))
        return list(keys)

    def eval_series(self, key: str, name: str, scale: float = 1.0, **kw: Any) -> Series:
        rows = [r for r in self.evals if key in r]
        pts = [(float(r.get("step", 0)), float(r[key]) * scale) for r in rows]
        labels = [str(r.get("stage", r.get("split", ""))) for r in rows]
        return Series(name, pts, labels=labels, **kw)

    def last_eval(self, split: str = "heldout") -> dict[str, Any]:
        rows = [r for r in self.evals if f"eval/{split}/success_rate" in r]
        return rows[-1] if rows else {}

    @property
    def eval_split(self) -> str:
        return str((self.config.get("env") or {}).get("eval_split", "heldout"))


# ---- the four curves ---------------------------------------------------------------------


def _curves(d: RunData) -> list[str]:
    split = d.eval_split
    splits = d.eval_keys(lambda p: len(p) == 3 and p[0] == "eval" and p[2] == "success_rate")
    kinds = d.eval_keys(lambda p: len(p) == 4 and p[1] == "adversarial" and p[3] == "success_rate")
    steps = [float(r.get("step", 0)) for r in d.train + d.evals]
    x = (min(steps, default=0.0), max(steps, default=1.0))
    constraint = sorted({k for r in d.train for k in r if k.startswith("train/constraint/")})
    return [
        line_chart(
            CURVES[0],
            "1 · Training reward (on the tasks being trained on)",
            [
                Panel(
                    "mean reward per episode",
                    [
                        d.train_series("train/reward_mean", "reward (mean)"),
                        d.train_series("train/success_rate", "success", dashed=True),
                    ],
                    y_min=0.0,
                    y_max=1.0,
                )
            ],
            x_range=x,
            note="Rises when the policy fits its training tasks; it says nothing about new "
            "ones. Read it with curve 2.",
        ),
        line_chart(
            CURVES[1],
            "2 · Held-out success (tasks never trained on)",
            [
                Panel(
                    "success rate",
                    [d.eval_series(k, k.split("/")[1]) for k in splits]
                    + [
                        d.eval_series(k, f"adversarial: {k.split('/')[2]}", dashed=True)
                        for k in kinds
                    ],
                    y_min=0.0,
                    y_max=1.0,
                    percent=True,
                )
            ],
            x_range=x,
            note="Step 0 holds the baseline (the model as loaded) and, with a warm start, "
            "the evaluation after it; hover a point for its stage.",
        ),
        line_chart(
            CURVES[2],
            "3 · Tool cost per episode",
            [
                Panel(
                    "tool calls per episode",
                    [
                        d.train_series("cost/tool_calls_mean", "train: calls"),
                        d.eval_series(f"eval/{split}/cost/tool_calls_mean", f"{split}: calls"),
                    ],
                    y_min=0.0,
                ),
                Panel(
                    "tool latency per episode (s)",
                    [
                        d.train_series("cost/tool_latency_ms_mean", "train: latency", 1e-3),
                        d.eval_series(
                            f"eval/{split}/cost/tool_latency_ms_mean", f"{split}: latency", 1e-3
                        ),
                    ],
                    y_min=0.0,
                ),
            ],
            x_range=x,
        ),
        line_chart(
            CURVES[3],
            "4 · Constraint-violation rate",
            [
                Panel(
                    "episodes violating a constraint",
                    [
                        d.train_series("train/constraint_violation_rate", "train: any"),
                        d.eval_series(f"eval/{split}/constraint_violation_rate", f"{split}: any"),
                    ]
                    + [
                        d.train_series(k, f"train: {k.rsplit('/', 1)[1]}", dashed=True)
                        for k in constraint
                    ],
                    y_min=0.0,
                    y_max=1.0,
                    percent=True,
                )
            ],
            x_range=x,
            note="Constraint-layer reward components (format, forbidden tools, permissions, "
            "budgets) that failed.",
        ),
    ]


# ---- tables ------------------------------------------------------------------------------


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [float(r[key]) for r in rows if key in r]
    return sum(vals) / len(vals) if vals else None


def _attribution(d: RunData) -> str:
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


def _stops(d: RunData) -> str:
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


def _components(d: RunData) -> str:
    layers: dict[str, str] = {}
    scored: dict[str, int] = {}
    pool = [e for e in d.episodes if e.phase == "train" and e.reward is not None] or [
        e for e in d.episodes if e.reward is not None
    ]
    for e in pool:
        for c in e.reward.components:  # type: ignore[union-attr]
            layers.setdefault(c.name, c.layer.value)
            scored[c.name] = scored.get(c.name, 0) + (c.decided and not c.gated)
    split, ev = d.eval_split, d.last_eval(d.eval_split)
    last = d.train[-1] if d.train else {}
    rows = [
        [
            name,
            layer,
            pct(scored[name] / len(pool)),
            _num(_mean(d.train, f"train/reward/{name}")),
            _num(last.get(f"train/reward/{name}")),
            _num(ev.get(f"eval/{split}/reward/{name}")),
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
        "mean beside its share.</p>"
    )


def _num(v: float | None) -> str:
    return "–" if v is None else f"{v:.3f}"


def _quality(d: RunData) -> str:
    split, ev = d.eval_split, d.last_eval(d.eval_split)
    last = d.train[-1] if d.train else {}
    stale = [k for r in d.train for k in r if "staleness" in k]
    dropped = sum(float(r.get("train/ineligible_episodes", 0.0)) for r in d.train)
    rows = [
        [
            "invalid citation rate",
            pct(last.get("train/invalid_citation_rate")),
            pct(ev.get(f"eval/{split}/invalid_citation_rate")),
        ],
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
            "staleness (policy versions behind)",
            _num(_mean(d.train, stale[0]))
            if stale
            else "0 (synchronous: sampled by the policy being updated)",
            "–",
        ],
    ]
    return table(["", "training (last step)", f"last eval ({split})"], rows, {1, 2})


def _secs(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f} s"


# ---- episodes ------------------------------------------------------------------------------


def _episode_links(d: RunData, tri: Triage, linked: dict[int, EpisodeRecord]) -> str:
    def link(e: EpisodeRecord) -> Raw:
        linked[id(e)] = e
        return Raw(f'<a href="episodes/{esc(page_name(e))}">{esc(e.episode_id)}</a>')

    rows = []
    scored = [e for e in d.episodes if e.total is not None]
    for label, pool in (
        ("training", [e for e in scored if e.phase == "train"]),
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
                rows.append([f"{bucket}: {kind}", link(e), e.where, _num(e.total), v.why])
    if not rows:
        return "<p>No episodes written yet.</p>"
    return table(["sample", "episode", "where", "reward", "why"], rows, {3})


def _short(episode_id: str) -> str:
    return episode_id if len(episode_id) <= 40 else episode_id[:37] + "..."


def _triage_table(tri: Triage, linked: dict[int, EpisodeRecord]) -> str:
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
                    f'<a href="episodes/{esc(page_name(e))}">{esc(_short(e.episode_id))}</a>'
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


# ---- run facts -------------------------------------------------------------------------------


def _facts(d: RunData) -> tuple[list[list[Any]], dict[str, str]]:
    rc = d.episodes[-1].receipt if d.episodes else {}
    env = rc.get("env") or {}
    planned = (d.config.get("trainer") or {}).get("steps")
    done = len(d.train)
    status = (
        "finished" if planned is not None and done >= planned and d.evals else "running or stopped"
    )
    starts = [e.receipt.get("started_at") for e in d.episodes if e.receipt.get("started_at")]
    duration = _duration(d)
    sampled = sum(
        int(((e.receipt.get("ledger") or {}).get("used") or {}).get("sampled_tokens", 0))
        for e in d.episodes
    )
    total = sum(len(t) for e in d.episodes for t in e.trajectories)
    facts = [
        ["run", d.run_dir.name],
        ["status", f"{status}: {done} of {planned if planned is not None else '?'} RL steps"],
        ["model", rc.get("model_id", (d.config.get("model") or {}).get("spec", "–"))],
        ["environment", f"{env.get('name', '–')} {env.get('version', '')}"],
        [
            "tool versions",
            ", ".join(f"{k} {v}" for k, v in (rc.get("tool_versions") or {}).items()),
        ],
        ["template sha256", str(rc.get("template_hash", ""))[:16]],
        ["first episode", min(starts) if starts else "–"],
        ["duration", duration],
        ["episodes", f"{len(d.episodes)} ({sum(e.phase == 'train' for e in d.episodes)} training)"],
        ["tokens", f"{total:,} in episodes, {sampled:,} sampled by the policy"],
    ]
    cards = {
        "status": f"{status} · {done}/{planned if planned is not None else '?'} steps",
        "duration": duration,
    }
    return facts, cards


def _duration(d: RunData) -> str:
    secs = sum(float(r.get("time/step_s", 0.0)) for r in d.train) + sum(
        float(r.get("time/warm_start_s", 0.0)) for r in d.other
    )
    stamps = []
    for e in d.episodes:
        start = e.receipt.get("started_at")
        if start:
            t0 = datetime.fromisoformat(start.replace("Z", "+00:00"))
            stamps += [t0.timestamp(), t0.timestamp() + float(e.receipt.get("wall_time_s") or 0)]
    wall = max(stamps) - min(stamps) if stamps else 0.0
    return f"{max(wall, secs) / 60:.1f} min (first to last episode)"


def _cards(d: RunData, cards: dict[str, str]) -> str:
    split = d.eval_split
    key = f"eval/{split}/success_rate"
    evs = [r for r in d.evals if key in r]
    warm = [r for r in evs if r.get("stage") == "warm_start"][-1:]
    shown = evs[:1] + warm + [r for r in evs[-1:] if r not in evs[:1] + warm]
    path = " → ".join(f"{100 * r[key]:.0f}%" for r in shown) or "–"
    stages = " → ".join(
        f"{r.get('stage', '')}" + (f" {r['step']}" if r.get("stage") == "train" else "")
        for r in shown
    )
    reward = [r["train/reward_mean"] for r in d.train if "train/reward_mean" in r]
    last = d.train[-1] if d.train else {}
    items = [
        ("held-out success", path, f"{split}: {stages}"),
        (
            "training reward",
            f"{reward[0]:.2f} → {reward[-1]:.2f}" if reward else "–",
            "first → last step",
        ),
        (
            "tool calls per episode",
            _num(last.get("cost/tool_calls_mean")),
            f"latency {_num((last.get('cost/tool_latency_ms_mean') or 0) / 1000)} s per episode",
        ),
        (
            "constraint violations",
            pct(last.get("train/constraint_violation_rate")),
            "of the last step's episodes",
        ),
        (
            "not the policy's fault",
            pct(
                (last.get("attribution/episodes_environment") or 0.0)
                + (last.get("attribution/episodes_evaluator") or 0.0)
                + (last.get("attribution/episodes_unknown") or 0.0)
                if last
                else None
            ),
            "environment, evaluator or unknown (last step)",
        ),
        ("run", cards["status"], cards["duration"]),
    ]
    return (
        '<div class="cards">'
        + "".join(
            f'<div class="card"><div class="label">{esc(a)}</div><div class="value">{esc(b)}</div>'
            f'<div class="detail">{esc(c)}</div></div>'
            for a, b, c in items
        )
        + "</div>"
    )


def write_report(run_dir: str | os.PathLike[str], n_triage: int = 100) -> Path:
    """Write ``RUN/report/index.html`` and the linked episodes' pages; returns the index."""
    d = RunData.load(run_dir)
    tri = triage(d.episodes, n_triage)
    linked: dict[int, EpisodeRecord] = {}
    facts, cards = _facts(d)
    episodes_html = _episode_links(d, tri, linked)
    triage_html = _triage_table(tri, linked)
    config = yaml.safe_dump(d.config, sort_keys=False) if d.config else "(no config.yaml)"
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    body = (
        f"<h1>tracerl run: {esc(d.run_dir.name)}</h1>"
        f'<p class="sub">{esc(facts[2][1])} on {esc(facts[3][1])} · report written {stamp} '
        "from the run directory alone</p>"
        + _cards(d, cards)
        + '<h2>Four curves, never on one axis</h2><div class="grid2">'
        + "".join(_curves(d))
        + "</div><h2>Whose fault: attribution</h2>"
        + _attribution(d)
        + "<h2>How episodes ended</h2>"
        + _stops(d)
        + "<h2>Reward components</h2>"
        + _components(d)
        + "<h2>Citations, latency, eligibility</h2>"
        + _quality(d)
        + "<h2>Sample episodes</h2>"
        + episodes_html
        + "<h2>Triage</h2>"
        + triage_html
        + "<h2>Run facts</h2>"
        + table(["", ""], facts)
        + f"<details><summary>config.yaml</summary><pre>{esc(config)}</pre></details>"
    )
    out = d.run_dir / "report"
    (out / "episodes").mkdir(parents=True, exist_ok=True)
    for e in linked.values():
        _write(out / "episodes" / page_name(e), episode_page(e))
    index = out / "index.html"
    _write(index, page(f"tracerl · {d.run_dir.name}", body))
    return index


def _write(path: Path, text: str) -> None:
    """Write whole or not at all: a reader never sees half a page."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
