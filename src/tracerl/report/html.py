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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from tracerl.report import distillation, judges, sections
from tracerl.report import facts as run_facts
from tracerl.report.long_horizon import section as long_horizon_section
from tracerl.report.page import esc, page, table
from tracerl.report.run import LEDGER_FILE, EpisodeRecord, RunData
from tracerl.report.svg import Panel, Series, line_chart
from tracerl.report.triage import triage
from tracerl.report.viewer import episode_page, page_name

CURVES = ("training-reward", "heldout-success", "tool-cost", "constraint-violations")
ASYNC_CURVES = ("staleness", "effective-lr")
GAP_CURVE = "logprob-gap"


# ---- the four curves ---------------------------------------------------------------------


def _train(d: RunData, key: str, name: str, scale: float = 1.0, **kw: Any) -> Series:
    return Series(name, d.train_points(key, scale), **kw)


def _eval(d: RunData, key: str, name: str, scale: float = 1.0, **kw: Any) -> Series:
    points, labels = d.eval_points(key, scale)
    return Series(name, points, labels=labels, **kw)


def _curves(d: RunData) -> list[str]:
    split = d.eval_split
    splits = d.eval_keys(lambda p: len(p) == 3 and p[0] == "eval" and p[2] == "success_rate")
    kinds = d.eval_keys(lambda p: len(p) == 4 and p[1] == "adversarial" and p[3] == "success_rate")
    steps = [float(r.get("step", 0)) for r in d.train] + [d.eval_x(r) for r in d.evals]
    x = (min(steps, default=0.0), max(steps, default=1.0))
    names = {-1.0: "base"} if d.warm_started else {}
    constraint = sorted({k for r in d.train for k in r if k.startswith("train/constraint/")})
    return [
        line_chart(
            CURVES[0],
            "1 · Training reward (on the tasks being trained on)",
            [
                Panel(
                    "mean reward per episode",
                    [
                        _train(d, "train/reward_mean", "reward (mean)"),
                        _train(d, "train/success_rate", "success", dashed=True),
                    ],
                    y_min=0.0,
                    y_max=1.0,
                )
            ],
            x_range=x,
            x_labels=names,
            note="Rises when the policy fits its training tasks; it says nothing about new "
            "ones. Read it with curve 2.",
        ),
        line_chart(
            CURVES[1],
            "2 · Held-out success (tasks never trained on)",
            [
                Panel(
                    "success rate",
                    [_eval(d, k, k.split("/")[1]) for k in splits]
                    + [_eval(d, k, f"adversarial: {k.split('/')[2]}", dashed=True) for k in kinds],
                    y_min=0.0,
                    y_max=1.0,
                    percent=True,
                )
            ],
            x_range=x,
            x_labels=names,
            note="Step 0 is the policy RL starts from; with a warm start, 'base' is the model "
            "as loaded, before it. Hover a point for its stage.",
        ),
        line_chart(
            CURVES[2],
            "3 · Tool cost per episode",
            [
                Panel(
                    "tool calls per episode",
                    [
                        _train(d, "cost/tool_calls_mean", "train: calls"),
                        _eval(d, f"eval/{split}/cost/tool_calls_mean", f"{split}: calls"),
                    ],
                    y_min=0.0,
                ),
                Panel(
                    "tool latency per episode (s)",
                    [
                        _train(d, "cost/tool_latency_ms_mean", "train: latency", 1e-3),
                        _eval(
                            d, f"eval/{split}/cost/tool_latency_ms_mean", f"{split}: latency", 1e-3
                        ),
                    ],
                    y_min=0.0,
                ),
            ]
            + (
                [
                    Panel(
                        "judge tokens per episode",
                        [
                            _train(d, "train/judge_tokens_mean", "train: judge tokens"),
                            _eval(d, f"eval/{split}/judge_tokens_mean", f"{split}: judge tokens"),
                        ],
                        y_min=0.0,
                    )
                ]
                if sections.has_metric(d, "judge_tokens_mean")
                else []
            )
            + (
                [
                    Panel(
                        "teacher tokens per episode",
                        [_train(d, "train/distill/teacher_tokens_mean", "train: teacher tokens")],
                        y_min=0.0,
                    )
                ]
                if sections.has_metric(d, "distill/teacher_tokens_mean")
                else []
            ),
            x_range=x,
            x_labels=names,
        ),
        line_chart(
            CURVES[3],
            "4 · Constraint-violation rate",
            [
                Panel(
                    "episodes violating a constraint",
                    [
                        _train(d, "train/constraint_violation_rate", "train: any"),
                        _eval(d, f"eval/{split}/constraint_violation_rate", f"{split}: any"),
                    ]
                    + [
                        _train(d, k, f"train: {k.rsplit('/', 1)[1]}", dashed=True)
                        for k in constraint
                    ],
                    y_min=0.0,
                    y_max=1.0,
                    percent=True,
                )
            ],
            x_range=x,
            x_labels=names,
            note="Constraint-layer reward components (format, forbidden tools, permissions, "
            "budgets) that failed.",
        ),
    ]


def _async_usage(d: RunData) -> str:
    """What became of the training episodes an asynchronous run sampled (its ledger)."""
    if not d.ledger:
        return ""
    sampled = {e.episode_id for e in d.episodes if e.phase == "train"}
    trained = {i for r in d.ledger.values() for i in r.get("trained", [])}
    dropped = {i for r in d.ledger.values() for i in r.get("dropped_stale", [])} - trained
    aside = {i for r in d.ledger.values() for i in r.get("filtered", [])} - trained - dropped
    unused = sections.never_trained(d)
    filtered = f", {len(aside)} set aside without signal (dynamic sampling)" if aside else ""
    return (
        f'<p class="sub">Of {len(sampled)} training episodes sampled, {len(trained)} were '
        f"trained on, {len(dropped)} dropped as too stale{filtered} and {len(unused)} never used "
        "(sampled past the last step, or still waiting for the learner when the run ended); "
        f"the run directory's <code>{LEDGER_FILE}</code> lists them by step.</p>"
    )


