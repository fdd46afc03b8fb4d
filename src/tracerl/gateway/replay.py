"""Replaying a gateway episode (one an agent harness drove, `tracerl.gateway`).

Exact replay feeds the recorded requests, in order, to a fresh `GatewaySession` whose
sampler answers each turn with the recorded tokens (and log-probs): the session must
rebuild the same samples (token ids, sources, loss mask), the same history breaks and the
same stop. It checks what tracerl did with the harness's messages (rendering, provenance,
break detection, budgets); the harness itself is not run.

Live replay runs the agent again (imported from the receipt), the model's turns served
from the recording, and reports per request whether the harness sent what it sent then:
its tools' results drifting (a service that changed), or the harness itself changing.

`replay_exact` and `replay_live` here replay any recorded episode: a runner episode through
`tracerl.rollout.replay`, a gateway episode (its receipt names an agent) as above. Callers
that may meet either (`tracerl replay`, the demo, readiness) use these.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from tracerl.envs.base import Env
from tracerl.gateway.agent import ending
from tracerl.gateway.chat import ASKED, GatewayError, normalize_messages, normalize_tools
from tracerl.gateway.harness import HarnessEnv
from tracerl.gateway.session import GatewaySession
from tracerl.gateway.tree import child_stop
from tracerl.rollout import live_replay as runner_live
from tracerl.rollout import replay as runner_replay
from tracerl.rollout.budget import RolloutConfig
from tracerl.rollout.live_replay import Drift, LiveReport
from tracerl.rollout.replay import ReplayReport, first_difference, recorded_policy
from tracerl.rollout.sampler import SamplerUnavailable
from tracerl.types import Receipt, StopReason, Trajectory

SAMPLER_FAILED = ("sampler_unavailable", "sampling_failed", "gateway_failed")


async def replay_exact(trajectories: Sequence[Trajectory], *, renderer: Any = None) -> ReplayReport:
    """Exact replay of any recorded episode (`tracerl.rollout.replay.replay_exact`), a gateway
    episode's through a fresh session (`replay_exact_gateway`)."""
    return await runner_replay.replay_exact(
        trajectories, renderer=renderer, agent=replay_exact_gateway
    )


async def replay_live(trajectories: Sequence[Trajectory], env: Env | None = None) -> LiveReport:
    """Live replay of any recorded episode (`tracerl.rollout.live_replay.replay_live`), a gateway
    episode's by running its agent again (`replay_live_gateway`)."""
    return await runner_live.replay_live(trajectories, env, agent=replay_live_gateway)


def _unanswered(
    session: GatewaySession, body: dict[str, Any], request: dict[str, Any], recorded_stop: str
) -> str | None:
    """Replay a request that got no turn: its messages, then the budget check."""
    try:
        session._update(normalize_messages(body["messages"]), normalize_tools(body["tools"]))
    except GatewayError as e:
        return e.message
    if request.get("why") == "budget_exhausted" and session.stop is None:
        stop = session._stop_before_turn()
        if stop is None and recorded_stop == StopReason.TIMEOUT.value:
            stop = StopReason.TIMEOUT  # the wall clock ran out: not replayable, taken as read
        session.stop = stop
    return None


def recorded_tools(receipt: Receipt) -> list[dict[str, Any]] | None:
    tools = [{k: v for k, v in t.items() if k != "x-effect"} for t in receipt.tool_schemas]
    return tools or None


async def replay_exact_gateway(trajectories: Sequence[Trajectory], renderer: Any) -> ReplayReport:
    """Exact replay of a gateway episode: a `tracerl.rollout.replay.ReplayReport`. An
    episode with child sessions (`tracerl.gateway.tree`) replays its root conversation,
    then each child's from the child's own receipt."""
    root = [t for t in trajectories if not t.agent]
    report = await _replay_session(root, renderer)
    for name in sorted({t.agent for t in trajectories if t.agent}):
        if not report.ok:
            break
        own = [dataclasses.replace(t, agent="", _cache={}) for t in trajectories if t.agent == name]
        child = await _replay_session(own, renderer, child=True)
        if not child.ok:
            why = f"child session {name}: {child.first_difference}"
            report = ReplayReport(report.episode_id, False, why, child.stop_reason)
    return report


