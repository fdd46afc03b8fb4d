"""Trajectories on disk: one JSON object per line, optionally gzip-compressed.

Floats are written with Python's shortest round-tripping repr, so token ids, sources and
logprobs come back bit-for-bit. A `.gz` suffix selects gzip. Appending to a `.gz` file adds a
gzip member, which every gzip reader (and `read_trajectories`) reads as one stream.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from tracerl.types import Trajectory, TrajectoryError

log = logging.getLogger("tracerl")


def _open(path: Path, mode: str, gz: bool | None = None) -> IO[str]:
    if path.suffix == ".gz" if gz is None else gz:
        return gzip.open(path, mode + "t", encoding="utf-8")  # type: ignore[return-value]
    return open(path, mode, encoding="utf-8")


def dumps(traj: Trajectory) -> str:
    """One line of JSON (no trailing newline). Text that UTF-8 cannot hold (a lone
    surrogate a tool or harness returned) is written escaped, and reads back as it was: a
    strange observation never stops a run from writing its episodes."""
    d = traj.to_dict()
    line = json.dumps(d, ensure_ascii=False, separators=(",", ":"))
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        line = json.dumps(d, ensure_ascii=True, separators=(",", ":"))
    return line


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
    first = True
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            if first:  # not a torn write: the file is not JSON lines at all
                raise TrajectoryError(
                    f"{where}: not valid JSON ({e.msg} at column {e.colno}): {path} is not "
                    "a JSON-lines file"
                ) from None
            raise TrajectoryError(
                f"{where}: not valid JSON ({e.msg} at column {e.colno}){hint}"
            ) from None
        first = False
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


# ---- append-only gzip files (one member per record, a crash may tear the last) ----------
_CHUNK = 1 << 16


def _member_end(data: bytes, start: int) -> int | None:
    """Where the complete gzip member starting at `start` ends, or None if it is not one."""
    d = zlib.decompressobj(wbits=31)
    pos = start
    try:
        while pos < len(data):
            chunk = data[pos : pos + _CHUNK]
            d.decompress(chunk, 0)
            if d.eof:
                return pos + len(chunk) - len(d.unused_data)
            pos += len(chunk)
    except zlib.error:
        return None
    return None


def complete_prefix(data: bytes) -> int:
    """Length of the longest prefix of `data` made of complete gzip members."""
    pos = 0
    while pos < len(data):
        end = _member_end(data, pos)
        if end is None:
            break
        pos = end
    return pos


def check_tail(path: Path, data: bytes) -> int:
    """The length of the file's good part. Only a torn *last* member may be cut: damage
    followed by complete members is corruption, and nothing is cut or appended then."""
    good = complete_prefix(data)
    magic = data.find(b"\x1f\x8b\x08", good + 1)
    while magic != -1:
        if _member_end(data, magic) is not None:
            raise TrajectoryError(
                f"{path}: damaged at byte {good} with complete episodes after it; this is "
                "not a torn last write. Keep the file and restore it from a copy."
            )
        magic = data.find(b"\x1f\x8b\x08", magic + 1)
    return good


def complete_members_text(path: Path) -> list[str]:
    """The lines of a multi-member gzip file, up to its last complete member: a torn last
    write (a crash, or a write still in progress) is skipped with a warning."""
    data = path.read_bytes()
    good = check_tail(path, data)
    if good < len(data):
        log.warning("%s: ignoring a torn last write of %d bytes", path, len(data) - good)
    text = gzip.decompress(data[:good]).decode("utf-8") if good else ""
    # split on "\n" only: str.splitlines() also splits on U+2028 and friends, which JSON
    # written with ensure_ascii=False may contain inside strings.
    return text.split("\n")
