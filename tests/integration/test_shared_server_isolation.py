"""The tau2-style leak, trained for real: one shared MCP server for the whole run, its state
keyed by ``${episode_id}`` (docs/mcp.md's recipe), a warm start, a baseline and a
warm-start evaluation, GRPO steps and the evaluations after them. Every episode must start
in an empty world of its own (tests/mcp_env.py's `VisitsTasks` checks it at each reset and
notes its visit): before episode ids were unique in a run, the warm start's reference
episodes and step 0's shared their worlds, and so did the two step-0 evaluations."""

from __future__ import annotations

import collections
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tracerl.report.run import iter_episodes

pytest.importorskip("mcp")
ROOT = Path(__file__).resolve().parents[2]


def test_every_episode_of_a_run_on_a_shared_keyed_server_has_a_world_of_its_own(tmp_path):
    worlds = tmp_path / "worlds"
    config = {
        "name": "visits",
        "model": {"spec": "tiny-chars"},
        "env": {
            "name": "tests.mcp_env:VisitsTasks",
            "parser": "json_list",
            "tasks_per_step": 3,
            "eval_tasks": 3,
            "mcp": [
                {
                    "name": "notes",
                    "command": ["python", "tests/notes_server.py", "--root", str(worlds)],
                    "scope": "worker",  # one server for the run: state only by its key
                    "annotations": {"read_*": {"readOnlyHint": True}},
                    "inject": {"*": {"db": "${episode_id}"}},
                }
            ],
        },
        "warm_start": {"tasks": 3, "epochs": 1},
        "trainer": {"steps": 2, "group_size": 2, "eval_every": 1, "checkpoint_every": 2},
        "rollout": {"budgets": {"steps": 1}, "max_turn_tokens": 8, "reserve": None},
    }
    path = tmp_path / "visits.yaml"
    path.write_text(yaml.safe_dump(config))
    cmd = [sys.executable, "-m", "tracerl", "train", str(path), f"out_dir={tmp_path}"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    records = list(iter_episodes(tmp_path / "visits"))
    phases = collections.Counter((r.phase, r.stage) for r in records)
    assert phases[("warm_start", "warm_start")] == 3 and phases[("train", "train")] == 12
    assert phases[("eval", "baseline")] == phases[("eval", "warm_start")] == 3, phases
    assert phases[("eval", "train")] == 6, phases
    errors = [
        (r.trajectories[0].episode_id, (r.trajectories[0].receipt or {}).get("error"))
        for r in records
    ]
    leaked = [(eid, why) for eid, why in errors if why]
    assert not leaked, leaked  # every reset found its world empty
    # one world per episode (and the preflight's rehearsal episode), each visited once
    names = {r.trajectories[0].episode_id.replace(":", "_") for r in records}
    assert {p.stem for p in worlds.glob("*.json")} == names | {"preflight-rehearsal"}
