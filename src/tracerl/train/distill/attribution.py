"""Whose failure an episode the teacher could not grade is: the evaluator's.

The teacher grades the student's tokens: it is an evaluator, like a reward function or a
judge. When it cannot score one of an episode's samples (an error, a timeout after its
retries, the step's ``tokens_per_step`` spent), the episode is marked the way a crashing
reward marks it (`tracerl.rewards.compose`): its reward record keeps its components and
total, and says ``attribution: evaluator`` with an ``error`` naming the teacher and why. The
episode is then not eligible (`RewardBreakdown.eligible`), its owner is the evaluator
(`tracerl.train.metrics.owner`: ``attribution/episodes_evaluator``, ``evaluator_error_rate``,
triage's ``evaluator`` bucket) and the whole episode stays out of the update: a receipt that
says "not eligible" never has some of its samples trained. A teacher that fails every
episode of several steps stops the run as a dead verifier does (`tracerl.train.futility`).

The episodes are on disk before the update asks the teacher (each is written as it
finishes, so a crash loses none); `rewrite_rewards` writes the new records into the step file
afterwards, atomically.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tracerl.cache import write_bytes_atomically
from tracerl.jsonl import complete_members_text, dumps
from tracerl.rollout.persist import episode_member
from tracerl.rollout.runner import Episode
from tracerl.types import Attribution, Trajectory


def teacher_error(label: str, sample: int, why: str, more: int = 0) -> str:
    """The reward's ``error`` for an episode the teacher `label` could not grade: its first
    failed sample, why, and how many other samples failed."""
    also = f" (and {more} other sample{'s' if more > 1 else ''})" if more else ""
    return f"distillation teacher {label}: sample {sample} not scored{also}: {why}"


def mark_teacher_failure(episode: Episode, error: str) -> None:
    """Make `episode` the evaluator's, as a crashing reward does: its reward (kept, with its
    components and total) says ``attribution: evaluator`` and `error`, on the episode and on
    each of its samples (the record the run directory keeps)."""
    assert episode.reward is not None, "episodes are scored before the teacher grades them"
    reward = dataclasses.replace(episode.reward, attribution=Attribution.EVALUATOR, error=error)
    episode.reward = reward
    record = reward.to_dict()
    episode.trajectories = [dataclasses.replace(t, reward=record) for t in episode.trajectories]


def mark_unscored(
    episodes: Sequence[Episode],
    row_episode: Sequence[int],
    rows: Sequence[Trajectory],
    unscored: Mapping[int, str],
    label: str,
) -> set[int]:
    """Mark the episodes of which some sample went unscored (`unscored`: row index -> why;
    `row_episode`: each row's index in `episodes`) the evaluator's; returns their indices."""
    by_episode: dict[int, list[int]] = {}
    for k in sorted(unscored):
        by_episode.setdefault(row_episode[k], []).append(k)
    for i, failed in by_episode.items():
        first = failed[0]
        error = teacher_error(label, rows[first].sample_index, unscored[first], len(failed) - 1)
        mark_teacher_failure(episodes[i], error)
    return set(by_episode)


def marked_by_update(groups: Sequence[Sequence[Episode]]) -> Callable[[], list[Episode]]:
    """Taken before an update on `groups`; called after it, the episodes the update marked
    (`mark_teacher_failure` replaced their reward): what `rewrite_rewards` writes."""
    before = [(e, e.reward) for g in groups for e in g]
    return lambda: [e for e, reward in before if e.reward is not reward]


def rewrite_rewards(path: Path, episodes: Sequence[Episode]) -> int:
    """Write `episodes`' reward records into step file `path`, where they were written when
    they finished; returns how many samples changed. Every other line is kept as it was, one
    gzip member per episode as `tracerl.rollout.persist.EpisodeWriter` writes them, and the
    file is replaced at once (a temporary file, fsynced, renamed): a crash leaves the old
    file or the new one. Call it when nothing appends to the file (after the step's
    rollouts)."""
    if not episodes or not path.exists():
        return 0
    records = {e.episode_id: e.reward.to_dict() for e in episodes if e.reward is not None}
    members: list[tuple[str, list[str]]] = []  # (episode id, its lines), in file order
    changed = 0
    for line in complete_members_text(path):
        if not line.strip():
            continue
        obj: dict[str, Any] = json.loads(line)
        eid = obj.get("episode_id") or ""
        if eid in records and obj.get("reward") != records[eid]:
            line = dumps(dataclasses.replace(Trajectory.from_dict(obj), reward=records[eid]))
            changed += 1
        if members and members[-1][0] == eid:
            members[-1][1].append(line)
        else:
            members.append((eid, [line]))
    if not changed:
        return 0
    data = b"".join(episode_member("".join(x + "\n" for x in lines)) for _, lines in members)
    write_bytes_atomically(path, data, durable=True)
    return changed
