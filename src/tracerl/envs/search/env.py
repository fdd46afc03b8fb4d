"""`search`: a Search-R1-style question-answering environment over a real (or generated) corpus.

Tools: ``search(query, k)`` → ranked snippets with doc ids and titles; ``open(doc_id)`` → the
full text, or a dead-link error; ``answer(text, citations)`` → ends the episode, citations
being ``{doc_id, quote}``. Two action protocols:

* ``tools`` — the model calls the three tools in its family's format (`hermes`, `json_list`);
* ``search_r1`` — Search-R1 tags: ``<search>query</search>`` runs `search`, and
  ``<answer>text</answer>`` ends the episode (no citations); the tools are not listed in
  the prompt, which describes the tags instead.

Retrieval is the in-process BM25 index, or (``retriever="http://..."``) a Search-R1 retrieval
server (`tracerl.envs.search.server`). Retrieved text is an observation: it reaches the model
as a tool message (environment tokens, never trained on). `evidence_gain` per step is the
share of the task's gold documents that the step surfaced for the first time (0 for a
repeated or useless search), which feeds the ledger and its marginal-gain stop.
"""

from __future__ import annotations

import asyncio
import random
import threading
from typing import Any

from pydantic import BaseModel, ConfigDict

from tracerl.envs.base import Message, StepResult, ToolEnv
from tracerl.envs.parsers import Action
from tracerl.envs.search import tasks as task_sets
from tracerl.envs.search.corpus import Corpus, load_corpus
from tracerl.envs.search.index import BM25Index, Hit
from tracerl.envs.search.task_files import load_tasks
from tracerl.envs.tools import PolicyError, ToolResult, tool
from tracerl.rewards.components import SEARCH_REWARD
from tracerl.types import FaultKind, ToolCall

PROTOCOLS = ("tools", "search_r1")
_INDEXES: dict[str, BM25Index] = {}
_INDEXES_LOCK = threading.Lock()  # one build or load per index per process


class Citation(BaseModel):
    """A claim's source: a document id and an exact quote from it."""

    model_config = ConfigDict(extra="forbid")
    doc_id: str
    quote: str


def _index(key: str, make: Any) -> Any:
    """The process's one index under `key`, made (built or loaded) by the first caller;
    the others wait for it."""
    with _INDEXES_LOCK:
        if key not in _INDEXES:
            _INDEXES[key] = make()
        return _INDEXES[key]


def bm25(corpus: Corpus) -> BM25Index:
    """One index per corpus per process (built or loaded from the disk cache once)."""
    return _index(corpus.sha256, lambda: BM25Index(corpus))


def dense(corpus: Corpus) -> Any:
    """The optional dense index (extra ``dense``), one per corpus per process."""

    def make() -> Any:
        from tracerl.envs.search.dense import DenseIndex

        return DenseIndex(corpus)

    return _index("dense:" + corpus.sha256, make)


