"""A first run on an empty cache gives what later runs give.

Every cached artefact the suite relies on is built here into an empty folder, used, then
loaded back from disk and used again; the results must be identical:

* the BM25 indexes (synthetic and wiki corpora): hits and scores for a few hundred queries,
  against an index built in memory by bm25s itself, never saved;
* the dense index: hits and scores, the vectors built in memory against those loaded;
* seeded search episodes, many running at once as in training: token for token, first run
  (empty cache, the index built while episodes start) against a second run (index loaded).
  Before the fix, concurrent first uses built the index several times at once inside the
  first search calls and deleted one another's half-written folders, so some first-run
  searches failed and those episodes differed;
* the converted SmolLM2 weights and tokenizer are compared cold against cached in
  `tests/integration/test_smollm2.py`.
"""

from __future__ import annotations

import asyncio

import pytest

from tracerl.envs import get_parser, make
from tracerl.envs.search import env as search_env
from tracerl.envs.search import oracle_actions
from tracerl.envs.search import tasks as task_sets
from tracerl.envs.search.corpus import load_corpus
from tracerl.envs.search.index import BM25Index
from tracerl.rollout import ScriptedSampler
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.groups import run_groups
from tracerl.rollout.runner import Policy

CONFIG = RolloutConfig(budgets=Budgets(steps=6, tool_calls=6), reserve=None)


def _queries(corpus_name: str, n: int = 300) -> list[str]:
    """Titles, questions, words no document has, stop words only, and prefixes."""
    corpus = load_corpus(corpus_name)
    docs = corpus.docs[:: max(1, len(corpus.docs) // (n // 3))][: n // 3]
    questions = [t["question"] for t in task_sets.sample(corpus_name, "heldout", n // 3, seed=3)]
    words = [" ".join(d.text.split()[2:6]) for d in docs]
    return [d.title for d in docs] + questions + words + ["zzqxv unknownword", "the of and"]


def _hits(index, queries):
    return [[(h.doc.id, h.score) for h in index.search(q, 5)] for q in queries]


@pytest.mark.parametrize("corpus_name", ["synthetic", "wiki"])
def test_bm25_built_into_an_empty_cache_answers_as_when_loaded_back(tmp_path, corpus_name):
    import bm25s

    corpus = load_corpus(corpus_name)
    queries = _queries(corpus_name)
    first = BM25Index(corpus, cache=tmp_path)
    assert first.origin == "built" and (first.folder / "params.index.json").is_file()
    again = BM25Index(corpus, cache=tmp_path)
    assert again.origin == "cache"
    # an index bm25s builds in memory and never saves: what the cached copy must equal
    memory = BM25Index.__new__(BM25Index)
    memory.corpus = corpus
    memory.retriever = bm25s.BM25()
    texts = [f"{d.title}\n{d.text}" for d in corpus.docs]
    memory.retriever.index(bm25s.tokenize(texts, stopwords="en", show_progress=False), False)
    memory.vocab = memory.retriever.vocab_dict
    want = _hits(memory, queries)
    assert sum(bool(h) for h in want) >= 0.9 * len(queries)  # the queries do find things
    assert _hits(first, queries) == want
    assert _hits(again, queries) == want


def test_dense_built_into_an_empty_cache_answers_as_when_loaded_back(tmp_path):
    pytest.importorskip("faiss")
    from tracerl.envs.search.dense import DenseIndex

    corpus = load_corpus("synthetic")
    queries = _queries("synthetic", 150)
    first = DenseIndex(corpus, cache=tmp_path)
    again = DenseIndex(corpus, cache=tmp_path)
    assert (first.origin, again.origin) == ("built", "cache")
    assert _hits(first, queries) == _hits(again, queries)


def _seeded_run(tiny, corpus_name: str) -> list[dict]:
    """40 held-out questions at once: search the question, then the oracle's searches."""
    env = make("search", corpus=corpus_name)
    tasks = task_sets.sample(corpus_name, "heldout", 40, seed=1)
    parser = get_parser("json_list")
    by_id = {t["id"]: t for t in tasks}

    def turn(request):
        task = by_id[request.episode_id.rsplit(":s", 1)[0]]
        calls = [("search", {"query": task["question"], "k": 5})]
        calls += [
            (a.tool_calls[0].name, a.tool_calls[0].arguments)
            for a in oracle_actions(env.corpus, task)
        ]
        return parser.format_calls([calls[min(request.turn, len(calls) - 1)]])

    policy = Policy(ScriptedSampler.from_texts(tiny.renderer, turn), tiny.renderer, parser, "t")
    groups = asyncio.run(
        run_groups(
            lambda: make("search", corpus=corpus_name), tasks, policy, CONFIG, group_size=1, seed=7
        )
    )
    out = []
    for (e,) in groups:
        t = e.trajectories[0]
        out.append(
            {
                "id": e.episode_id,
                "token_ids": t.token_ids,
                "loss_mask": t.loss_mask,
                "sources": [str(s) for s in t.sources],
                "stop": e.stop_reason.value,
                "calls": [
                    (c["action"]["tool"], c["observation"]["status"])
                    for s in e.steps
                    for c in s.get("calls", [])
                ],
                "gain": [ev["evidence_gain"] for ev in e.receipt.ledger["events"]],
            }
        )
    return out


@pytest.mark.parametrize("corpus_name", ["synthetic", "wiki"])
def test_a_first_run_on_an_empty_cache_gives_the_episodes_of_a_later_run(
    tiny, tmp_path, monkeypatch, corpus_name
):
    monkeypatch.setenv("TRACERL_CACHE", str(tmp_path))
    monkeypatch.setattr(search_env, "_INDEXES", {})  # this process has no index yet
    first = _seeded_run(tiny, corpus_name)
    assert next(iter(search_env._INDEXES.values())).origin == "built"
    monkeypatch.setattr(search_env, "_INDEXES", {})  # a new process: the index from disk
    second = _seeded_run(tiny, corpus_name)
    assert next(iter(search_env._INDEXES.values())).origin == "cache"
    assert len(first) == 40
    # every search of the first run succeeded, as in the second
    assert all(status == "ok" for e in first for _, status in e["calls"]), [
        e["calls"] for e in first if any(s != "ok" for _, s in e["calls"])
    ]
    for a, b in zip(first, second, strict=True):
        assert a == b, a["id"]