def _async_curves(d: RunData) -> list[str]:
    """With asynchronous training: how stale the trained samples were, and the learning
    rate the staleness left (`tracerl.algos.staleness`)."""
    if not any("async/staleness_mean" in r for r in d.train):
        return []
    return [
        line_chart(
            ASYNC_CURVES[0],
            "5 · Staleness of trained samples",
            [
                Panel(
                    "policy versions behind the learner",
                    [
                        _train(d, "async/staleness_mean", "mean"),
                        _train(d, "async/staleness_max", "max", dashed=True),
                    ],
                    y_min=0.0,
                ),
                Panel(
                    "episodes dropped as too stale",
                    [_train(d, "async/dropped_stale", "dropped")],
                    y_min=0.0,
                ),
            ],
        ),
        line_chart(
            ASYNC_CURVES[1],
            "6 · Effective learning rate",
            [
                Panel(
                    "lr x f(staleness)",
                    [_train(d, "async/lr_effective", "effective lr")],
                    y_min=0.0,
                ),
                Panel(
                    "learner waiting for rollouts (s per step)",
                    [_train(d, "async/learner_wait_s", "wait")],
                    y_min=0.0,
                ),
            ],
        ),
    ]


def _gap_curve(d: RunData, number: int) -> list[str]:
    """When the learner measured it (it had the sampler's log-probs): how far the sampler's
    log-probs of its tokens are from the learner's recomputation, and the share of policy
    tokens masked importance sampling dropped (``trainer.is_mask``)."""
    if not any("train/logprob_gap_mean" in r for r in d.train):
        return []
    panels = [
        Panel(
            "|learner − sampler| log-prob per policy token",
            [
                _train(d, "train/logprob_gap_mean", "mean"),
                _train(d, "train/logprob_gap_max", "max", dashed=True),
            ],
            y_min=0.0,
        )
    ]
    if any("train/is_masked_frac" in r for r in d.train):
        panels.append(
            Panel(
                "policy tokens dropped by the IS mask",
                [_train(d, "train/is_masked_frac", "masked")],
                y_min=0.0,
                percent=True,
            )
        )
    return [
        line_chart(
            GAP_CURVE,
            f"{number} · Sampler–learner log-prob gap",
            panels,
            note="The sampler's own log-probs of the tokens it sampled against the learner's "
            "recomputation before the update. Near 0 when one model in one dtype does both; "
            "another engine or dtype (a bf16 vLLM server) leaves a small steady gap, which "
            "trainer.tis_cap and trainer.is_mask correct. A gap that grows means the sampler's "
            "weights have drifted from the learner's (check the weight sync).",
        )
    ]


def write_report(
    run_dir: str | os.PathLike[str], n_triage: int = 100, data: RunData | None = None
) -> Path:
    """Write ``RUN/report/index.html`` and the linked episodes' pages; returns the index.
    `data`: the run directory, when the caller has read it already."""
    d = RunData.load(run_dir) if data is None else data
    unused = sections.never_trained(d)  # an asynchronous run's samples no update used
    tri = triage([e for e in d.episodes if e.episode_id not in unused], n_triage)
    linked: dict[int, EpisodeRecord] = {}
    facts, cards = run_facts.facts(d)
    episodes_html = sections.episode_links(d, tri, linked)
    triage_html = sections.triage_table(tri, linked)
    config = yaml.safe_dump(d.config, sort_keys=False) if d.config else "(no config.yaml)"
    async_curves = _async_curves(d)
    gap_curve = _gap_curve(d, len(CURVES) + len(async_curves) + 1)
    long_horizon = long_horizon_section(d, len(CURVES) + len(async_curves) + len(gap_curve) + 1)
    before = len(CURVES) + len(async_curves) + len(gap_curve) + bool(long_horizon)
    distilled = distillation.section(d, before + 1)
    cited = any(sections.has_metric(d, key) for _, key, _ in sections.SEARCH_ROWS)
    quality_heading = "Citations, latency, eligibility" if cited else "Latency, eligibility"
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    body = (
        f"<h1>tracerl run: {esc(d.run_dir.name)}</h1>"
        f'<p class="sub">{esc(facts[2][1])} on {esc(facts[3][1])} · report written {stamp} '
        "from the run directory alone</p>"
        + run_facts.cards(d, cards)
        + '<h2>Four curves, never on one axis</h2><div class="grid2">'
        + "".join(_curves(d))
        + "</div>"
        + (
            "<h2>Asynchronous training</h2>"
            + _async_usage(d)
            + '<div class="grid2">'
            + "".join(async_curves)
            + "</div>"
            if async_curves
            else ""
        )
        + (
            '<h2>Sampler and learner</h2><div class="grid2">' + "".join(gap_curve) + "</div>"
            if gap_curve
            else ""
        )
        + (f"<h2>Long horizons</h2>{long_horizon}" if long_horizon else "")
        + (f"<h2>Distillation</h2>{distilled}" if distilled else "")
        + "<h2>Whose fault: attribution</h2>"
        + sections.attribution(d)
        + "<h2>How episodes ended</h2>"
        + sections.stops(d)
        + "<h2>Reward components</h2>"
        + sections.components(d)
        + (f"<h2>Judges</h2>{judged}" if (judged := judges.section(d)) else "")
        + f"<h2>{quality_heading}</h2>"
        + sections.quality(d)
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
    for old in (out / "episodes").glob("*.html"):  # pages an earlier report linked
        old.unlink()
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
