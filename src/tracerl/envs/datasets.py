"""Tasks from a user's data file: one JSON object per line, checked as it is read.

    tasks = read_tasks("data/unitconv.jsonl", required=("id", "question", "expected"))

A line that is not JSON, a row missing a required field, or a duplicate id raises a
`DatasetError` naming the file, the line, the field and what to do: an environment that reads
its tasks with it fails when a config names it (`tracerl.preflight`), in two lines, not in the
middle of a run.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tracerl.errors import UserError
from tracerl.jsonl import json_objects


class DatasetError(UserError, ValueError):
    """A data file an environment cannot use: which file, which line, what to fix."""


def read_tasks(
    path: str | os.PathLike[str], *, required: Sequence[str] = ("id",)
) -> list[dict[str, Any]]:
    """The rows of a ``.jsonl`` (or ``.jsonl.gz``) file as task dicts, each with every field
    in `required`; ids (when required) must be unique."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(
            f"{path}: no such data file", "pass the path of a .jsonl file, one task per line"
        )
    opener = gzip.open if path.suffix == ".gz" else open
    rows: list[dict[str, Any]] = []
    seen: dict[str, str] = {}
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for where, row in json_objects(f, path):
                missing = [k for k in required if row.get(k) in (None, "")]
                if missing:
                    raise DatasetError(
                        f"{where}: the row has no {', '.join(map(repr, missing))} field "
                        f"(every row needs {', '.join(required)})",
                        f"add the field to that line of {path.name}, or remove the line",
                    )
                if "id" in required:
                    rid = str(row["id"])
                    if rid in seen:
                        raise DatasetError(
                            f"{where}: id {rid!r} is already used at {seen[rid]}",
                            "give every row its own id",
                        )
                    seen[rid] = where
                rows.append(row)
    except UnicodeDecodeError as e:
        raise DatasetError(f"{path}: not UTF-8 text ({e.reason})") from None
    except UserError as e:
        if isinstance(e, DatasetError):
            raise
        raise DatasetError(
            e.message, "fix or remove that line (one JSON object per line)"
        ) from None
    if not rows:
        raise DatasetError(f"{path}: no rows", "one JSON object (a task) per line")
    return rows