async def _replay_session(
    trajectories: Sequence[Trajectory], renderer: Any, *, child: bool = False
) -> ReplayReport:
    receipt = Receipt.from_dict(trajectories[0].receipt)
    steps = {s["step"]: s for t in trajectories for s in t.steps}
    # a turn never recorded failed when it was sampled (the sampler was down): so again
    policy = recorded_policy(trajectories, receipt, renderer, missing=SamplerUnavailable)
    cfg = RolloutConfig.model_validate(receipt.rollout)  # the wall clock is not replayed:
    cfg = cfg.model_copy(update={"budgets": cfg.budgets.model_copy(update={"wall_time_s": None})})
    session = GatewaySession(
        "replay",
        policy,
        cfg,
        seed=receipt.seed,
        episode_id=receipt.episode_id,
        task=receipt.task,
        template_kwargs=receipt.template_kwargs,
    )
    tools = recorded_tools(receipt)
    agent = receipt.agent or {}
    requests = [steps[k]["request"] for k in sorted(steps) if "request" in steps[k]]
    if agent.get("unanswered"):
        requests.append(agent["unanswered"])
    counted = 0  # what the rest of the tree had spent, counted into this session's ledger
    for k, request in enumerate(requests):
        # the tokens the episode's other conversations had spent of ``budgets.sampled_tokens``
        # when this request came (`tracerl.gateway.tree`): counted in, this conversation's
        # budget checks and token limits are the recorded ones though it replays on its own
        others = request.get("tree_sampled_tokens", 0)
        session.ledger.used["sampled_tokens"] += others - counted
        counted = others
        if "messages" in request:
            messages, tools = request["messages"], request.get("tools", tools)
        else:
            messages = [*session.history, *request["new_messages"]]
        body = {"messages": messages, "tools": tools}
        body.update({key: request[key] for key in ASKED if key in request})
        last = k == len(requests) - 1 and bool(agent.get("unanswered"))
        if last and request.get("why") not in SAMPLER_FAILED:
            # refused by a budget, or still unanswered when the episode ended: what it
            # changed is its messages (and the budget check), not a turn
            problem = _unanswered(session, body, request, receipt.stop_reason or "")
            if problem is not None:
                return ReplayReport(receipt.episode_id, False, f"request {k}: {problem}")
            continue
        try:
            await session.complete(body)
        except GatewayError as e:  # only the last request may go unanswered, as recorded
            if not last:
                return ReplayReport(receipt.episode_id, False, f"request {k}: {e.message}")
    for k, rec in sorted(steps.items()):  # what the harness was answered, turn by turn
        again = session.records.get(k, {})
        for key in ("response", "policy_error"):
            if key in rec and rec[key] != again.get(key):
                return ReplayReport(
                    receipt.episode_id,
                    False,
                    f"step {k}: {key} recorded {rec[key]!r:.120}, replayed {again.get(key)!r:.120}",
                )
    replayed = session.conv.samples() if session.conv is not None else []
    diff = first_difference(trajectories, replayed)
    recorded_breaks = [b["reason"] for b in agent.get("history_breaks", [])]
    if diff is None and [b["reason"] for b in session.breaks] != recorded_breaks:
        diff = f"history breaks: recorded {recorded_breaks}, replayed {session.breaks}"
    recorded_stop = receipt.stop_reason or ""
    replayed_stop = (child_stop(session) if child else ending(session, agent)).value
    if diff is None and replayed_stop != recorded_stop:
        diff = f"stop reason: recorded {recorded_stop!r}, replayed {replayed_stop!r}"
    stops = (recorded_stop, replayed_stop)
    return ReplayReport(receipt.episode_id, diff is None, diff, stops)


async def replay_live_gateway(
    trajectories: Sequence[Trajectory], renderer: Any = None
) -> LiveReport:
    """Run the recorded agent again against the recorded model turns: a
    `tracerl.rollout.live_replay.LiveReport` of which requests drifted."""
    from tracerl.gateway.agent import AgentBackend
    from tracerl.gateway.server import Gateway

    receipt = Receipt.from_dict(trajectories[0].receipt)
    agent = receipt.agent or {}
    if renderer is None:
        from tracerl.models.refs import load_renderer

        renderer = load_renderer(receipt.model_id)  # the tokenizer alone: no weights
    # a turn the recording lacks is a harness that asked for more: none answers it
    policy = recorded_policy(trajectories, receipt, renderer, missing=SamplerUnavailable)
    cfg = RolloutConfig.model_validate(receipt.rollout)
    with Gateway(receipt.model_id) as gateway:
        backend = AgentBackend(agent["entry"], gateway, timeout_s=agent.get("timeout_s", 300.0))
        live = await backend.run_episode(
            HarnessEnv, receipt.task, policy, cfg, seed=receipt.seed, episode_id=receipt.episode_id
        )
    report = LiveReport(receipt.episode_id)
    # each conversation's requests by (session, step): the root's ("") and its children's
    recorded = {(t.agent, s["step"]): s for t in trajectories for s in t.steps}
    again = {(t.agent, s["step"]): s for t in live.trajectories for s in t.steps}
    for key in sorted(recorded):
        agent_name, k = key
        where: Any = k if not agent_name else f"{agent_name}:{k}"
        if "request" not in recorded[key]:
            continue
        if key not in again or "request" not in again[key]:
            error = (live.receipt.agent or {}).get("exception") or live.receipt.error
            report.steps.append(
                Drift(where, "failed", f"the agent made no request {where} ({error})")
            )
            continue
        want, got = as_sent(recorded[key]["request"]), as_sent(again[key]["request"])
        if want == got:
            report.steps.append(Drift(where, "same"))
        else:
            report.steps.append(Drift(where, "drifted", _request_difference(want, got)))
    if live.receipt.agent.get("returned") != agent.get("returned"):
        report.steps.append(
            Drift(
                "answer",
                "drifted",
                f"recorded {agent.get('returned')!r:.80}, "
                f"live {live.receipt.agent.get('returned')!r:.80}",
            )
        )
    return report


def as_sent(request: dict[str, Any]) -> dict[str, Any]:
    """A recorded request as the harness sent it: without what the gateway noted of the
    tree's budget (parallel conversations spend in another order when run again)."""
    return {k: v for k, v in request.items() if k != "tree_sampled_tokens"}


def _request_difference(want: dict[str, Any], got: dict[str, Any]) -> str:
    a = want.get("messages") or want.get("new_messages") or []
    b = got.get("messages") or got.get("new_messages") or []
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            was, now = str(x.get("content"))[:80], str(y.get("content"))[:80]
            return f"message {i} ({x.get('role')}): recorded {was!r}, live {now!r}"
    return f"recorded {len(a)} new messages, live {len(b)}"
