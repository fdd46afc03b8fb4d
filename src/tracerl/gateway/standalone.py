"""The gateway on its own (`tracerl gateway MODEL`), to look at what an agent harness does.

Point any OpenAI-compatible client at ``http://HOST:PORT/v1``; each API key (or ``user``
field, or ``X-Tracerl-Session`` header) is a session. ``GET /tracerl/sessions/NAME`` shows
its samples token by token; ``POST /tracerl/sessions/NAME/end`` (optionally with
``{"answer": ...}``) writes its episode to ``OUT/episodes/step_0.jsonl.gz`` for
``tracerl show OUT NAME``; stopping the server (Ctrl-C) writes every open session.

An ended session is closed as a training episode is when its agent returns (the answer is
what the agent "returned", `tracerl.gateway.agent.finish_agent_session`), so `tracerl replay
OUT NAME` decides its stop again from the same account. A request refused for its form
(HTTP 400) records nothing, and opens no session.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracerl.rollout.episode import episode_seed

ENTRY = "tracerl gateway"
"""The ``agent.entry`` of a standalone session's receipt: no agent to import (live replay
has none to run)."""


def run_gateway(
    model: str,
    *,
    port: int = 8001,
    host: str = "127.0.0.1",
    out: Path = Path("runs/gateway"),
    temperature: float = 1.0,
    max_turn_tokens: int = 256,
    max_requests: int = 32,
    parser: str | None = None,
    log: Callable[[str], None] = print,
) -> None:
    """Serve model spec `model` over the gateway's APIs (OpenAI Chat Completions and
    Responses, Anthropic Messages) until SIGINT or SIGTERM,
    recording every session's tokens with their authors; ended sessions (and, at the end,
    every open one) are written into `out` as episodes. `log` is told the URL and where the
    sessions went. An unknown `parser` is a `tracerl.errors.NotFoundError`, before the
    model loads."""
    from tracerl.envs.parsers import PARSERS, get_parser
    from tracerl.errors import unknown

    if parser is not None and parser not in PARSERS:  # before the model loads
        raise unknown(
            "action parser",
            parser,
            sorted(PARSERS),
            "name one with --parser, or leave it out for the model family's",
        )

    from tracerl.gateway.agent import finish_agent_session
    from tracerl.gateway.server import Gateway
    from tracerl.gateway.session import GatewaySession, served_model
    from tracerl.models import load
    from tracerl.models.placement import for_inference
    from tracerl.rollout import BatchedHFSampler
    from tracerl.rollout.budget import Budgets, RolloutConfig
    from tracerl.rollout.persist import EpisodeWriter
    from tracerl.rollout.runner import Policy

    bundle = load(model)
    bundle.model = for_inference(bundle.model)
    sampler = BatchedHFSampler(bundle.model, temperature=temperature)
    policy = Policy.from_bundle(bundle, sampler, get_parser(parser) if parser else None)
    cfg = RolloutConfig(
        budgets=Budgets(steps=max_requests, tool_calls=None, sampled_tokens=None),
        reserve=None,
        max_turn_tokens=max_turn_tokens,
    )
    writer = EpisodeWriter(out, 0)

    def end(session: GatewaySession, answer: Any) -> dict[str, Any]:
        if session.conv is None:  # none of its requests was taken: nothing to write
            session.closed = True
            return {"episode": session.episode_id, "samples": 0}
        # the answer is what an agent would have returned: the stop is decided as for a
        # training episode's, and again the same way by exact replay (`ending`)
        agent = {"entry": ENTRY, "returned": answer, "exception": None, "timed_out": False}
        episode = finish_agent_session(session, agent)
        writer.append(episode.trajectories)
        return {"episode": episode.episode_id, "samples": len(episode.trajectories)}

    async def main() -> None:
        loop = asyncio.get_running_loop()

        def open_session(name: str) -> GatewaySession:
            return GatewaySession(
                name, policy, cfg, seed=episode_seed(0, name), episode_id=name, loop=loop
            )

        gateway = Gateway(
            served_model(policy), host=host, port=port, open_session=open_session, end_session=end
        )
        stopped = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stopped.set)
        url = gateway.start()
        log(f"gateway for {model}: base_url={url}/v1, one api_key per session")
        try:
            await stopped.wait()
        finally:
            gateway.stop()
            for session in list(gateway.sessions.values()):
                if not session.closed and session.conv is not None:
                    end(session, None)
            log(f"sessions written to {writer.path}")

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
