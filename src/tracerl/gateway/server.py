"""The gateway's HTTP endpoint: OpenAI's and Anthropic's model routes over gateway sessions.

    POST /v1/chat/completions    messages, tools, tool_choice, max_tokens, n=1, stream
    POST /v1/responses           OpenAI Responses: input items, instructions, function tools,
                                 previous_response_id, stream (`tracerl.gateway.responses`)
    POST /v1/messages            Anthropic Messages: system, text / tool_use / tool_result
                                 blocks, tools, tool_choice, stream (`tracerl.gateway.messages`)
    GET  /v1/models              the served model
    GET  /health                 200
    GET  /tracerl/sessions       every open session: requests, samples, history breaks
                                 (`tracerl gateway` only: no episode may list the others)
    GET  /tracerl/sessions/KEY   one session's samples: token ids, sources, loss mask, text
                                 (by the session's own key)
    POST /tracerl/sessions/ID/end    {"answer": ...}: close a session; its episode is written
                                 (`tracerl gateway --out DIR`; training ends its own)

A request belongs to the session its client names, in this order: its URL
(``/s/KEY/v1/...``: each episode's harness gets such a base URL), an ``X-Tracerl-Session``
header, the request's ``user`` field, or the API key (``Authorization: Bearer KEY``, or
Anthropic's ``x-api-key: KEY``) — so an unmodified OpenAI or Anthropic SDK client given
only ``base_url`` and ``api_key`` is one session. A name ``KEY/NAME`` (wherever given; it
wins over the episode's own) opens a child session of KEY's episode
(`tracerl.gateway.tree`).
Unknown names are refused (401) during training, where tracerl hands every episode's
harness its own key; `tracerl gateway` opens a session for each new name instead.

HTTP is the standard library's threaded server (as `tracerl serve`'s); each request is
answered on its session's event loop, where the run's sampler batches the turns of every
session that waits at once. ``stream: true`` gets the same answer as server-sent events
(the turn is sampled whole, then sent as chunks), in the protocol's own events. All three
protocols share one session core (`tracerl.gateway.protocols`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import threading
from collections.abc import Callable
from typing import Any

from tracerl.gateway.chat import GatewayError
from tracerl.gateway.ports import port_error
from tracerl.gateway.protocols import BY_ROUTE, Protocol
from tracerl.gateway.session import GatewaySession
from tracerl.jsonhttp import JSONHandler, Server

MAX_BODY = 32 << 20


class Gateway:
    """Sessions by key, and the HTTP server that answers them.

    `open_session(name)` makes a session for a name nobody registered (`tracerl gateway`);
    without it such requests are refused. `request_timeout_s` bounds how long an HTTP
    request may wait for its answer (queueing for the sampler included). `option` names
    where `port` was given (``--port``, ``agent.port``): a port that cannot be listened on
    is a `tracerl.errors.UserError` saying so."""

    def __init__(
        self,
        model: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        open_session: Callable[[str], GatewaySession] | None = None,
        end_session: Callable[[GatewaySession, Any], dict[str, Any]] | None = None,
        request_timeout_s: float = 600.0,
        option: str = "--port",
    ) -> None:
        self.model, self.host, self.port, self.option = model, host, port, option
        self.open_session = open_session
        self.end_session = end_session
        self.request_timeout_s = request_timeout_s
        self.sessions: dict[str, GatewaySession] = {}
        self._lock = threading.Lock()
        self._httpd: Server | None = None
        self.url: str | None = None

    # ---- sessions --------------------------------------------------------------------------
    def add(self, session: GatewaySession) -> None:
        with self._lock:
            self.sessions[session.token] = session

    def remove(self, token: str) -> GatewaySession | None:
        """Forget the session `token` and its child sessions (``token/NAME``)."""
        with self._lock:
            for name in [n for n in self.sessions if n.startswith(token + "/")]:
                del self.sessions[name]
            return self.sessions.pop(token, None)

    def find(self, headers: Any, body: dict[str, Any], named: str | None = None) -> GatewaySession:
        """The session a request names: in its URL (``/s/NAME/v1/...``, `named`), an
        ``X-Tracerl-Session`` header, its ``user`` field, or its API key."""
        return self._find(headers, body, named)[0]

    def _find(
        self, headers: Any, body: dict[str, Any], named: str | None
    ) -> tuple[GatewaySession, str | None]:
        """`find`'s session, and the name it was opened under if this request opened it
        (`open_session`)."""
        names = [named, headers.get("X-Tracerl-Session"), body.get("user")]
        auth = headers.get("Authorization") or ""
        if auth.lower().startswith("bearer "):
            names.append(auth[7:].strip())
        names.append(headers.get("x-api-key"))  # Anthropic's SDK
        names = [n for n in names if isinstance(n, str) and n]
        # a child's name (KEY/NAME) first: a harness gives it where it can (an API key, a
        # header) while its URL still names the episode
        names.sort(key=lambda n: "/" not in n)
        with self._lock:
            for name in names:
                if name in self.sessions:
                    return self.sessions[name], None
                root, _, child = name.partition("/")
                if child and root in self.sessions:  # KEY/NAME: a child session of KEY's
                    session = self.sessions[root].delegation.open(child)
                    self.sessions[name] = session
                    return session, None
            if self.open_session is not None and names:
                session = self.open_session(names[0])
                self.sessions[names[0]] = session
                return session, names[0]
        raise GatewayError(
            401,
            "no gateway session has this name; use the API key (or X-Tracerl-Session "
            "header) tracerl gave this episode",
            "unknown_session",
        )

    # ---- HTTP ------------------------------------------------------------------------------
    def start(self) -> str:
        """Listen; returns the base URL (``http://host:port``; clients add ``/v1``). A port
        in use (taken since it was checked), or past 65535, is a `UserError`."""
        try:
            self._httpd = Server((self.host, self.port), _handler(self))
        except (OSError, OverflowError) as e:
            raise port_error(self.host, self.port, e, self.option) from e
        self._httpd.daemon_threads = True
        threading.Thread(
            target=self._httpd.serve_forever, name="tracerl-gateway", daemon=True
        ).start()
        self.url = f"http://{self.host}:{self._httpd.server_address[1]}"
        return self.url

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> Gateway:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def chat(self, headers: Any, raw: bytes) -> tuple[dict[str, Any], bool]:
        """One chat-completions request, answered (or a `GatewayError`), and whether it
        asked for a stream."""
        return self.answer(BY_ROUTE["/v1/chat/completions"], headers, raw)

    def answer(
        self, protocol: Protocol, headers: Any, raw: bytes, named: str | None = None
    ) -> tuple[dict[str, Any], bool]:
        """One request of `protocol`, answered in its form (or a `GatewayError`), and
        whether it asked for a stream."""
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError as e:
            raise GatewayError(400, f"the request body is not JSON: {e.msg}") from None
        if not isinstance(body, dict):
            raise GatewayError(400, "the request body must be a JSON object")
        session, opened = self._find(headers, body, named)
        try:
            return self._answer(protocol, session, body)
        except GatewayError:
            if opened is not None:
                self._forget_unused(opened, session)
            raise

    def _forget_unused(self, name: str, session: GatewaySession) -> None:
        """A session opened for a request that was refused (its form, its messages) took
        nothing: it is not kept, listed or written (`tracerl gateway`)."""
        with self._lock:
            unused = session.requests == 0 and session.conv is None
            if unused and not session.answering and self.sessions.get(name) is session:
                del self.sessions[name]

    def _answer(
        self, protocol: Protocol, session: GatewaySession, body: dict[str, Any]
    ) -> tuple[dict[str, Any], bool]:
        if session.loop is None or session.loop.is_closed():
            raise GatewayError(409, f"session {session.episode_id} is not running", "closed")
        future = asyncio.run_coroutine_threadsafe(protocol.answer(session, body), session.loop)
        try:
            answer = future.result(timeout=self.request_timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            error = f"no answer within {self.request_timeout_s:g} s (the sampler is overloaded?)"
            with contextlib.suppress(RuntimeError):  # its loop ended: the episode is over
                session.loop.call_soon_threadsafe(session.note_failure, error)
            raise GatewayError(504, error, "timeout") from None
        except concurrent.futures.CancelledError:
            raise GatewayError(409, f"session {session.episode_id} ended", "closed") from None
        return answer, bool(body.get("stream"))

    def end(self, name: str, raw: bytes) -> tuple[int, dict[str, Any]]:
        """``POST /tracerl/sessions/NAME/end``: the session's episode, closed by the
        `end_session` hook (on its own event loop)."""
        if self.end_session is None:
            return 404, {"error": {"message": "sessions end with their episodes here"}}
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError as e:
            return 400, {"error": {"message": f"the request body is not JSON: {e.msg}"}}
        session = self.remove(name)
        if session is None:
            return 404, {"error": {"message": f"no open session {name!r}"}}
        end = self.end_session
        return 200, self._on_loop(session, lambda: end(session, body.get("answer")))

    def get(self, path: str) -> tuple[int, dict[str, Any]]:
        if path == "/health":
            return 200, {"status": "ok"}
        if path in ("/v1/models", "/models"):
            return 200, {"object": "list", "data": [{"id": self.model, "object": "model"}]}
        if path == "/tracerl/sessions" and self.open_session is not None:
            # `tracerl gateway` only: during training no episode may list the others
            with self._lock:
                sessions = list(self.sessions.values())
            return 200, {"sessions": [self._on_loop(s, s.summary) for s in sessions]}
        if path.startswith("/tracerl/sessions/"):
            name = path.rsplit("/", 1)[1]
            with self._lock:  # by its key only: another episode cannot read it
                session = self.sessions.get(name)
            if session is not None:
                return 200, self._on_loop(session, lambda: session.summary(tokens=True))
            return 404, {"error": {"message": f"no session with the key {name!r}"}}
        return 404, {"error": {"message": f"no route GET {path}"}}

    def _on_loop(self, session: GatewaySession, fn: Callable[[], Any]) -> Any:
        """`fn()` run on the session's own event loop (where it changes), never mid-change."""

        async def call() -> Any:
            return fn()

        if session.loop is None or session.loop.is_closed():
            return fn()
        future = asyncio.run_coroutine_threadsafe(call(), session.loop)
        return future.result(timeout=self.request_timeout_s)


def session_path(path: str) -> tuple[str | None, str]:
    """``/s/NAME/rest`` -> (NAME, ``/rest``): a session named in the URL. Each episode's
    harness gets its own base URL this way, so a framework that caches one HTTP client per
    base URL (LangChain's ``ChatOpenAI``) never reuses another episode's, bound to another
    event loop."""
    if path.startswith("/s/"):
        name, _, rest = path[3:].partition("/")
        child, _, after = rest.partition("/")
        if child != "v1" and after.startswith("v1/"):  # /s/KEY/NAME/v1/...: a child
            name, rest = f"{name}/{child}", after
        if name:
            return name, "/" + rest
    return None, path


def _handler(gateway: Gateway) -> type:
    class Handler(JSONHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def do_GET(self) -> None:
            self._send(*gateway.get(session_path(self.path.split("?")[0])[1]))

        def do_POST(self) -> None:
            named, path = session_path(self.path.split("?")[0])
            try:
                n = int(self.headers.get("Content-Length", 0))
            except ValueError:
                n = -1
            if n < 0:
                self.close_connection = True
                return self._send(400, {"error": {"message": "bad Content-Length"}})
            if n > MAX_BODY:
                self.close_connection = True
                return self._send(413, {"error": {"message": "request body too large"}})
            raw = self.rfile.read(n) if n else b""
            if path.startswith("/tracerl/sessions/") and path.endswith("/end"):
                try:
                    return self._send(*gateway.end(path.split("/")[-2], raw))
                except Exception as e:
                    return self._send(500, {"error": {"message": f"{type(e).__name__}: {e}"}})
            protocol = BY_ROUTE.get(path)
            if protocol is None:
                return self._send(404, {"error": {"message": f"no route POST {path}"}})
            try:
                answer, stream = gateway.answer(protocol, self.headers, raw, named)
            except GatewayError as e:
                return self._send(e.status, protocol.error_body(e))
            except Exception as e:  # answered, never a dropped connection
                err = GatewayError(500, f"{type(e).__name__}: {e}", "internal")
                return self._send(500, protocol.error_body(err))
            if not stream:
                return self._send(200, answer, ascii_only=True)
            data = protocol.stream(answer)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler
