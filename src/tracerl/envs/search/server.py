"""A retrieval server speaking Search-R1's protocol, and the client the search env uses.

Protocol: ``POST /retrieve`` with ``{"queries": [...], "topk": k, "return_scores": bool}``
returns ``{"result": [[hit, ...], ...]}``, one list per query, where a hit is
``{"document": {"id", "contents"}, "score": s}`` with scores, or the document alone without.
``contents`` is ``"Title"\\ntext`` as in Search-R1 corpora.

The server is the standard library's threading HTTP server around a `BM25Index` (start it
with `tracerl serve-retriever`, or `RetrievalServer(...)` in a test). The client turns every
way the service can fail — timeout, refused or dropped connection, an HTTP error, a malformed
answer — into an `InfraError`, so a retriever outage is the environment's fault (retried,
then attributed to the environment), never the policy's.
"""

from __future__ import annotations

import http.client
import json
import threading
import urllib.error
import urllib.request
from typing import Any

from tracerl.envs.search.corpus import Corpus, Doc
from tracerl.envs.search.index import BM25Index, Hit
from tracerl.envs.tools import InfraError
from tracerl.jsonhttp import JSONHandler, Server
from tracerl.types import FaultKind

MAX_TOPK = 50


def _handler(index: BM25Index) -> type[JSONHandler]:
    class Handler(JSONHandler):
        def do_POST(self) -> None:
            if self.path != "/retrieve":
                return self._send(404, {"error": f"no route {self.path}; POST /retrieve"})
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                queries, topk = body["queries"], int(body.get("topk", 3))
                if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
                    raise ValueError("queries must be a list of strings")
                if not 1 <= topk <= MAX_TOPK:
                    raise ValueError(f"topk must be in 1..{MAX_TOPK}")
            except (ValueError, KeyError, TypeError) as e:
                return self._send(400, {"error": f"bad request: {e}"})
            try:
                hits = index.search_many(queries, topk)
            except Exception as e:  # answer 500 rather than drop the connection
                return self._send(500, {"error": f"retrieval failed: {type(e).__name__}: {e}"})
            with_scores = bool(body.get("return_scores", False))
            result = [
                [
                    {"document": _doc(h.doc), "score": h.score} if with_scores else _doc(h.doc)
                    for h in row
                ]
                for row in hits
            ]
            self._send(200, {"result": result})

    return Handler


def _doc(doc: Doc) -> dict[str, str]:
    return {"id": doc.id, "contents": doc.contents()}


class RetrievalServer:
    """The server in a background thread: ``with RetrievalServer(corpus) as s: s.url``."""

    def __init__(self, corpus: Corpus, host: str = "127.0.0.1", port: int = 0) -> None:
        self.httpd = Server((host, port), _handler(BM25Index(corpus)))
        self.httpd.daemon_threads = True
        self.url = f"http://{host}:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> RetrievalServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def serve_forever(self) -> None:
        self.httpd.serve_forever()


class RetrievalClient:
    """Calls a Search-R1 retrieval server; every failure is an `InfraError`."""

    def __init__(self, url: str, *, timeout_s: float = 5.0) -> None:
        self.url = url.rstrip("/") + "/retrieve"
        self.timeout_s = timeout_s

    def search(self, query: str, k: int = 3) -> list[Hit]:
        payload = json.dumps({"queries": [query], "topk": k, "return_scores": True}).encode()
        request = urllib.request.Request(
            self.url, data=payload, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as e:
            # 5xx: the service failed (retry); 4xx: it refused our request — a configuration
            # problem on the environment's side, not the policy's (no point retrying)
            raise InfraError(
                f"retriever answered {e.code}", FaultKind.SERVER_ERROR, retryable=e.code >= 500
            ) from None
        except TimeoutError:
            raise InfraError(
                f"retriever timed out after {self.timeout_s:g} s", FaultKind.TIMEOUT
            ) from None
        except urllib.error.URLError as e:
            if isinstance(e.reason, TimeoutError):
                raise InfraError("retriever timed out", FaultKind.TIMEOUT) from None
            raise InfraError(
                f"retriever unreachable: {e.reason}", FaultKind.CONNECTION_REFUSED
            ) from None
        except (http.client.HTTPException, ConnectionError, OSError) as e:
            # the connection dropped mid-answer (RemoteDisconnected, IncompleteRead, reset)
            raise InfraError(
                f"retriever connection failed: {type(e).__name__}", FaultKind.SERVER_ERROR
            ) from None
        except ValueError:  # JSONDecodeError included
            raise InfraError("retriever sent malformed JSON", FaultKind.SERVER_ERROR) from None
        try:
            return [Hit(_parse(h["document"]), float(h["score"])) for h in body["result"][0]]
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise InfraError(
                f"retriever answer is malformed: {type(e).__name__}", FaultKind.SERVER_ERROR
            ) from None


def _parse(d: dict[str, Any]) -> Doc:
    title, _, text = str(d["contents"]).partition("\n")
    return Doc(id=str(d["id"]), title=title.strip().strip('"'), text=text.strip())
