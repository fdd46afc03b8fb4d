"""Reading a run directory: metric rows and episodes, nothing else.

The report, `tracerl show` and `tracerl triage` read only what the trainer wrote (see
ARCHITECTURE.md, "The run directory"), so they work on a run that is still going and on one
copied from another machine:

    metrics.jsonl                        rows {"step", "phase": train|eval|warm_start, ...}
    config.yaml                          the resolved config
    episodes/step_<n>.jsonl.gz           training episodes of step n
    eval/episodes/step_<n>.jsonl.gz      evaluations (baseline and after n RL steps)
    eval/warm_start/episodes/...         the evaluation after the warm start
    eval/[<stage>/]adversarial/episodes  the adversarial split, when configured
    warm_start/episodes/step_0.jsonl.gz  the reference agent's episodes
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from tracerl.errors import UserError
from tracerl.jsonl import complete_members_text, parse_lines
from tracerl.types import RewardBreakdown, Trajectory

METRICS_FILE = "metrics.jsonl"
LEDGER_FILE = "async_ledger.jsonl"


class RunDirError(UserError, ValueError):
    """The path is not a run directory (or the episode is not in it)."""


def metric_rows(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The rows of ``metrics.jsonl`` (a line torn by a crash, or still being written, is
    skipped)."""
    return _jsonl_rows(Path(run_dir) / METRICS_FILE)


def read_ledger(run_dir: str | os.PathLike[str]) -> dict[int, dict[str, Any]]:
    """An asynchronous run's ledger (``async_ledger.jsonl``), by step: which episodes each
    update trained on (``trained``), which it dropped as too stale (``dropped_stale``) and
    which dynamic sampling set aside without signal (``filtered``). A step redone after a
    resume keeps its last row. Empty for a synchronous run."""
    return {int(r["step"]): r for r in _jsonl_rows(Path(run_dir) / LEDGER_FILE) if "step" in r}


def _jsonl_rows(path: Path) -> list[dict[str, Any]]:
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


_EVAL_ROW = ("success_rate", "episodes")
"""The keys (``eval/<split>/<key>``) that say a row holds an evaluation of a split."""


def eval_history(run_dir: Path) -> list[dict[str, Any]]:
    """The run's evaluations in order: ``{stage, step, split, success_rate, reward_mean,
    success_rate_stderr}`` (the standard error None where the row has none: older runs;
    the success rate and mean reward None where the evaluation decided no episode: they
    are undefined, never 0)."""
    out = []
    for row in metric_rows(run_dir):
        if row.get("phase") != "eval":
            continue
        splits = dict.fromkeys(
            parts[1]
            for parts in (key.split("/") for key in row)
            if len(parts) == 3 and parts[0] == "eval" and parts[2] in _EVAL_ROW
        )
        for split in splits:
            out.append(
                {
                    "stage": row.get("stage", "train"),
                    "step": row["step"],
                    "split": split,
                    "success_rate": row.get(f"eval/{split}/success_rate"),
                    "reward_mean": row.get(f"eval/{split}/reward_mean"),
                    "success_rate_stderr": row.get(f"eval/{split}/success_rate_stderr"),
                }
            )
    return out