class SearchEnv(ToolEnv):
    name = "search"
    version = "1.0"
    reward_components = SEARCH_REWARD

    def __init__(
        self,
        *,
        corpus: str = "synthetic",
        protocol: str = "tools",
        k: int = 3,
        snippet_chars: int = 240,
        retriever: str = "bm25",
        retriever_timeout_s: float = 5.0,
        side_effect_guard: str = "dry_run",
        max_hops: int | None = None,
        tasks: str | dict[str, str] | None = None,
    ) -> None:
        if protocol not in PROTOCOLS:
            raise ValueError(f"search env: protocol must be one of {PROTOCOLS}, got {protocol!r}")
        super().__init__(side_effect_guard=side_effect_guard)
        self.corpus_name, self.protocol, self.k, self.snippet_chars = (
            corpus,
            protocol,
            k,
            snippet_chars,
        )
        self.corpus = load_corpus(corpus)
        self.task_files = None if tasks is None else load_tasks(tasks)
        """Questions from a file (`tracerl.envs.search.task_files`), by split; None: the
        corpus's generated questions."""
        self.splits = (
            task_sets.splits_of(corpus) if self.task_files is None else tuple(self.task_files)
        )
        self.max_hops = max_hops
        """Only questions of at most this many hops (None: all) are sampled."""
        # "bm25": the in-process index; "http://host:port": a Search-R1 retrieval server
        # serving the same corpus (its outages become environment faults).
        self.retriever_spec = retriever
        self.retriever_timeout_s = retriever_timeout_s
        self.seen: set[str] = set()
        self.searches: list[str] = []

    # ---- tools -----------------------------------------------------------------------------
    @tool(effect="read", timeout_s=10.0, version="1")
    def search(self, query: str, k: int = 3) -> ToolResult:
        """Search the corpus; returns ranked snippets with document ids and titles.

        Args:
            query: a few keywords naming what you look for.
            k: how many results (1 to 10).
        """
        if not 1 <= k <= 10:
            raise PolicyError("k must be between 1 and 10", FaultKind.INVALID_ARGUMENTS)
        self.searches.append(query)
        hits = self._retriever().search(query, k)
        if not hits:
            return ToolResult("no results", evidence={"gain": 0.0, "docs": []})
        return ToolResult(self._format(hits), evidence=self._gain([h.doc.id for h in hits]))

    @tool(name="open", effect="read", timeout_s=10.0, version="1")
    def open_doc(self, doc_id: str) -> ToolResult:
        """Open a document by id; returns its full text.

        Args:
            doc_id: an id from the search results.
        """
        doc = self.corpus.get(doc_id.strip())
        if doc is None:
            raise PolicyError(f"dead link: no document {doc_id!r}", FaultKind.INVALID_ARGUMENTS)
        return ToolResult(self.document(doc.id) or "", evidence=self._gain([doc.id]))

    @tool(effect="read", timeout_s=5.0, version="1")
    def answer(self, text: str, citations: list[Citation] | None = None) -> ToolResult:
        """Give the final answer, with the documents and exact quotes that support it.

        Args:
            text: the answer, as short as possible (a name, a year, a title).
            citations: supporting quotes, each {"doc_id": ..., "quote": ...}.
        """
        cites = [c.model_dump() for c in citations or []]
        self.answer = {"text": text, "citations": cites}
        return ToolResult("answer recorded", evidence={"gain": 0.0})

    def _retriever(self) -> Any:
        if self.retriever_spec == "bm25":
            return bm25(self.corpus)
        if self.retriever_spec == "dense":
            return dense(self.corpus)
        if self.retriever_spec.startswith(("http://", "https://")):
            from tracerl.envs.search.server import RetrievalClient

            return RetrievalClient(self.retriever_spec, timeout_s=self.retriever_timeout_s)
        raise ValueError(
            "search env: retriever must be 'bm25', 'dense' or an http(s) URL, got "
            f"{self.retriever_spec!r}"
        )

    def _format(self, hits: list[Hit]) -> str:
        lines = []
        for rank, h in enumerate(hits, start=1):
            snippet = h.doc.text[: self.snippet_chars]
            snippet += "..." if len(h.doc.text) > self.snippet_chars else ""
            if self.protocol == "search_r1":
                lines.append(f'Doc {rank} (id {h.doc.id}, title "{h.doc.title}"): {snippet}')
            else:
                lines.append(f"[{rank}] {h.doc.id} | {h.doc.title}\n{snippet}")
        text = "\n".join(lines)
        return f"<information>{text}</information>" if self.protocol == "search_r1" else text

    def _gain(self, doc_ids: list[str]) -> dict[str, Any]:
        gold = set(self.task.get("gold_docs", []))
        new = (set(doc_ids) & gold) - self.seen
        self.seen |= set(doc_ids)
        return {"gain": len(new) / len(gold) if gold else 0.0, "docs": doc_ids}

    # ---- episode ---------------------------------------------------------------------------
    def document(self, doc_id: str) -> str | None:
        """A document as `open` shows it (title line, then text): what citations quote."""
        doc = self.corpus.get(doc_id)
        return None if doc is None else f"{doc.title}\n{doc.text}"

    def tool_schemas(self) -> list[dict[str, Any]]:
        return [] if self.protocol == "search_r1" else super().tool_schemas()

    def prepare(self) -> None:
        """The index, built or loaded once per process before any episode starts its clock
        (not inside the first search: a first run's first searches would otherwise spend
        their time limit building it, and time out where a later run's do not)."""
        if self.retriever_spec in ("bm25", "dense"):
            self._retriever()

    async def setup(self, task: dict[str, Any], seed: int) -> list[Message]:
        self.seen, self.searches = set(), []
        if self.retriever_spec in ("bm25", "dense"):  # (a caller that skipped `prepare`)
            await asyncio.to_thread(self._retriever)
        return [
            {"role": "system", "content": _INSTRUCTIONS[self.protocol]},
            {"role": "user", "content": task["question"]},
        ]

    async def finish(self, action: Action) -> StepResult:
        self.answer = {"text": action.answer or "", "citations": []}
        return StepResult([], terminated=True, info={"answer": self.answer})

    def sample_tasks(self, n: int, *, seed: int = 0, split: str = "train") -> list[dict[str, Any]]:
        if self.task_files is None:
            return task_sets.sample(self.corpus_name, split, n, seed, max_hops=self.max_hops)
        if split not in self.task_files:
            raise KeyError(
                f"unknown split {split!r}; the task files': {', '.join(self.task_files)}"
            )
        pool = [
            q
            for q in self.task_files[split]
            if self.max_hops is None or q.get("hops", 1) <= self.max_hops
        ]
        rng = random.Random(f"tasks:{split}:{seed}")
        return [dict(q) for q in rng.sample(pool, min(n, len(pool)))]

    def check_script(self, task: dict[str, Any]) -> list[Action]:
        gold = task.get("gold_docs") or []
        if not gold or any(self.corpus.get(d) is None for d in gold):
            actions = question_actions(task)  # a task from a file may name no gold document
        else:
            actions = oracle_actions(self.corpus, task)
        if self.protocol == "search_r1":  # the answer is a tag, not a tool call (no citations)
            actions[-1] = Action(text="", answer=task["answers"][0])
        return actions


