"""The trajectory viewer: one HTML page per episode.

Every token is drawn in its author's colour (prompt, policy, environment, echo, template)
with the loss mask outlined, beside the text of each segment; then each step's action,
observation, cost, evidence gain and receipt fields; the reward breakdown with the
citation verdicts; the attribution and the stop reason. All model, tool and task text is
escaped (`tracerl.report.page.esc`).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from tracerl.report.page import Raw, esc, page, table
from tracerl.report.run import EpisodeRecord, sample_origin
from tracerl.report.triage import classify
from tracerl.types import Source, Trajectory

SOURCES = [s.value for s in Source]


def page_name(ep: EpisodeRecord) -> str:
    """A file name for the episode's page, unique within the run (the same id can recur in
    two evaluations of one step)."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", ep.episode_id)[:60].strip("_") or "episode"
    key = f"{ep.where_in_run}|{ep.episode_id}"  # the same name however RUN was spelled
    digest = hashlib.sha1(key.encode()).hexdigest()[:8]
    return f"{slug}-{digest}.html"


def _tag(text: str, kind: str = "") -> Raw:
    return Raw(f'<span class="tag {kind}">{esc(text)}</span>')


def action_text(step: dict[str, Any]) -> str:
    action = step.get("action") or {}
    if step.get("fault"):
        return f"unreadable: {step['fault'].get('message', '')}"
    if action.get("kind") == "final" or action.get("answer") is not None:
        return f"answer: {action.get('answer')}"
    if action.get("kind") == "summary":  # a compaction's summarize turn
        return f"summary: {action.get('text', '')}"
    calls = action.get("tool_calls") or []
    return "; ".join(
        f"{c['name']}({json.dumps(c.get('arguments'), ensure_ascii=False)})" for c in calls
    )


def observation_text(step: dict[str, Any]) -> str:
    calls = step.get("calls") or []
    parts = [
        f"{c['action']['tool']}: {c['observation']['status']} "
        f"({c['observation'].get('chars', 0)} chars"
        f"{', dry run' if (c.get('result') or {}).get('dry_run') else ''})"
        for c in calls
    ]
    # a new sample starts after this step: the harness rewrote its history (gateway
    # episodes), or the chat template re-rendered earlier turns
    if step.get("history_break"):
        parts.append(f"history break (new sample): {step['history_break']}")
    if step.get("prefix_break"):
        parts.append("template break (new sample)")
    return "; ".join(parts) or "–"


def agent_text(receipt: dict[str, Any]) -> str | None:
    """Who drove a gateway episode (`tracerl.gateway`): the agent, its requests, its
    history breaks and how it ended; None for tracerl's own episodes."""
    a = receipt.get("agent")
    if not a:
        return None
    breaks = len(a.get("history_breaks") or [])
    out = f"{a.get('entry')} · {a.get('requests', 0)} requests · {breaks} history breaks"
    if a.get("exception"):
        out += f" · raised {a['exception']} ({a.get('exception_owner')}'s)"
    if a.get("timed_out"):
        out += f" · timed out after {a.get('timeout_s')} s"
    return out


def _steps_table(ep: EpisodeRecord) -> str:
    events = {e.get("step"): e for e in (ep.receipt.get("ledger") or {}).get("events", [])}
    earned = _step_rewards(ep)
    rows = []
    for s in ep.steps:
        k = s.get("step")
        ev = events.get(k, {})
        owner = "policy" if s.get("policy_error") else "environment" if s.get("infra_error") else ""
        rows.append(
            [
                k,
                action_text(s),
                observation_text(s),
                f"{ev.get('cost_ms', s.get('latency_ms', 0.0)) or 0.0:.1f}",
                f"{s.get('evidence_gain', ev.get('evidence_gain', 0.0)) or 0.0:.2f}",
                *([_step_reward_cell(earned.get(k, {}))] if earned else []),
                s.get("tokens", ""),
                s.get("exception") or "",
                max(0, len(s.get("attempts") or []) - 1),
                _tag(owner + " error", "bad" if owner == "policy" else "env") if owner else "",
            ]
        )
    head = ["step", "action", "observation", "cost ms", "evidence gain"]
    head += ["step reward"] if earned else []
    head += ["tokens", "exception", "retries", "fault"]
    shift = 1 if earned else 0
    return table(head, rows, num={0, 3, 4, 5 + shift, 7 + shift})


def _step_rewards(ep: EpisodeRecord) -> dict[Any, dict[str, float]]:
    """Per step: what each per-step reward component paid it (empty when none did)."""
    return ep.reward.step_components() if ep.reward is not None else {}


def _step_reward_cell(by: dict[str, float]) -> str:
    """The step's own reward, then each component's share: ``0.20 (gain 0.20, cost -0.02)``."""
    if not by:
        return ""
    parts = ", ".join(f"{name} {v + 0.0:+.2f}" for name, v in by.items())  # no "-0.00"
    return f"{sum(by.values()) + 0.0:.2f} ({parts})"


def _reward_table(ep: EpisodeRecord) -> str:
    r = ep.trajectories[0].reward
    if not r:
        return "<p>No reward was recorded for this episode.</p>"
    rows = []
    for c in r["components"]:
        state = "gated" if c.get("gated") else "undecided" if not c.get("decided", True) else ""
        if c.get("steps") is not None:  # scored per step: its shares are in the step table
            state = ", ".join(x for x in (state, f"per step ({len(c['steps'])})") if x)
        evidence = json.dumps(c.get("evidence") or {}, ensure_ascii=False, indent=None)
        rows.append(
            [
                c["name"],
                c["layer"],
                f"{c['value']:.3f}",
                f"{c['weight']:.2f}",
                f"{c['contribution']:.3f}",
                state,
                Raw(f"<code>{esc(_clip(evidence))}</code>") if evidence != "{}" else "",
            ]
        )
    head = (
        f"<p>total <b>{r['total']:.3f}</b> · attribution {esc(r['attribution'])} · "
        f"{'decided' if r['decided'] else 'undecided'} · "
        f"{'eligible for the gradient' if r.get('eligible') else 'not eligible for the gradient'}"
        f"{' · evaluator error: ' + esc(r['error']) if r.get('error') else ''}</p>"
    )
    verdicts = [v for c in r["components"] for v in (c.get("evidence") or {}).get("verdicts") or []]
    cited = (
        "<h3>Citation verdicts</h3>"
        + table(
            ["document", "exists", "quoted", "supports the answer", "valid", "why not"],
            [
                [
                    v.get("doc_id"),
                    v.get("exists"),
                    v.get("quoted"),
                    v.get("supports"),
                    v.get("valid"),
                    v.get("reason", ""),
                ]
                for v in verdicts
            ],
        )
        if verdicts
        else ""
    )
    return (
        head
        + table(
            ["component", "layer", "value", "weight", "contribution", "state", "evidence"],
            rows,
            num={2, 3, 4},
        )
        + cited
    )


def _clip(text: str, limit: int = 600) -> str:
    return (
        text if len(text) <= limit else text[:limit] + f" … ({len(text) - limit} more characters)"
    )


