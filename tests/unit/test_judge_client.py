"""The judge's HTTP client against a scripted OpenAI-compatible server: verdicts and their
token counts come through; a timeout, a 5xx, a refused connection and a body that is not a
chat completion are the endpoint's failures (retried by the judge, then the evaluator's);
the API key comes from the environment only."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tracerl.engines.judge_client import OpenAIJudgeClient
from tracerl.errors import UserError
from tracerl.rewards.judge import Judge, JudgeFailed, JudgeUnavailable, Rubric, VerdictCache

RUBRIC = Rubric("correct", "Score how well the answer answers the task.")


class Script:
    def __init__(self):
        self.replies = []  # ("ok", text) | ("sleep", s) | ("status", code) | ("raw", body)
        self.requests = []


@pytest.fixture
def server():
    script = Script()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            script.requests.append((self.path, dict(self.headers), body))
            kind, arg = script.replies.pop(0) if script.replies else ("ok", '{"score": 10}')
            if kind == "sleep":
                time.sleep(arg)
                kind, arg = "ok", '{"score": 10}'
            if kind == "status":
                self._send(arg, b'{"error": "overloaded"}')
            elif kind == "raw":
                self._send(200, arg.encode())
            else:
                out = {
                    "choices": [{"message": {"role": "assistant", "content": arg}}],
                    "usage": {"prompt_tokens": 321, "completion_tokens": 9},
                }
                self._send(200, json.dumps(out).encode())

        def _send(self, code, data):
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", script
    httpd.shutdown()


def test_a_verdict_comes_through_with_its_cost(server, monkeypatch):
    url, script = server
    monkeypatch.setenv("JUDGE_KEY", "sk-test")
    script.replies = [("ok", '{"score": 6, "reason": "partly"}')]
    client = OpenAIJudgeClient(url, "judge-model", api_key_env="JUDGE_KEY")
    judged = Judge(RUBRIC, client).verdict("What is 2 + 2?", "4")
    assert judged.verdict.raw == 6 and (judged.prompt_tokens, judged.completion_tokens) == (321, 9)
    path, headers, body = script.requests[0]
    assert path == "/v1/chat/completions" and body["model"] == "judge-model"
    assert body["temperature"] == 0.0 and body["messages"][0]["role"] == "system"
    assert headers["Authorization"] == "Bearer sk-test"


@pytest.mark.parametrize(
    ("reply", "says"),
    [
        (("sleep", 1.5), "no answer in 0.5 s"),
        (("status", 503), "HTTP 503"),
        (("raw", "<html>bad gateway</html>"), "not a chat completion"),
        (("raw", '{"choices": []}'), "not a chat completion"),
    ],
)
def test_endpoint_failures_are_unavailable_and_retried(server, tmp_path, reply, says):
    url, script = server
    script.replies = [reply, ("ok", '{"score": 3}')]
    client = OpenAIJudgeClient(url, "judge-model", timeout_s=0.5)
    with pytest.raises(JudgeUnavailable, match=says):
        client.complete(RUBRIC.messages("t", "a"))
    judged = Judge(RUBRIC, client, VerdictCache(tmp_path), retries=1).verdict("t", "a")
    assert judged.verdict.raw == 3


def test_a_judge_that_never_answers_fails_and_nothing_is_cached(tmp_path):
    client = OpenAIJudgeClient("http://127.0.0.1:9/v1", "judge-model", timeout_s=2)
    with pytest.raises(JudgeFailed, match="2 attempts"):
        Judge(RUBRIC, client, VerdictCache(tmp_path), retries=1).verdict("t", "a")
    assert not list(tmp_path.rglob("*.json"))


def test_a_named_key_that_is_not_set_is_a_user_error(monkeypatch):
    monkeypatch.delenv("NO_SUCH_JUDGE_KEY", raising=False)
    with pytest.raises(UserError, match="NO_SUCH_JUDGE_KEY"):
        OpenAIJudgeClient("http://127.0.0.1:9/v1", "m", api_key_env="NO_SUCH_JUDGE_KEY")


def test_tracerl_serves_chat_completions_a_judge_can_ask(tiny, tmp_path):
    """`tracerl serve`'s chat endpoint: the messages through the model's chat template, a
    reply as text with its token counts (the tiny random model's reply is no verdict: the
    judge then fails as the evaluator's, having been answered)."""
    import copy

    from tracerl.rollout import BatchedHFSampler
    from tracerl.rollout.serve import ServerThread

    sampler = BatchedHFSampler(copy.deepcopy(tiny.model), temperature=0.5, seed=0)
    server = ServerThread(sampler, "tiny-random", tiny.tokenizer)
    url = server.start()
    try:
        client = OpenAIJudgeClient(f"{url}/v1", "tiny-random", temperature=0.5, max_tokens=12)
        messages = RUBRIC.messages("What is 2 + 2?", "4")
        reply = client.complete(messages)
        expected = tiny.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        expected = expected if isinstance(expected, list) else expected["input_ids"]
        assert reply.prompt_tokens == len(expected) and 1 <= reply.completion_tokens <= 12
        assert isinstance(reply.text, str)
        # another temperature is refused, as for completions: the endpoint's error
        with pytest.raises(JudgeUnavailable, match="temperature"):
            OpenAIJudgeClient(f"{url}/v1", "tiny-random", temperature=0.0).complete(messages)
        judge = Judge(RUBRIC, client, VerdictCache(tmp_path), retries=0)
        try:
            judged = judge.verdict("What is 2 + 2?", "4")
        except JudgeFailed as e:
            assert "VerdictError" in str(e) and e.evidence["tokens"] > 0
        else:
            assert 0.0 <= judged.verdict.value <= 1.0
    finally:
        server.stop()


def test_tracerl_serve_at_temperature_0_answers_a_judge_greedily(tiny):
    """`tracerl serve --temperature 0`: greedy chat replies, the judge's default
    temperature accepted; the same question twice gets the same reply."""
    import copy

    from tracerl.rollout import BatchedHFSampler
    from tracerl.rollout.serve import ServerThread

    sampler = BatchedHFSampler(copy.deepcopy(tiny.model), temperature=0.0, seed=0)
    server = ServerThread(sampler, "tiny-random", tiny.tokenizer)
    url = server.start()
    try:
        client = OpenAIJudgeClient(f"{url}/v1", "tiny-random", max_tokens=8)  # temperature 0
        messages = RUBRIC.messages("What is 2 + 2?", "4")
        first, second = client.complete(messages), client.complete(messages)
        assert first.text == second.text and first.completion_tokens >= 1
    finally:
        server.stop()


@pytest.mark.parametrize("given", ["{root}", "{root}/", "{root}/v1", "{root}/v1/"])
def test_the_server_root_and_the_sdks_base_url_reach_the_same_route(server, given):
    url, script = server
    root = url.removesuffix("/v1")
    judged = Judge(RUBRIC, OpenAIJudgeClient(given.format(root=root), "m")).verdict("t", "a")
    assert judged.verdict.raw == 10 and script.requests[0][0] == "/v1/chat/completions"


def test_a_providers_base_url_with_its_own_path_is_kept(server):
    url, script = server
    root = url.removesuffix("/v1")
    Judge(RUBRIC, OpenAIJudgeClient(root + "/api/v1beta/openai", "m")).verdict("t", "a")
    assert script.requests[0][0] == "/api/v1beta/openai/chat/completions"
