"""Our HTTP servers (`tracerl.jsonhttp.Server`: serve, the gateway, the retriever) say
nothing when a client hangs up before its answer is written, and still print a handler's
real errors."""

from __future__ import annotations

import http.client
import threading

import pytest

from tracerl.jsonhttp import JSONHandler, Server


class Handler(JSONHandler):
    def do_GET(self) -> None:
        if self.path == "/gone":  # the client hung up while the answer was written
            raise BrokenPipeError(32, "Broken pipe")
        if self.path == "/reset":
            raise ConnectionResetError(104, "Connection reset by peer")
        if self.path == "/bug":
            raise ValueError("a real bug in a handler")
        self._send(200, {"ok": True})


@pytest.fixture
def server():
    httpd = Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


def _get(port: int, path: str) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        conn.getresponse().read()
    except (http.client.HTTPException, ConnectionError):
        pass  # the handler raised: no answer
    finally:
        conn.close()


def test_a_client_that_went_away_is_no_traceback(server, capfd):
    for path in ("/gone", "/reset", "/ok"):
        _get(server, path)
    err = capfd.readouterr().err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_a_handlers_own_error_is_still_printed(server, capfd):
    _get(server, "/bug")
    _get(server, "/ok")  # the bug's request thread has ended by the time this is answered
    err = capfd.readouterr().err
    assert "ValueError: a real bug in a handler" in err, err


def test_a_request_in_flight_when_serve_stops_is_answered_not_a_traceback(capfd):
    """`tracerl serve` (or the learner's server for remote workers) stopping while a request
    waits on the sampler: that client gets a 503 saying so, and stderr gets no traceback."""
    import asyncio
    import json

    from tracerl.rollout.serve import ServerThread

    asked = threading.Event()

    class NeverAnswers:
        temperature = 1.0

        async def sample(self, request):
            asked.set()
            await asyncio.Event().wait()

    server = ServerThread(NeverAnswers(), "m")
    port = int(server.start().rsplit(":", 1)[1])
    got = {}

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        body = json.dumps({"prompt": [1, 2, 3], "max_tokens": 2})
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        answer = conn.getresponse()
        got["status"], got["body"] = answer.status, json.loads(answer.read())

    waiting = threading.Thread(target=client)
    waiting.start()
    assert asked.wait(60)
    server.stop()
    waiting.join(60)
    assert got["status"] == 503 and got["body"]["error"]["message"] == "the server stopped"
    assert "Traceback" not in capfd.readouterr().err