def _token_view(t: Trajectory, origin: str = "") -> str:
    cells, text = [], []
    pos = 0
    for seg in t.segments:
        cls = f"src-{seg.source.value}"
        lps = seg.logprobs or (None,) * len(seg.token_ids)
        for tid, lp in zip(seg.token_ids, lps, strict=True):
            loss = seg.source is Source.POLICY
            tip = f"#{pos} {seg.source.value} id {tid} loss {int(loss)}"
            if lp is not None:
                tip += f" logprob {lp:.3f}"
            cells.append(f'<i class="{cls}{" loss" if loss else ""}" title="{esc(tip)}"></i>')
            pos += 1
        label = f"{seg.source.value} · step {seg.step} · {len(seg.token_ids)} tokens"
        if seg.source is Source.POLICY:
            label += f" · loss · policy v{seg.policy_version}"
        text.append(
            f'<span class="seg {cls}" title="{esc(label)}">'
            f"{esc(seg.text if seg.text is not None else f'<{len(seg.token_ids)} tokens>')}</span>"
        )
    counts = ", ".join(f"{s}: {t.count(s)}" for s in SOURCES if t.count(s))
    return (
        f"<h3>sample {t.sample_index}: {len(t)} tokens, {sum(t.loss_mask)} with loss "
        f"({esc(counts)})</h3>"
        + (f'<p class="sub">{esc(origin)}</p>' if origin else "")
        + '<div class="strip" aria-label="one cell per token">'
        + "".join(cells)
        + '</div><div class="tokens">'
        + "".join(text)
        + "</div>"
    )


def episode_page(ep: EpisodeRecord, back: str = "../index.html") -> str:
    rc = ep.receipt
    verdict = classify(ep)
    ledger = rc.get("ledger") or {}
    facts = [
        ["where", ep.where],
        ["episode id", ep.episode_id],
        ["replay id", rc.get("replay_id", "")],
        ["question", ep.question],
        ["gold answers", ", ".join(ep.gold_answers)],
        ["stop reason", _tag(ep.stop_reason, "ok" if ep.stop_reason == "answered" else "bad")],
        ["attribution", _tag(ep.attribution, "env" if ep.attribution == "environment" else "")],
        ["triage", f"{verdict.bucket} / {verdict.kind}: {verdict.why}"],
        ["gradient eligible", str(rc.get("gradient_eligible"))],
        ["policy version", rc.get("policy_version")],
        ["agent", agent_text(rc)],
        ["model", rc.get("model_id", "")],
        ["env", f"{(rc.get('env') or {}).get('name')} {(rc.get('env') or {}).get('version')}"],
        ["seed", rc.get("seed")],
        ["wall time", f"{rc.get('wall_time_s') or 0.0:.2f} s"],
        ["side-effect guard", rc.get("side_effect_guard", "")],
        ["error", rc.get("error") or ""],
    ]
    legend = " ".join(f'<span class="seg src-{s}">{s}</span>' for s in SOURCES)
    body = (
        f'<p><a href="{esc(back)}">← dashboard</a></p>'
        f"<h1>Episode {esc(ep.episode_id)}</h1>"
        f'<p class="sub">{esc(ep.where)} · reward '
        f"{'–' if ep.total is None else f'{ep.total:.3f}'} · {esc(verdict.bucket)}</p>"
        + table(["", ""], [[k, v] for k, v in facts if v not in (None, "")])
        + "<h2>Reward breakdown</h2>"
        + _reward_table(ep)
        + "<h2>Steps</h2>"
        + _steps_table(ep)
        + "<h2>Budget ledger</h2>"
        + table(
            ["budget", "limit", "used"],
            [
                [k, (ledger.get("budgets") or {}).get(k, "–"), v]
                for k, v in (ledger.get("used") or {}).items()
            ],
            num={1, 2},
        )
        + f"<p>finalize: {esc(ledger.get('finalize') or 'not routed')}</p>"
        + "<h2>Tokens by author</h2>"
        + f"<p>{legend} · policy tokens are outlined (loss mask 1) · "
        '<label><input type="checkbox" id="mask-only"> dim tokens without loss</label></p>'
        + "".join(
            _token_view(t, sample_origin(ep.trajectories, i) if len(ep.trajectories) > 1 else "")
            for i, t in enumerate(ep.trajectories)
        )
        + "<h2>Receipt</h2><details><summary>the full receipt (JSON)</summary><pre>"
        + esc(json.dumps(rc, indent=1, ensure_ascii=False, default=str))
        + "</pre></details>"
    )
    return page(f"episode {ep.episode_id}", body)
