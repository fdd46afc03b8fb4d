"""One OpenEnv session, spoken over the server's websocket the way openenv-core's own
`EnvClient` speaks it (openenv-core 0.3.0, ``openenv/core/env_client.py``).

openenv-core cannot be installed beside tracerl without changing an installed package (its
``gradio`` pins ``pillow<13``), so its servers run in a virtual environment of their own and
this side speaks the protocol with ``websockets`` alone. The protocol: a websocket at
``/ws`` is one session, one environment instance on the server; the client sends
``{"type": "reset" | "step" | "state" | "close", "data": ...}`` and gets back
``{"type": "observation", "data": {"observation", "reward", "done"}}``, ``{"type":
"state", "data": ...}`` or ``{"type": "error", "data": {"message", "code"}}``. A test drives
the same server with openenv's own client and this one and compares what each sees.

What went wrong is a value the environment can attribute: `Down` (the server is
unreachable, closed the session, timed out or crashed handling the request: the
environment's), `Invalid` (the server answered a step with VALIDATION_ERROR: the policy's
when the action does not fit the environment's action schema, else the environment's, which
the caller tells apart), `Busy` (the server has no free session: wait and try again).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any
from urllib.parse import urlsplit

PROTOCOL = "openenv-ws"
"""The protocol's name in receipts (openenv-core's websocket session protocol)."""
LOOPBACK = ("127.0.0.1", "localhost", "::1")


class SessionError(Exception):
    """An OpenEnv session failed; `code` is the server's error code if it sent one, else
    ``CONNECT`` (it could not be reached) or ``TIMEOUT`` (it did not answer in time)."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class Down(SessionError):
    """The server cannot serve the session: unreachable, closed, timed out, or it raised."""


class Invalid(SessionError):
    """The server answered a step with VALIDATION_ERROR. openenv-core's websocket handler
    (0.3.0) sends it for an action its action class refuses, and alike for an observation the
    environment's step failed to build (one handler wraps reading the action, the step and
    the observation's serialization), so it names no owner by itself."""


class Busy(SessionError):
    """The server is at its limit of concurrent sessions (`max_sessions`, if it said)."""

    def __init__(self, message: str, code: str | None = None, max_sessions: Any = None) -> None:
        super().__init__(message, code)
        self.max_sessions = max_sessions if isinstance(max_sessions, int) else None


def ws_url(base_url: str) -> str:
    """The session endpoint of a server at `base_url` (``http(s)://`` or ``ws(s)://``)."""
    url = base_url.rstrip("/")
    for plain, secure in (("http://", "ws://"), ("https://", "wss://")):
        if url.startswith(plain):
            url = secure + url[len(plain) :]
    return url + "/ws"


def is_loopback(url: str) -> bool:
    return (urlsplit(url).hostname or "") in LOOPBACK


class Session:
    """One session on an OpenEnv server (one environment instance there), opened by the
    first request and ended by `close`."""

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout_s: float = 10.0,
        message_timeout_s: float = 60.0,
        max_message_mb: float = 100.0,
    ) -> None:
        self.url = ws_url(base_url)
        self.connect_timeout_s = connect_timeout_s
        self.message_timeout_s = message_timeout_s
        self.max_size = int(max_message_mb * 1024 * 1024)
        self._ws: Any = None

    async def open(self) -> None:
        if self._ws is not None:
            return
        from websockets.asyncio.client import connect

        # loopback servers are reached directly, whatever proxy the environment names
        proxy: Any = None if is_loopback(self.url) else True
        try:
            self._ws = await connect(
                self.url,
                open_timeout=self.connect_timeout_s,
                max_size=self.max_size,
                proxy=proxy,
            )
        except Exception as e:  # refused, no route, handshake failed, timed out
            raise Down(f"cannot connect to {self.url}: {type(e).__name__}: {e}", "CONNECT") from e

    async def request(self, kind: str, data: Any = None) -> dict[str, Any]:
        """Send one request, return the ``data`` of the server's answer."""
        await self.open()
        message: dict[str, Any] = {"type": kind}
        if data is not None:
            message["data"] = data
        # closed: the server may have said why first (no free session), read below
        with contextlib.suppress(Exception):
            await self._ws.send(json.dumps(message))
        try:
            raw = await asyncio.wait_for(self._ws.recv(), timeout=self.message_timeout_s)
        except TimeoutError as e:
            raise Down(f"{kind}: no answer within {self.message_timeout_s:g} s", "TIMEOUT") from e
        except Exception as e:  # the connection closed or broke: the server is gone
            raise Down(f"{kind}: the session ended: {type(e).__name__}: {e}") from e
        try:
            answer = json.loads(raw)
        except (TypeError, ValueError) as e:
            raise Down(f"{kind}: the server answered with something not JSON: {raw!r:.200}") from e
        body = answer.get("data") if isinstance(answer, dict) else None
        if isinstance(answer, dict) and answer.get("type") == "error":
            raise _error(kind, body if isinstance(body, dict) else {})
        if not isinstance(body, dict):
            raise Down(f"{kind}: the server answered without data: {raw!r:.200}")
        return body

    async def reset(self, **kwargs: Any) -> dict[str, Any]:
        """``{"observation", "reward", "done"}`` of a fresh episode."""
        return _result(await self.request("reset", kwargs), "reset")

    async def step(self, action: dict[str, Any]) -> dict[str, Any]:
        """``{"observation", "reward", "done"}`` after `action`."""
        return _result(await self.request("step", action), "step")

    async def state(self) -> dict[str, Any]:
        return await self.request("state")

    async def close(self) -> None:
        """End the session (the server drops its environment instance). Never raises."""
        ws, self._ws = self._ws, None
        if ws is None:
            return
        with contextlib.suppress(Exception):  # already gone
            await ws.send(json.dumps({"type": "close"}))
        with contextlib.suppress(Exception):
            await asyncio.wait_for(ws.close(), timeout=5)


def _result(data: dict[str, Any], kind: str) -> dict[str, Any]:
    observation = data.get("observation")
    if not isinstance(observation, dict):
        raise Down(f"{kind}: the answer has no observation: {json.dumps(data)[:200]}")
    reward = data.get("reward")
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, int | float)):
        raise Down(f"{kind}: the reward is not a number: {reward!r:.80}")
    return {"observation": observation, "reward": reward, "done": bool(data.get("done"))}


def _error(kind: str, body: dict[str, Any]) -> SessionError:
    """The server's error answer as the exception that says whose it is."""
    code = str(body.get("code") or "UNKNOWN")
    message = f"{kind}: the server answered {code}: {body.get('message') or 'no message'}"
    problems = body.get("errors")
    if isinstance(problems, list) and problems:
        message += "; " + "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ())) or 'action'}: {e.get('msg')}"
            for e in problems[:5]
            if isinstance(e, dict)
        )
    if code == "CAPACITY_REACHED":
        return Busy(message, code, body.get("max_sessions"))
    if code == "VALIDATION_ERROR" and kind == "step":
        return Invalid(message, code)
    return Down(message, code)  # EXECUTION_ERROR: the environment raised on it