def oracle_actions(corpus: Corpus, task: dict[str, Any]) -> list[Action]:
    """A scripted oracle: one search per gold document, with a query the question itself
    gives (`tasks.reference_queries`: never the answer), then the gold answer and a citation
    quoting the sentence of the last gold document that states it."""
    actions = []
    for i, query in enumerate(task_sets.reference_queries(corpus, task)):
        call = ToolCall(f"call_{i}_0", "search", {"query": query, "k": 3})
        actions.append(Action(text="", tool_calls=(call,)))
    gold, last = task["answers"][0], corpus.by_id[task["gold_docs"][-1]]
    # the sentence stating the answer; for a title answer, the title line of the document
    quote = next((s for s in _sentences(last.text) if gold in s), last.title)
    cite = {"doc_id": last.id, "quote": quote}
    answer = ToolCall(f"call_{len(actions)}_0", "answer", {"text": gold, "citations": [cite]})
    actions.append(Action(text="", tool_calls=(answer,)))
    return actions


def question_actions(task: dict[str, Any]) -> list[Action]:
    """The reference for a task whose gold documents the corpus does not hold (a dataset made
    for another corpus, or one that names none): one search with the question itself, then
    the gold answer, citing nothing."""
    search = ToolCall("call_0_0", "search", {"query": task["question"], "k": 3})
    answer = ToolCall("call_1_0", "answer", {"text": task["answers"][0], "citations": []})
    return [Action(text="", tool_calls=(search,)), Action(text="", tool_calls=(answer,))]


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in text.replace("\n", " ").split(". ") if s.strip()]


_INSTRUCTIONS = {
    "tools": (
        "Answer the question with the help of the tools. Search the corpus, open documents "
        "when a snippet is not enough, then call `answer` with a short answer and citations: "
        "the id of a document and an exact quote from it that supports the answer."
    ),
    "search_r1": (
        "Answer the question. Think first. To look something up, write <search>a few "
        "keywords</search> and the results come back inside <information></information>. "
        "Search as often as you need; when you know the answer, write it inside "
        "<answer></answer>, as short as possible."
    ),
}
