"""The search environment: corpora (wiki, synthetic, jsonl), BM25 retrieval, questions."""

from tracerl.envs.search.corpus import Corpus, Doc, load_corpus
from tracerl.envs.search.env import Citation, SearchEnv, oracle_actions
from tracerl.envs.search.index import BM25Index, Hit

__all__ = [
    "BM25Index",
    "Citation",
    "Corpus",
    "Doc",
    "Hit",
    "SearchEnv",
    "load_corpus",
    "oracle_actions",
]
