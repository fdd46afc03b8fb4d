"""The dashboard's run facts (what ran, on what, how long, trained how) and its headline
cards."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from tracerl.report.page import esc, num, pct
from tracerl.report.run import RunData


def _advantage(trainer: dict[str, Any]) -> str:
    """Which estimator trained the run, and how credit reached the turns."""
    est, credit = trainer.get("advantage", "grpo"), trainer.get("credit", "episode")
    if credit == "episode":
        return f"{est}, one per episode"
    extra = f", gamma {trainer.get('credit_gamma', 1.0)}"
    if credit == "step_groups":
        extra += f", step weight {trainer.get('step_group_weight', 1.0)}"
    return f"{est}, per turn: {credit}{extra}"


def _sampling(trainer: dict[str, Any]) -> str:
    """Whether groups without signal were replaced (dynamic sampling), and its cap; with
    asynchronous training, how far ahead of the learner sampling ran."""
    ds = trainer.get("dynamic_sampling")
    said = (
        f"dynamic: groups without signal replaced, up to {ds.get('max_rounds', 3)} rounds a step"
        if ds
        else None
    )
    if trainer.get("mode") == "async":
        ahead = (
            f"asynchronous: sampled up to {trainer.get('max_staleness', 1)} policy versions "
            "ahead of the learner; what each update trained on, dropped or never used: Async"
        )
        return f"{ahead}; {said}" if said else ahead
    return said or "every sampled group trained on"


def _teacher(trainer: dict[str, Any]) -> str | None:
    """Who graded the student's tokens (``trainer.distill``), and how the advantages mix."""
    t = trainer.get("distill")
    if not t:
        return None
    server = t.get("server") or {}
    who = t.get("teacher") or f"{server.get('model')} at {server.get('base_url')}"
    return (
        f"{who}; advantage = {t.get('outcome_weight', 1.0)} x outcome + "
        f"{t.get('distill_weight', 1.0)} x (log p_teacher - log p_student)"
    )


def facts(d: RunData) -> tuple[list[list[Any]], dict[str, str]]:
    rc = d.episodes[-1].receipt if d.episodes else {}
    env = rc.get("env") or {}
    planned = (d.config.get("trainer") or {}).get("steps")
    done = len(d.train)
    final_eval = any(r.get("step") == planned and r.get("phase") == "eval" for r in d.evals)
    if not d.train and d.evals and all("phase" not in r for r in d.evals):
        status = "evaluation only"
    elif planned is not None and done >= planned and final_eval:
        status = "finished"
    else:
        status = "running or stopped"
    progress = status
    if status != "evaluation only":
        progress += f": {done} of {planned if planned is not None else '?'} RL steps"
    starts = [e.receipt.get("started_at") for e in d.episodes if e.receipt.get("started_at")]
    duration = _duration(d)
    sampled = sum(
        int(((e.receipt.get("ledger") or {}).get("used") or {}).get("sampled_tokens", 0))
        for e in d.episodes
    )
    total = sum(len(t) for e in d.episodes for t in e.trajectories)
    facts = [
        ["run", d.run_dir.name],
        ["status", progress],
        ["model", rc.get("model_id", (d.config.get("model") or {}).get("spec", "–"))],
        ["environment", f"{env.get('name', '–')} {env.get('version', '')}"],
        [
            "tool versions",
            ", ".join(f"{k} {v}" for k, v in (rc.get("tool_versions") or {}).items()),
        ],
        ["template sha256", str(rc.get("template_hash", ""))[:16]],
        ["advantage", _advantage(d.config.get("trainer") or {})],
        ["sampling", _sampling(d.config.get("trainer") or {})],
        *([["teacher", teacher]] if (teacher := _teacher(d.config.get("trainer") or {})) else []),
        ["first episode", min(starts) if starts else "–"],
        ["duration", duration],
        ["episodes", f"{len(d.episodes)} ({sum(e.phase == 'train' for e in d.episodes)} training)"],
        ["tokens", f"{total:,} in episodes, {sampled:,} sampled by the policy"],
    ]
    cards = {
        "status": progress,
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


def cards(d: RunData, run_card: dict[str, str]) -> str:
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
            num(last.get("cost/tool_calls_mean")),
            f"latency {num((last.get('cost/tool_latency_ms_mean') or 0) / 1000)} s per episode",
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
        ("run", run_card["status"], run_card["duration"]),
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
