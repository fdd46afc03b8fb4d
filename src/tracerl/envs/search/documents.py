"""What a corpus is: documents with ids, titles, text and a topic, in a fixed order.

The corpora themselves (wiki, synthetic, jsonl) are built in `tracerl.envs.search.corpus`
and `tracerl.envs.search.synthetic`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Doc:
    id: str
    title: str
    text: str
    topic: str = ""
    description: str = ""

    def contents(self) -> str:
        """Search-R1's ``contents`` field: the quoted title, a newline, the text."""
        return f'"{self.title}"\n{self.text}'


class Corpus:
    """Documents by id, in a fixed order (index row i is `docs[i]`)."""

    def __init__(self, name: str, docs: list[Doc]) -> None:
        ids = [d.id for d in docs]
        if len(set(ids)) != len(ids):
            dup = next(i for i in ids if ids.count(i) > 1)
            raise ValueError(f"corpus {name!r}: document id {dup!r} appears twice")
        self.name, self.docs = name, docs
        self.by_id = {d.id: d for d in docs}
        self.by_title = {d.title: d for d in docs}

    def __len__(self) -> int:
        return len(self.docs)

    def __contains__(self, doc_id: object) -> bool:
        return doc_id in self.by_id

    def get(self, doc_id: str) -> Doc | None:
        return self.by_id.get(doc_id)

    @property
    def sha256(self) -> str:
        h = hashlib.sha256()
        for d in self.docs:
            h.update(json.dumps([d.id, d.title, d.text], ensure_ascii=False).encode())
        return h.hexdigest()
