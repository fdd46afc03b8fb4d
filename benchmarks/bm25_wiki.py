"""BM25 over the wiki corpus: index build time, cached load time, and 1,000 queries.

Run: .venv/bin/python benchmarks/bm25_wiki.py

Builds the index in a fresh temporary cache (so the build is really measured), loads it back
from that cache, then answers 1,000 held-out and train questions (their question text as the
query, top 5) one at a time and in one batch. Prints seconds, queries per second, and the
share of queries whose first gold document is in the top 5 (recall@5, a sanity figure for
the question generator, not a retrieval benchmark).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from tracerl.envs.search import tasks as task_sets
from tracerl.envs.search.corpus import wiki_corpus
from tracerl.envs.search.index import BM25Index


def main() -> None:
    t0 = time.perf_counter()
    corpus = wiki_corpus()
    read_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        built = BM25Index(corpus, cache=Path(tmp))
        loaded = BM25Index(corpus, cache=Path(tmp))
    questions = [q for s in ("heldout", "train") for q in task_sets.sample("wiki", s, 500)]
    queries = [q["question"] for q in questions]
    t0 = time.perf_counter()
    one_by_one = [loaded.search(q, 5) for q in queries]
    single_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    batched = loaded.search_many(queries, 5)
    batch_s = time.perf_counter() - t0
    same = [[h.doc.id for h in a] for a in one_by_one] == [[h.doc.id for h in b] for b in batched]
    recall = sum(
        q["gold_docs"][0] in {h.doc.id for h in hits}
        for q, hits in zip(questions, batched, strict=True)
    ) / len(questions)
    print(f"wiki corpus: {len(corpus)} documents, read from the package in {read_s:.2f} s")
    print(f"  index build:   {built.build_seconds:6.2f} s  ({built.origin})")
    print(f"  index load:    {loaded.build_seconds:6.2f} s  ({loaded.origin})")
    print(f"  1,000 queries one at a time: {single_s:6.2f} s  ({len(queries) / single_s:7.0f} q/s)")
    print(f"  1,000 queries in one batch:  {batch_s:6.2f} s  ({len(queries) / batch_s:7.0f} q/s)")
    print(f"  same results both ways: {same}; recall@5 of the first gold doc: {recall:.2f}")


if __name__ == "__main__":
    main()
