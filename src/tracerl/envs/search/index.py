"""BM25 retrieval with `bm25s`, the index cached on disk under the corpus's content hash.

The first use of a corpus builds its index and saves it to
``$TRACERL_CACHE/indexes/bm25-<corpus sha256[:16]>/``; later uses load it. The build holds
the folder's build lock (`tracerl.cache.building`), so concurrent first uses build it once,
and the index searched is always the one loaded back from disk, so a first run and a later
one search the same index (`tests/integration/test_fresh_cache.py` compares them). A changed corpus
has a different hash, so a stale index is never used. Documents are indexed as title and
text together; queries are tokenized the same way (lower case, English stop words removed).

Scoring and top-k selection are numpy's, and JAX is never imported (`_bm25s`): bm25s would
otherwise import it wherever it is installed, as on most GPU images, and JAX then takes 75%
of the GPU's memory for itself.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from tracerl.cache import building, cache_dir, save_folder_atomically
from tracerl.envs.search.corpus import Corpus, Doc

log = logging.getLogger("tracerl")


@dataclass(frozen=True)
class Hit:
    doc: Doc
    score: float


class BM25Index:
    """`search(query, k)` over a corpus; build or load happens in the constructor."""

    def __init__(self, corpus: Corpus, *, cache: Path | None = None) -> None:
        bm25s = _bm25s()

        self.corpus = corpus
        self.folder = (cache or cache_dir() / "indexes") / f"bm25-{corpus.sha256[:16]}"
        t0 = time.perf_counter()
        with building(self.folder):  # built once, however many ask at the same moment
            self.origin = "cache"
            if not (self.folder / "params.index.json").is_file():
                built = bm25s.BM25(backend="numpy")
                texts = [f"{d.title}\n{d.text}" for d in corpus.docs]
                tokens = bm25s.tokenize(texts, stopwords="en", show_progress=False)
                built.index(tokens, show_progress=False)
                save_folder_atomically(self.folder, lambda f: built.save(f, show_progress=False))
                self.origin = "built"
            # always the copy on disk: a first run searches exactly what later runs load
            self.retriever = bm25s.BM25.load(self.folder, show_progress=False, backend="numpy")
        self.build_seconds = time.perf_counter() - t0
        self.vocab = self.retriever.vocab_dict

    def search(self, query: str, k: int = 5) -> list[Hit]:
        return self.search_many([query], k)[0]

    def search_many(self, queries: list[str], k: int = 5) -> list[list[Hit]]:
        """Top-k hits per query (fewer when fewer documents match; none for a query whose
        words are all unknown or stop words)."""
        bm25s = _bm25s()

        k = max(1, min(k, len(self.corpus)))
        tokenized = bm25s.tokenize(queries, stopwords="en", return_ids=False, show_progress=False)
        known = [[t for t in toks if t in self.vocab] for toks in tokenized]
        out: list[list[Hit]] = [[] for _ in queries]
        rows = [i for i, toks in enumerate(known) if toks]
        if not rows:
            return out
        docs_Q_K, scores_Q_K = self.retriever.retrieve(
            [known[i] for i in rows],
            k=k,
            show_progress=False,
            n_threads=1,
            backend_selection="numpy",  # its default, "auto", is JAX's top-k where JAX imports
        )
        for row, ids, scores in zip(rows, docs_Q_K, scores_Q_K, strict=True):
            out[row] = [
                Hit(self.corpus.docs[int(i)], float(s))
                for i, s in zip(ids, scores, strict=True)
                if s > 0
            ]
        return out


_JAX = ("jax", "jax.lax")  # what bm25s imports (bm25s.selection)


def _bm25s() -> ModuleType:
    """`bm25s`, imported with JAX unimportable. Its first import runs ``import jax.lax`` where
    JAX is installed, and one top-k on it, which starts JAX's GPU backend: JAX takes 75% of
    the GPU's memory as it starts (its default preallocation), from the trainer beside it.
    A ``None`` in `sys.modules` makes that import raise `ImportError`, which bm25s catches
    (then selecting with numpy); the entries are restored at once, so nothing else is kept
    from JAX. Another thread importing JAX during this very import would see it missing."""
    if "bm25s" in sys.modules:
        return sys.modules["bm25s"]
    saved = {name: sys.modules[name] for name in _JAX if name in sys.modules}
    sys.modules.update(dict.fromkeys(_JAX))
    try:
        import bm25s
    finally:
        for name in _JAX:
            if name in saved:
                sys.modules[name] = saved[name]
            else:
                sys.modules.pop(name, None)
    return bm25s