@dataclass
class EpisodeRecord:
    """One episode as the run directory holds it, and where it came from."""

    trajectories: list[Trajectory]
    phase: str
    """``train``, ``eval``, ``warm_start`` (the reference agent) or ``episodes`` (a run
    directory written by `tracerl eval` or `tracerl demo`)."""
    stage: str
    """For evaluations: ``baseline``, ``warm_start`` or ``train``; else the phase."""
    split: str
    step: int
    path: Path
    where_in_run: str = ""
    """The step file's path inside the run directory (``eval/episodes/step_0.jsonl.gz``)."""

    @property
    def episode_id(self) -> str:
        return self.trajectories[0].episode_id or ""

    @property
    def receipt(self) -> dict[str, Any]:
        return self.trajectories[0].receipt or {}

    @cached_property
    def reward(self) -> RewardBreakdown | None:
        d = self.trajectories[0].reward
        return RewardBreakdown.from_dict(d) if d else None

    @property
    def total(self) -> float | None:
        return None if self.reward is None else self.reward.total

    @property
    def succeeded(self) -> bool:
        return self.reward is not None and self.reward.succeeded

    @property
    def task(self) -> dict[str, Any]:
        task = self.receipt.get("task")
        return task if isinstance(task, dict) else {}

    @property
    def question(self) -> str:
        """What the episode was asked: the task's ``question``, else its ``prompt``, else
        the last user message `reset` gave the policy (an environment of one's own need not
        name its task's text the way the search environment does)."""
        for key in ("question", "prompt"):
            if self.task.get(key) not in (None, ""):
                return _message_text(self.task[key])
        for m in reversed(self.receipt.get("reset_messages") or []):
            if isinstance(m, dict) and m.get("role") == "user":
                return _message_text(m.get("content"))
        return ""

    @property
    def gold_answers(self) -> list[str]:
        """The task's ``answers`` (a single value counts as one); empty when it has none."""
        return as_strings(self.task.get("answers"))

    @property
    def stop_reason(self) -> str:
        return str(self.receipt.get("stop_reason") or "")

    @property
    def attribution(self) -> str:
        """Whose outcome this is: the receipt's owner, unless the reward code crashed (then
        the evaluator's, whatever the rollout said)."""
        if self.reward is not None and self.reward.attribution.value == "evaluator":
            return "evaluator"
        return str(self.receipt.get("attribution") or "unknown")

    @property
    def steps(self) -> list[dict[str, Any]]:
        own = [t for t in self.trajectories if not t.agent]  # a sub-agent's are its own
        by_step = {s["step"]: s for t in own for s in t.steps if "step" in s}
        return [by_step[k] for k in sorted(by_step)]

    @property
    def where(self) -> str:
        """A short label: "train step 3", "eval (warm_start) step 0", "warm start"."""
        if self.phase == "eval":
            split = "" if self.split in ("", "heldout") else f" {self.split}"
            return f"eval{split} ({self.stage}) step {self.step}"
        if self.phase == "warm_start":
            return "warm start reference"
        return f"{self.phase} step {self.step}"


def sample_origin(trajectories: list[Trajectory], i: int) -> str:
    """Why sample `i` of an episode starts where it does: the episode's (or a sub-agent's)
    first sample, or the break that closed the sample before it (a compaction, a harness
    that rewrote its history, a template that re-rendered earlier turns)."""
    t = trajectories[i]
    who = f"sub-agent {t.agent}" if t.agent else "the episode"
    before = [u for u in trajectories[:i] if u.agent == t.agent]
    if not before:
        return f"{who}: first sample"
    last = before[-1].steps[-1] if before[-1].steps else {}
    receipt = (t.receipt or {}) if t.agent else (trajectories[0].receipt or {})
    comp = next((c for c in receipt.get("compactions", []) if c.get("sample") == len(before)), None)
    if comp is not None:
        by = f", summary by {comp['summary_by']}" if comp.get("summary_by") else ""
        return (
            f"{who}: {comp['policy']} after step {comp['step']}{by}, "
            f"{comp['tokens_before']} -> {comp['tokens_after']} tokens"
        )
    if last.get("prefix_break"):
        return f"{who}: the template re-rendered earlier turns (prefix break)"
    if last.get("history_break"):
        return f"{who}: {last['history_break']}"
    return f"{who}: a new sample"


def as_strings(value: object) -> list[str]:
    """Gold answers as a list of strings: a list or tuple item by item, one value as one,
    nothing (None or "") as none."""
    if value is None or value == "":
        return []
    return [str(v) for v in value] if isinstance(value, list | tuple) else [str(value)]


def _message_text(content: Any) -> str:
    """A message's content as text: a string, or the text parts of a list of parts."""
    if isinstance(content, list):
        parts = [p.get("text") if isinstance(p, dict) else p for p in content]
        return "\n".join(str(p) for p in parts if p is not None)
    return "" if content is None else str(content)


def _origin(run_dir: Path, path: Path) -> tuple[str, str, str, int]:
    """(phase, stage, split, step) from a step file's place in the run directory."""
    step = int(path.name.split("_")[1].split(".")[0])
    parts = path.relative_to(run_dir).parts[:-2]  # drop "episodes/step_n.jsonl.gz"
    if not parts:
        return "train", "train", "train", step
    if parts[0] == "warm_start":
        return "warm_start", "warm_start", "train", step
    if parts[0] == "eval":
        rest = list(parts[1:])
        split = rest.pop() if rest and rest[-1] == "adversarial" else "heldout"
        stage = rest[0] if rest else ("baseline" if step == 0 else "train")
        return "eval", stage, split, step
    return "episodes", parts[0], parts[0], step


