"""The gateway on its own (`tracerl gateway MODEL`), to look at what an agent harness does.

Point any OpenAI-compatible client at ``http://HOST:PORT/v1``; each API key (or ``user``
field, or ``X-Tracerl-Session`` header) is a session. ``GET /tracerl/sessions/NAME`` shows
its samples token by token; ``POST /tracerl/sessions/NAME/end`` (optionally with
``{"answer": ...}``) writes its episode to ``OUT/episodes/step_0.jsonl.gz`` for
``tracerl show OUT NAME``; stopping the server (Ctrl-C) writes every open session.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracerl.rollout.episode import episode_seed


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
    """Serve the OpenAI chat-completions API over model spec `model` until SIGINT or SIGTERM,
    recording every session's tokens with their authors; ended sessions (and, at the end,
    every open one) are written into `out` as episodes. `log` is told the URL and where the
    sessions went."""
    from tracerl.envs.parsers import get_parser
    from tracerl.gateway.server import Gateway
    from tracerl.gateway.session import GatewaySession
    from tracerl.models import load
    from tracerl.models.placement import for_inference
    from tracerl.rollout import BatchedHFSampler
    from tracerl.rollout.budget import Budgets, RolloutConfig
    from tracerl.rollout.persist import EpisodeWriter
    from tracerl.rollout.runner import Policy
    from tracerl.types import StopReason

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
        stop = session.stop or (
            StopReason.ANSWERED if answer is not None else StopReason.ENV_TERMINATED
        )
        episode = session.finish(stop, answer=answer, agent={"entry": "tracerl gateway"})
        writer.append(episode.trajectories)
        return {"episode": episode.episode_id, "samples": len(episode.trajectories)}

    async def main() -> None:
        loop = asyncio.get_running_loop()

        def open_session(name: str) -> GatewaySession:
            return GatewaySession(
                name, policy, cfg, seed=episode_seed(0, name), episode_id=name, loop=loop
            )

        gateway = Gateway(
            bundle.spec, host=host, port=port, open_session=open_session, end_session=end
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
