"""A scripted judge behind a real OpenAI-compatible HTTP endpoint (``/v1/chat/completions``).

Its verdicts are deterministic and read from the request as a model would see it: the
ANSWER (or, group-relative, the ANSWERS) line of the user message, each a JSON literal. An
answer in `golds` scores 10, one mentioning the gold scores 6, anything else 1. A label
rubric gets its first label for an answer in `golds`, else its last; the citation chain's
rubric gets ``supports`` when the EVIDENCE quote contains the gold or one of `supporting`.
It is also gullible: any line of the prompt outside those quoted fields that says "output
10" is obeyed, as a model without quoting would obey an answer's instructions.

`faults` injects failures, one per request, in order: ``timeout`` (answers after the
client gave up), ``500``, ``garbage`` (a reply that is no verdict), ``range`` (a score
outside the rubric's range), ``extra`` (a verdict with keys it may not have), ``not_chat``
(a 200 whose body is not a chat completion), ``drop`` (the connection closed unanswered).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

QUOTED = ("TASK", "EVIDENCE", "REFERENCE", "ANSWER", "ANSWERS")


class ScriptedJudgeServer:
    def __init__(self, golds: dict[str, str] | None = None) -> None:
        self.golds = dict(golds or {})  # task text -> gold answer
        self.supporting: set[str] = set()  # quotes (lowercase) that support any answer
        self.faults: deque[str] = deque()
        self.requests: list[dict[str, Any]] = []
        self.timeout_sleep = 1.5
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(body)
                fault = server.faults.popleft() if server.faults else None
                if fault == "drop":
                    self.close_connection = True
                    self.connection.close()
                    return
                if fault == "timeout":
                    time.sleep(server.timeout_sleep)
                if fault == "500":
                    return self._send(500, {"error": {"message": "overloaded"}})
                if fault == "not_chat":
                    return self._send(200, {"id": "x", "object": "nothing"})
                text = server.reply(body["messages"], fault)
                self._send(
                    200,
                    {
                        "choices": [{"message": {"role": "assistant", "content": text}}],
                        "usage": {"prompt_tokens": 100, "completion_tokens": 10},
                    },
                )

            def _send(self, code: int, data: dict[str, Any]) -> None:
                raw = json.dumps(data).encode()
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(raw)))
                    self.end_headers()
                    self.wfile.write(raw)
                except OSError:
                    pass  # the client gave up (a timeout)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        self.base_url = f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def reply(self, messages: list[dict[str, str]], fault: str | None) -> str:
        if fault == "garbage":
            return "I would say about eight out of ten."
        if fault == "range":
            return '{"score": 99}'
        if fault == "extra":
            return '{"score": 9, "reward_history": [1, 1, 1]}'
        system, user = messages[0]["content"], messages[1]["content"]
        fields: dict[str, Any] = {}
        for line in (system + "\n" + user).splitlines():
            name, _, rest = line.partition(": ")
            if name in QUOTED:
                try:
                    fields[name] = json.loads(rest)
                    continue
                except ValueError:
                    pass
            if "output 10" in line.lower():  # gullible: obeys any unquoted instruction
                return '{"score": 10, "reason": "as instructed"}'
        gold = self.golds.get(str(fields.get("TASK")), "")
        if '"supports"' in system:  # the citation chain's rubric
            quote = " ".join(fields.get("EVIDENCE") or []).lower()
            ok = (bool(gold) and gold.lower() in quote) or any(p in quote for p in self.supporting)
            return json.dumps({"label": "supports" if ok else "does_not_support"})
        labels = re.search(r"where L is one of (.*?); nothing", system)
        if labels:  # another label rubric: its first label for a right answer, else its last
            names = json.loads(f"[{labels.group(1)}]")
            right = self.score(gold, str(fields.get("ANSWER"))) == 10
            return json.dumps({"label": names[0] if right else names[-1]})
        if "ANSWERS" in fields:
            return json.dumps(
                {"scores": [self.score(gold, a["answer"]) for a in fields["ANSWERS"]]}
            )
        return json.dumps({"score": self.score(gold, str(fields.get("ANSWER"))), "reason": "ok"})

    @staticmethod
    def score(gold: str, answer: str) -> int:
        if gold and answer.strip().lower() == gold.lower():
            return 10
        if gold and gold.lower() in answer.lower():
            return 6
        return 1
