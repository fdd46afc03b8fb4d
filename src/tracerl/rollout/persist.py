"""The run directory's episode files, written so that nothing written is ever lost.

`EpisodeWriter` appends each finished episode to ``episodes/step_<n>.jsonl.gz`` as its own
gzip member, flushed and fsynced before `append` returns: a crash can lose only the episodes
still in flight, never one already written. A crash *during* an append leaves a torn last
member; opening the file for writing again cuts it off (that episode was not written), and
readers stop at the last complete member with a warning rather than failing the whole file.
"""

from __future__ import annotations

import gzip
import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from tracerl.jsonl import check_tail, complete_members_text, dumps, parse_lines
from tracerl.types import Trajectory

log = logging.getLogger("tracerl")


def episodes_dir(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / "episodes"


def step_file(run_dir: str | os.PathLike[str], step: int) -> Path:
    return episodes_dir(run_dir) / f"step_{step}.jsonl.gz"


def episode_member(lines: str) -> bytes:
    """One episode's lines (its trajectories, JSON, newline-ended) as the gzip member a step
    file holds per episode."""
    return gzip.compress(lines.encode("utf-8"), mtime=0)


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
        with open(self.path, "ab") as f:
            f.write(episode_member(lines))
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
    yield from parse_lines(complete_members_text(path), path)


def read_run_trajectories(run_dir: str | os.PathLike[str]) -> Iterator[tuple[Path, Trajectory]]:
    """Every trajectory of a run directory, in step order (see `read_step_file`)."""
    for path in iter_episode_files(run_dir):
        for t in read_step_file(path):
            yield path, t


def done_episodes(run_dir: str | os.PathLike[str], step: int) -> dict[str, Any]:
    """The episodes already in step `step`'s file, by id (after a crash: reused, not re-run).
    Reads that one file only, not the whole run."""
    from tracerl.rollout.episode import episode_from_trajectories

    path = step_file(run_dir, step)
    if not path.exists():
        return {}
    by_id: dict[str, list[Trajectory]] = {}
    for t in read_step_file(path):
        if t.episode_id:
            by_id.setdefault(t.episode_id, []).append(t)
    return {k: episode_from_trajectories(v) for k, v in by_id.items()}
