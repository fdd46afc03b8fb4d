"""Questions from files: the search environment's ``tasks`` argument.

The generated questions (``wiki``, ``synthetic``) come with the corpus; a dataset made
elsewhere, or questions over a corpus of one's own (``jsonl:``, which has none), come from
files:

* ``tasks: data/train.parquet`` — a parquet file in veRL's schema (Search-R1's processed
  data, or what `tracerl.envs.search.verl.export_parquet` wrote); each row's split is its
  ``extra_info.split`` (none: ``train``);
* ``tasks: data/questions.jsonl`` — one task a line: ``{"question": ..., "answers": [...]}``,
  optionally ``id``, ``split``, ``gold_docs`` (ids of the corpus's documents), ``hops``...;
* ``tasks: {train: data/train.parquet, test: data/test.parquet}`` — a file per split (its
  rows' own splits are ignored).

A file is read once per process (again when it changes). A row that is not a task is
refused with `DatasetError` naming the file, the row and the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from tracerl.envs.search.verl import DatasetError, import_parquet
from tracerl.jsonl import json_objects
from tracerl.types import TrajectoryError

TaskSource = str | Mapping[str, str]
"""A task file, or a task file per split."""

_HINT = (
    "a task file is a .parquet in veRL's schema or a .jsonl of "
    '{"question": ..., "answers": [...]} lines'
)


def load_tasks(source: Any) -> dict[str, tuple[dict[str, Any], ...]]:
    """The tasks `source` names, by split (``train`` first, then in the order they come)."""
    if isinstance(source, str | Path):
        files: dict[str | None, str] = {None: str(source)}
    elif (
        isinstance(source, Mapping)
        and source
        and all(isinstance(k, str) and isinstance(v, str | Path) for k, v in source.items())
    ):
        files = {k: str(v) for k, v in source.items()}
    else:
        raise DatasetError(
            f"tasks: {source!r} is neither a task file nor a task file per split",
            "give a path, or {split: path, ...}; " + _HINT,
        )
    by_split: dict[str, list[dict[str, Any]]] = {}
    for split, path in files.items():
        tasks = _read(path)
        if not tasks:
            raise DatasetError(f"{path}: no tasks in it", _HINT)
        for t in tasks:
            name = split or t.get("split") or "train"
            by_split.setdefault(name, []).append({**t, "split": name})
    order = sorted(by_split, key=lambda s: s != "train")  # stable: the rest as they came
    return {s: tuple(by_split[s]) for s in order}


def _read(path: str) -> tuple[dict[str, Any], ...]:
    p = Path(path).expanduser()
    if not p.is_file():
        raise DatasetError(f"{path}: no such task file", _HINT)
    st = p.stat()
    return _read_file(str(p.resolve()), path, st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=16)
def _read_file(resolved: str, given: str, mtime_ns: int, size: int) -> tuple[dict[str, Any], ...]:
    """A task file's tasks (`mtime_ns` and `size`: read again once it changes)."""
    if resolved.endswith(".parquet"):
        return tuple(import_parquet(given))
    if resolved.endswith(".jsonl"):
        return tuple(_jsonl_tasks(Path(resolved), given))
    raise DatasetError(f"{given}: neither .parquet nor .jsonl", _HINT)


def _jsonl_tasks(path: Path, given: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        try:
            rows = list(json_objects(f, given))
        except TrajectoryError as e:  # not JSON, or not an object: the line named
            raise DatasetError(str(e), _HINT) from None
    tasks = []
    for where, row in rows:
        question, answers = row.get("question"), row.get("answers")
        if not isinstance(question, str) or not question.strip():
            raise DatasetError(f"{where}: question is {question!r}, not text", _HINT)
        if isinstance(answers, str):
            answers = [answers]
        if (
            not isinstance(answers, list)
            or not answers
            or not all(isinstance(a, str) for a in answers)
        ):
            raise DatasetError(
                f"{where}: answers is {row.get('answers')!r}, not a list of strings", _HINT
            )
        gold = row.get("gold_docs", [])
        if not isinstance(gold, list) or not all(isinstance(d, str) for d in gold):
            raise DatasetError(f"{where}: gold_docs is {gold!r}, not a list of document ids", _HINT)
        task = {**row, "answers": answers, "gold_docs": gold}
        line = where.rsplit(":", 1)[1]
        task["id"] = str(row.get("id") or f"{path.stem}:{line}")
        tasks.append(task)
    return tasks
