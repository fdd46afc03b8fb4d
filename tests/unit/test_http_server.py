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
