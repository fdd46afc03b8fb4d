"""Trajectories on disk: one JSON object per line, optionally gzip-compressed.

Floats are written with Python's shortest round-tripping repr, so token ids, sources and
logprobs come back bit-for-bit. A `.gz` suffix selects gzip. Appending to a `.gz` file adds a
gzip member, which every gzip reader (and `read_trajectories`) reads as one stream.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from tracerl.types import Trajectory, TrajectoryError


def _open(path: Path, mode: str, gz: bool | None = None) -> IO[str]:
    if path.suffix == ".gz" if gz is None else gz:
        return gzip.open(path, mode + "t", encoding="utf-8")  # type: ignore[return-value]
    return open(path, mode, encoding="utf-8")


def dumps(traj: Trajectory) -> str:
    """One line of JSON (no trailing newline)."""
    return json.dumps(traj.to_dict(), ensure_ascii=False, separators=(",", ":"))


def write_trajectories(
    path: str | os.PathLike[str], trajectories: Iterable[Trajectory], *, append: bool = False
) -> int:
    """Write trajectories to `path` (JSONL, gzip if it ends in .gz). Returns the count written.

    Without `append`, the file is written to a temporary name and renamed into place, so a
    crash never leaves a half-written file behind and an existing file is never truncated.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [dumps(t) + "\n" for t in trajectories]
    if append:
        with _open(path, "a") as f:
            f.writelines(lines)
            f.flush()
        return len(lines)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with _open(tmp, "w", gz=path.suffix == ".gz") as f:
            f.writelines(lines)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return len(lines)


def iter_trajectories(path: str | os.PathLike[str]) -> Iterator[Trajectory]:
    """Yield trajectories from a JSONL(.gz) file; a bad line raises naming file and line."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such trajectory file")
    with _open(path, "r") as f:
        yield from parse_lines(f, path)


def json_objects(
    lines: Iterable[str], path: str | os.PathLike[str], *, hint: str = ""
) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(where, object)`` per non-blank line; a line that is not a JSON object raises a
    `TrajectoryError` (a ValueError) naming ``file:line`` (plus `hint`)."""
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise TrajectoryError(
                f"{where}: not valid JSON ({e.msg} at column {e.colno}){hint}"
            ) from None
        if not isinstance(obj, dict):
            raise TrajectoryError(f"{where}: expected a JSON object per line")
        yield where, obj


def parse_lines(lines: Iterable[str], path: str | os.PathLike[str]) -> Iterator[Trajectory]:
    """Trajectories from JSON lines read from `path` (named in errors)."""
    hint = "; the line may be truncated by a crash — remove it and rerun"
    for where, obj in json_objects(lines, path, hint=hint):
        yield Trajectory.from_dict(obj, where=where)


def read_trajectories(path: str | os.PathLike[str]) -> list[Trajectory]:
    return list(iter_trajectories(path))