EPISODE_FOLDERS = ("eval", "warm_start")
"""The folders of a run directory whose ``episodes/`` (at any depth) hold episodes besides
its own ``episodes/``: nothing else under it is read (another run copied inside, a
report's pages)."""


def step_files(run_dir: str | os.PathLike[str]) -> list[Path]:
    """Every episode file of the run, training steps first (in step order), then the rest:
    ``episodes/``, and the ``episodes/`` folders under ``eval/`` and ``warm_start/``."""
    root = Path(run_dir)
    files = list((root / "episodes").glob("step_*.jsonl.gz"))
    for folder in EPISODE_FOLDERS:
        files += [
            p for p in (root / folder).rglob("step_*.jsonl.gz") if p.parent.name == "episodes"
        ]

    def key(p: Path) -> tuple[int, str, int]:
        phase, _, _, step = _origin(root, p)
        return (0 if phase == "train" else 1, str(p.parent), step)

    return sorted(files, key=key)


def _read(path: Path) -> list[Trajectory]:
    """One step file's trajectories; a torn last write (a crash, or a write in progress)
    is ignored."""
    return list(parse_lines(complete_members_text(path), path))


def iter_episodes(
    run_dir: str | os.PathLike[str], rows: list[dict[str, Any]] | None = None
) -> Iterator[EpisodeRecord]:
    """Every episode of the run directory (see `step_files` for the order). `rows`: its
    metric rows, when the caller has read them already."""
    root = Path(run_dir)
    evaluation = evaluation_only(metric_rows(root) if rows is None else rows)
    for path in step_files(root):
        phase, stage, split, step = _origin(root, path)
        rel = path.relative_to(root).as_posix()
        by_id: dict[str, list[Trajectory]] = {}
        for t in _read(path):
            by_id.setdefault(t.episode_id or "", []).append(t)
        for trajs in by_id.values():
            trajs.sort(key=lambda t: t.sample_index)
            where = (phase, stage, split)
            if evaluation and phase == "train":  # `tracerl eval` writes episodes/ too
                task = (trajs[0].receipt or {}).get("task") or {}
                where = ("eval", "eval", str(task.get("split", "eval")))
            yield EpisodeRecord(trajs, *where, step, path, rel)


def evaluation_only(rows: list[dict[str, Any]]) -> bool:
    """Metric rows written by `tracerl eval`: one per split, no training phase."""
    return bool(rows) and all("phase" not in r and "split" in r for r in rows)


def find_episode(run_dir: str | os.PathLike[str], episode: str) -> EpisodeRecord:
    """An episode by id, replay id (``ro_...``) or a unique prefix of either."""
    episodes = list(iter_episodes(run_dir))  # the run is read once
    matches = [e for e in episodes if episode in (e.episode_id, e.receipt.get("replay_id"))]
    if not matches:
        matches = [
            e
            for e in episodes
            if e.episode_id.startswith(episode)
            or str(e.receipt.get("replay_id", "")).startswith(episode)
        ]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        some = list(dict.fromkeys(e.episode_id for e in episodes))[:5]
        raise RunDirError(
            f"{run_dir}: no episode {episode!r}; episodes include: "
            f"{', '.join(some) or 'none (is this a run directory?)'} (all of them: "
            f"`tracerl triage {run_dir}`, or the report's episode links)"
        )
    names = ", ".join(f"{m.episode_id} ({m.where})" for m in matches[:5])
    raise RunDirError(
        f"{run_dir}: {len(matches)} episodes match {episode!r} (e.g. {names}); "
        "give its replay id (ro_...), shown on its page and by `tracerl show`"
    )


def is_run_dir(path: str | os.PathLike[str]) -> bool:
    """A run directory: ``metrics.jsonl``, or episodes where a run keeps them (`step_files`),
    in the folder itself. A folder holding runs is not one."""
    root = Path(path)
    return (root / METRICS_FILE).is_file() or bool(step_files(root))


def runs_below(path: str | os.PathLike[str], depth: int = 3, most: int = 2000) -> list[Path]:
    """The run directories under `path` (not inside one another), `depth` folders down and
    `most` folders looked at, at most (a suggestion, not a search of a home folder); in name
    order."""
    found: list[Path] = []
    level, seen = [Path(path)], 0
    for _ in range(depth):
        below = []
        for folder in level:
            try:
                subs = sorted(p for p in folder.iterdir() if p.is_dir() and p.name[0] != ".")
            except OSError:  # unreadable: nothing to suggest from it
                continue
            for sub in subs[: max(0, most - seen)]:
                seen += 1
                (found if is_run_dir(sub) else below).append(sub)
        level = below
    return sorted(found)


