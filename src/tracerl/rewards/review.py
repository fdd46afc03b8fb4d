"""The review pool: samples no verifier could decide wait in ``review.sqlite`` for a person.

Each sample keeps what the verifier saw (question, answer, gold answers, evidence). A
person's verdict is recorded with who gave it and when; verdicts are keyed by task and
normalised answer (`key`), so the same answer to the same question is never asked twice, and
evaluation metrics count them (``reviewed_success_rate``). Runs fill it with the episodes
their reward could not decide (`tracerl.train.review_queue`); `tracerl review RUN` lists
them and records verdicts.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracerl.rewards.qa import normalize

_SCHEMA = """
CREATE TABLE IF NOT EXISTS samples (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT UNIQUE NOT NULL,
    episode_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    question TEXT NOT NULL,
    answer TEXT NOT NULL,
    golds TEXT NOT NULL,
    evidence TEXT NOT NULL,
    created_at TEXT NOT NULL,
    verdict INTEGER,
    reviewer TEXT,
    decided_at TEXT
)
"""


@dataclass(frozen=True)
class Sample:
    id: int
    episode_id: str
    task_id: str
    question: str
    answer: str
    golds: list[str]
    evidence: dict[str, Any]
    verdict: bool | None
    reviewer: str | None


def key(task: dict[str, Any], answer: str) -> str:
    """Task id, question and golds (ids alone can repeat across imported datasets), and the
    normalised answer."""
    what = json.dumps([task.get("id"), task.get("question"), task.get("answers")])
    return f"{hashlib.sha256(what.encode()).hexdigest()[:16]}\x1f{normalize(answer)}"


class ReviewPool:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._db() as db:
            db.execute(_SCHEMA)

    def _db(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30)

    def add(
        self, *, episode_id: str, task: dict[str, Any], answer: str, evidence: dict[str, Any]
    ) -> bool:
        """Queue a sample; False if the same answer to the same task is already queued."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        with self._db() as db:
            cur = db.execute(
                "INSERT OR IGNORE INTO samples (key, episode_id, task_id, question, answer, "
                "golds, evidence, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    key(task, answer),
                    episode_id,
                    task["id"],
                    task.get("question", ""),
                    answer,
                    json.dumps(task.get("answers", [])),
                    json.dumps(evidence, default=str),
                    now,
                ),
            )
            return cur.rowcount == 1

    def samples(self, *, pending_only: bool = False) -> list[Sample]:
        query = "SELECT id, episode_id, task_id, question, answer, golds, evidence, verdict, "
        query += "reviewer FROM samples" + (" WHERE verdict IS NULL" if pending_only else "")
        with self._db() as db:
            rows = db.execute(query + " ORDER BY id").fetchall()
        return [
            Sample(
                r[0],
                r[1],
                r[2],
                r[3],
                r[4],
                json.loads(r[5]),
                json.loads(r[6]),
                None if r[7] is None else bool(r[7]),
                r[8],
            )
            for r in rows
        ]

    def decide(self, sample_id: int, correct: bool, reviewer: str) -> Sample:
        if not reviewer.strip():
            raise ValueError("a verdict needs a reviewer name (who decided)")
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        with self._db() as db:
            cur = db.execute(
                "UPDATE samples SET verdict = ?, reviewer = ?, decided_at = ? WHERE id = ?",
                (int(correct), reviewer, now, sample_id),
            )
        if cur.rowcount != 1:
            ids = [s.id for s in self.samples()]
            raise KeyError(f"no review sample {sample_id}; samples: {ids[:20]}")
        return next(s for s in self.samples() if s.id == sample_id)

    def verdicts(self) -> dict[str, bool]:
        """Every verdict given so far, by the pool's key (`key`): one read for many
        lookups."""
        with self._db() as db:
            rows = db.execute("SELECT key, verdict FROM samples WHERE verdict IS NOT NULL")
            return {k: bool(v) for k, v in rows.fetchall()}

    def verdict(self, task: dict[str, Any], answer: str) -> bool | None:
        with self._db() as db:
            row = db.execute(
                "SELECT verdict FROM samples WHERE key = ?", (key(task, answer),)
            ).fetchone()
        return None if row is None or row[0] is None else bool(row[0])
