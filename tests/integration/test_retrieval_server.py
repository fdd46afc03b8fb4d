"""The retrieval server on loopback: Search-R1's protocol, and outages as env faults."""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.error
import urllib.request

import pytest

from tracerl.envs import get_parser, make
from tracerl.envs.search import oracle_actions
from tracerl.envs.search import tasks as task_sets
from tracerl.envs.search.corpus import load_corpus
from tracerl.envs.search.server import RetrievalClient, RetrievalServer
from tracerl.envs.tools import InfraError
from tracerl.rollout import ScriptedSampler
from tracerl.rollout.budget import Budgets, RetryPolicy, RolloutConfig
from tracerl.rollout.runner import Policy, run_episode


def _post(url, payload):
    req = urllib.request.Request(
        url + "/retrieve", json.dumps(payload).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())


def test_search_r1_protocol_on_loopback():
    corpus = load_corpus("synthetic")
    title = corpus.docs[5].title
    with RetrievalServer(corpus) as server:
        scored = _post(server.url, {"queries": [title, "zzzz"], "topk": 2, "return_scores": True})
        plain = _post(server.url, {"queries": [title], "topk": 2})
        hits = RetrievalClient(server.url).search(title, 2)
        with pytest.raises(urllib.error.HTTPError) as bad:
            _post(server.url, {"queries": "not a list"})
    assert len(scored["result"]) == 2 and scored["result"][1] == []
    top = scored["result"][0][0]
    assert top["document"]["id"] == corpus.docs[5].id and top["score"] > 0
    assert top["document"]["contents"].startswith(f'"{title}"\n')
    assert plain["result"][0][0] == top["document"]
    assert hits[0].doc.id == corpus.docs[5].id and hits[0].doc.title == title
    assert bad.value.code == 400


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _oracle(tiny, env, task):
    parser = get_parser("json_list")
    texts = [
        parser.format_calls([(a.tool_calls[0].name, a.tool_calls[0].arguments)])
        for a in oracle_actions(env.corpus, task)
    ]
    return Policy(ScriptedSampler.from_texts(tiny.renderer, texts), tiny.renderer, parser, "t")


def test_a_retriever_outage_is_the_environments_fault(tiny):
    dead = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    with pytest.raises(InfraError) as e:
        RetrievalClient(dead, timeout_s=1).search("x")
    assert e.value.kind.value == "connection_refused"

    task = task_sets.sample("synthetic", "heldout", 1, seed=3)[0]
    cfg = RolloutConfig(budgets=Budgets(steps=6), retry=RetryPolicy(max_retries=1, backoff_s=0))
    env = make("search", corpus="synthetic", retriever=dead)
    ep = asyncio.run(run_episode(env, task, _oracle(tiny, env, task), cfg))
    assert ep.stop_reason.value == "infra_failure" and ep.attribution.value == "environment"
    assert not ep.gradient_eligible and len(ep.steps[0]["attempts"]) == 2

    with RetrievalServer(load_corpus("synthetic")) as server:  # the same episode, service up
        live = make("search", corpus="synthetic", retriever=server.url)
        ok = asyncio.run(run_episode(live, task, _oracle(tiny, live, task), cfg))
    assert ok.stop_reason.value == "answered" and ok.gradient_eligible


def test_dense_retrieval_finds_documents_by_meaning(tmp_path, monkeypatch):
    """The optional dense index (MiniLM shipped in a package, faiss), cached by corpus hash;
    the env loads it in the episode's set-up (`reset`), never inside a search's time limit."""
    pytest.importorskip("faiss")
    from tracerl.envs.search import env as search_env
    from tracerl.envs.search.dense import DenseIndex

    monkeypatch.setenv("TRACERL_CACHE", str(tmp_path))
    monkeypatch.setattr(search_env, "_INDEXES", {})  # this process has no index yet
    corpus = load_corpus("synthetic")
    index = DenseIndex(corpus, cache=tmp_path / "indexes")
    doc = next(d for d in corpus.docs if d.id.startswith("syn:org:"))
    hits = index.search(f"the company {doc.title}", 3)
    assert doc.id in [h.doc.id for h in hits]
    again = DenseIndex(corpus, cache=tmp_path / "indexes")
    assert index.origin == "built" and again.origin == "cache"
    env = make("search", corpus="synthetic", retriever="dense")
    asyncio.run(env.reset(env.sample_tasks(1)[0], 0))
    assert search_env._INDEXES[f"dense:{corpus.sha256}"].origin == "cache"  # the one built
    result = asyncio.run(env.search({"query": doc.title}))
    assert result.ok and doc.id in result.content


def test_a_first_episode_on_an_empty_cache_builds_its_index_before_its_clock_starts(
    tmp_path, monkeypatch, tiny
):
    """An empty cache, a machine kept busy by a CPU-bound competitor, and an index build
    made slower than the episode's whole wall-time budget: the episode still answers within
    its budget, since set-up (`Env.prepare`) runs before its clock starts."""
    pytest.importorskip("faiss")
    import subprocess
    import sys
    import time

    from tracerl.envs.search import env as search_env

    monkeypatch.setenv("TRACERL_CACHE", str(tmp_path))  # nothing built, nothing cached
    monkeypatch.setattr(search_env, "_INDEXES", {})
    build, built = search_env.dense, []

    def slow(corpus):
        index = build(corpus)
        if not built:  # the first build only (later calls find it in the process's cache)
            built.append(index)
            time.sleep(4)  # longer than the episode's whole budget
        return index

    monkeypatch.setattr(search_env, "dense", slow)
    task = task_sets.sample("synthetic", "heldout", 1, seed=3)[0]
    cfg = RolloutConfig(budgets=Budgets(steps=6, wall_time_s=3.0), reserve=None)
    env = make("search", corpus="synthetic", retriever="dense")
    competitor = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        ep = asyncio.run(run_episode(env, task, _oracle(tiny, env, task), cfg))
    finally:
        competitor.kill()
        competitor.wait()
    assert ep.stop_reason.value == "answered" and ep.gradient_eligible, ep.receipt.error
    corpus = load_corpus("synthetic")
    assert search_env._INDEXES[f"dense:{corpus.sha256}"].origin == "built"


def test_every_way_the_retriever_can_fail_is_an_infra_error():
    """A fake server that drops connections, cuts answers, and sends nonsense."""
    import http.server
    import threading

    replies = {
        "/drop/retrieve": None,
        "/cut/retrieve": b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"res',
        "/junk/retrieve": b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nnot json!",
        "/shape/retrieve": b'HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n{"result": 1}',
        "/bad/retrieve": b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n",
        "/boom/retrieve": b"HTTP/1.1 503 Busy\r\nContent-Length: 0\r\n\r\n",
    }

    class Fake(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            reply = replies[self.path]
            if reply is not None:
                self.wfile.write(reply)
            self.close_connection = True

        def log_message(self, *a):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Fake)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        kinds = {}
        for route in ("drop", "cut", "junk", "shape", "bad", "boom"):
            with pytest.raises(InfraError) as e:
                RetrievalClient(f"{base}/{route}", timeout_s=2).search("x")
            kinds[route] = (e.value.kind.value, e.value.retryable)
    finally:
        httpd.shutdown()
    assert all(k == "server_error" for k, _ in kinds.values()), kinds
    assert kinds["boom"][1] is True and kinds["bad"][1] is False