def check_run_dir(run_dir: str | os.PathLike[str]) -> Path:
    """`run_dir` when it is a run directory (`is_run_dir`); else a `RunDirError` saying what
    a run directory holds, and naming the runs below it when it holds some."""
    root = Path(run_dir)
    if not root.is_dir():
        raise RunDirError(f"{root}: no such directory; pass a run directory such as runs/<name>")
    if is_run_dir(root):
        return root
    if (root / "config.yaml").is_file():  # started, stopped before its first record
        raise RunDirError(
            f"{root}: the run has recorded nothing yet (a config.yaml, but no metrics.jsonl "
            "or episodes/)",
            "train it (`tracerl train`), or wait for its first step",
        )
    runs = runs_below(root)
    if runs:
        named = ", ".join(str(p) for p in runs[:3])
        more = f" and {len(runs) - 3} more" if len(runs) > 3 else ""
        hint = f"it holds {len(runs)} run{'s' * (len(runs) > 1)} ({named}{more}): pass one"
    else:
        hint = "pass a folder written by `tracerl train`, `tracerl eval` or `tracerl demo`"
    raise RunDirError(
        f"{root}: not a run directory (one has metrics.jsonl, config.yaml and episodes/ in it)",
        hint,
    )


@dataclass
class RunData:
    """A run directory read whole: its metric rows by phase, its episodes, its config."""

    run_dir: Path
    train: list[dict[str, Any]]
    evals: list[dict[str, Any]]
    other: list[dict[str, Any]]
    episodes: list[EpisodeRecord]
    config: dict[str, Any] = field(default_factory=dict)
    ledger: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Asynchronous runs: `read_ledger`."""

    @classmethod
    def load(cls, run_dir: str | os.PathLike[str]) -> RunData:
        root = check_run_dir(run_dir)
        rows = metric_rows(root)
        by_step: dict[int, dict[str, Any]] = {}
        for r in rows:  # a resumed run may repeat a step: its last row stands
            if r.get("phase") == "train":
                by_step[int(r.get("step", 0))] = r
        cfg_path = root / "config.yaml"
        config = yaml.safe_load(cfg_path.read_text()) if cfg_path.exists() else {}
        return cls(
            root,
            [by_step[k] for k in sorted(by_step)],
            [r for r in rows if r.get("phase") == "eval" or "split" in r],
            [r for r in rows if r.get("phase") not in ("train", "eval") and "split" not in r],
            list(iter_episodes(root, rows)),
            config if isinstance(config, dict) else {},
            read_ledger(root),
        )

    def train_points(self, key: str, scale: float = 1.0) -> list[tuple[float, float]]:
        return [(float(r["step"]), float(r[key]) * scale) for r in self.train if key in r]

    def eval_keys(self, test: Callable[[list[str]], bool]) -> list[str]:
        keys = dict.fromkeys(k for r in self.evals for k in r if test(k.split("/")))
        return list(keys)

    def eval_points(
        self, key: str, scale: float = 1.0
    ) -> tuple[list[tuple[float, float]], list[str]]:
        """The evaluations' values of `key`, and each one's stage (for hover labels)."""
        rows = [r for r in self.evals if key in r]
        pts = [(self.eval_x(r), float(r[key]) * scale) for r in rows]
        return pts, [str(r.get("stage", r.get("split", ""))) for r in rows]

    @property
    def warm_started(self) -> bool:
        return any(r.get("stage") == "warm_start" for r in self.evals)

    def eval_x(self, row: dict[str, Any]) -> float:
        """Where an evaluation sits on the step axis. With a warm start, the baseline (the
        model as loaded, before the warm start) sits at -1, so it never hides under the
        warm start's evaluation at step 0."""
        step = float(row.get("step", 0))
        return step - 1 if row.get("stage") == "baseline" and self.warm_started else step

    def last_eval(self, split: str = "heldout") -> dict[str, Any]:
        # an evaluation that decided nothing has no success_rate (undefined), but episodes
        rows = [r for r in self.evals if {f"eval/{split}/{k}" for k in _EVAL_ROW} & r.keys()]
        return rows[-1] if rows else {}

    @property
    def eval_split(self) -> str:
        return str((self.config.get("env") or {}).get("eval_split", "heldout"))
