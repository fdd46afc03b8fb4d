"""The run directory's episode files, written so that nothing written is ever lost.

`EpisodeWriter` appends each finished episode to ``episodes/step_<n>.jsonl.gz`` as its own
gzip member, flushed and fsynced before `append` returns: a crash can lose only the episodes
still in flight, never one already written. A crash *during* an append leaves a torn last
member; opening the file for writing again cuts it off (that episode was not written), and
readers stop at the last complete member with a warning rather than failing the whole file.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from tracerl.jsonl import dumps, parse_lines
from tracerl.types import Trajectory, TrajectoryError

log = logging.getLogger("tracerl")


def append_metrics(run_dir: str | os.PathLike[str], row: dict[str, Any]) -> None:
    """One line of ``metrics.jsonl`` in the run directory."""
    path = Path(run_dir) / "metrics.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def episodes_dir(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / "episodes"


def step_file(run_dir: str | os.PathLike[str], step: int) -> Path:
    return episodes_dir(run_dir) / f"step_{step}.jsonl.gz"


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


class EpisodeWriter:
    """Appends finished episodes' trajectories to one step file, durably."""

    def __init__(self, run_dir: str | os.PathLike[str], step: int = 0) -> None:
        self.path = step_file(run_dir, step)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.episodes = 0
        self.trajectories = 0
        if self.path.exists():
            data = self.path.read_bytes()
            good = check_tail(self.path, data)
            if good < len(data):
                log.warning(
                    "%s: cutting a torn last write (%d bytes) left by a crash; the episodes "
                    "before it are intact",
                    self.path,
                    len(data) - good,
                )
                with open(self.path, "r+b") as f:
                    f.truncate(good)

    def append(self, trajectories: Iterable[Trajectory]) -> None:
        """Write one episode's trajectories as one gzip member; durable when this returns."""
        lines = "".join(dumps(t) + "\n" for t in trajectories)
        if not lines:
            return
        member = gzip.compress(lines.encode("utf-8"), mtime=0)
        with open(self.path, "ab") as f:
            f.write(member)
            f.flush()
            os.fsync(f.fileno())
        self.episodes += 1
        self.trajectories += lines.count("\n")


def iter_episode_files(run_dir: str | os.PathLike[str]) -> Iterator[Path]:
    """Step files in step order."""
    files = episodes_dir(run_dir).glob("step_*.jsonl.gz")
    yield from sorted(files, key=lambda p: int(p.name.split("_")[1].split(".")[0]))


def read_step_file(path: Path) -> Iterator[Trajectory]:
    """The trajectories of one step file, skipping (with a warning) a torn last write."""
    data = path.read_bytes()
    good = check_tail(path, data)
    if good < len(data):
        log.warning("%s: ignoring a torn last write of %d bytes", path, len(data) - good)
    text = gzip.decompress(data[:good]).decode("utf-8") if good else ""
    # split on "\n" only: str.splitlines() also splits on U+2028 and friends, which JSON
    # written with ensure_ascii=False may contain inside strings.
    yield from parse_lines(text.split("\n"), path)


def read_run_trajectories(run_dir: str | os.PathLike[str]) -> Iterator[tuple[Path, Trajectory]]:
    """Every trajectory of a run directory, in step order (see `read_step_file`)."""
    for path in iter_episode_files(run_dir):
        for t in read_step_file(path):
            yield path, t
