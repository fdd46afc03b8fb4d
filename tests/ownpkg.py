"""A throwaway user package, written to a temporary folder: a unit-conversion environment with
one tool and a data file, and a 1%-tolerance verifier written as a plain function.

`write_package(root)` writes ``root/site/unitpkg/`` and, beside it, the ``dist-info`` that
installed packages have (entry points ``tracerl.envs: unitconv`` and ``tracerl.rewards:
unit_tolerance``): with ``root/site`` on ``PYTHONPATH`` the package is installed as far as
`importlib.metadata` can tell, without pip or a venv.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ENVS = '''
"""Unit conversion: one tool (the conversion factor), tasks from a JSONL file."""

from __future__ import annotations

import random
from typing import Any

from tracerl.envs import Action, ToolEnv, tool
from tracerl.envs.base import Message, StepResult
from tracerl.envs.datasets import read_tasks
from tracerl.types import ToolCall

FACTORS = {("km", "m"): 1000.0, ("m", "cm"): 100.0, ("kg", "g"): 1000.0, ("h", "min"): 60.0}


class UnitConv(ToolEnv):
    name = "unitconv"
    version = "0.1"
    splits = ("train", "test")

    def __init__(self, *, data: str | None = None, side_effect_guard: str = "dry_run") -> None:
        super().__init__(side_effect_guard=side_effect_guard)
        required = ("id", "split", "value", "from_unit", "to_unit", "expected")
        self.rows = read_tasks(data, required=required) if data else None

    @tool(effect="read", timeout_s=5.0, version="1")
    def conversion_factor(self, from_unit: str, to_unit: str) -> str:
        """How many `to_unit` make one `from_unit`.

        Args:
            from_unit: the unit to convert from, e.g. "km".
            to_unit: the unit to convert to, e.g. "m".
        """
        factor = FACTORS.get((from_unit.strip(), to_unit.strip()))
        return f"1 {from_unit} = {factor:g} {to_unit}" if factor else "unknown unit pair"

    async def setup(self, task: dict[str, Any], seed: int) -> list[Message]:
        q = f"Convert {task['value']:g} {task['from_unit']} to {task['to_unit']}."
        return [{"role": "user", "content": q + " Answer with the number only."}]

    async def finish(self, action: Action) -> StepResult:
        self.answer = {"text": action.answer or ""}
        return StepResult([], terminated=True, info={"answer": self.answer})

    def sample_tasks(self, n: int, *, seed: int = 0, split: str = "train") -> list[dict]:
        if split not in self.splits:
            raise ValueError(f"unitconv: no split {split!r}")
        if self.rows is not None:
            pool = [r for r in self.rows if r["split"] == split]
        else:
            pairs = sorted(FACTORS)
            values = range(1, 40) if split == "train" else range(40, 60)
            pool = [
                {"id": f"{split}-{v}-{a}-{b}", "split": split, "value": float(v),
                 "from_unit": a, "to_unit": b, "expected": v * FACTORS[(a, b)]}
                for v in values for a, b in pairs
            ]
        return random.Random(f"{split}:{seed}").sample(pool, min(n, len(pool)))

    def check_script(self, task: dict[str, Any]) -> list[Action]:
        call = ToolCall("call_0_0", "conversion_factor",
                        {"from_unit": task["from_unit"], "to_unit": task["to_unit"]})
        answer = f"{task['expected']:g}"
        return [Action(text="", tool_calls=(call,)), Action(text=answer, answer=answer)]
'''

REWARDS = '''
"""A verifier the user already had: a plain function, named arguments, a number back."""


def within_tolerance(completion: str, expected: float, tolerance: float = 0.01):
    """1.0 when the answer is within `tolerance` (relative) of `expected`, else 0.0."""
    try:
        got = float(completion.strip().split()[0].replace(",", ""))
    except (ValueError, IndexError):
        return 0.0, {"answer": completion[:40], "expected": expected, "why": "not a number"}
    ok = abs(got - expected) <= tolerance * abs(expected)
    return float(ok), {"answer": got, "expected": expected}


def needs_gold(completion: str, gold: str) -> float:
    """Asks for a field the tasks do not have."""
    return float(completion == gold)
'''

ENTRY_POINTS = """
[tracerl.envs]
unitconv = unitpkg.envs:UnitConv

[tracerl.rewards]
unit_tolerance = unitpkg.rewards:within_tolerance
"""


def write_package(root: Path, *, dist_info: bool = True) -> Path:
    """The package under ``root/site`` (returned); with `dist_info`, installed-looking."""
    site = root / "site"
    pkg = site / "unitpkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "envs.py").write_text(textwrap.dedent(ENVS))
    (pkg / "rewards.py").write_text(textwrap.dedent(REWARDS))
    if dist_info:
        info = site / "unitpkg-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: unitpkg\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(ENTRY_POINTS)
    return site


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


TINY_RUN = [
    "model.spec=tiny-random",
    "trainer.steps=2",
    "trainer.group_size=2",
    "env.tasks_per_step=2",
    "env.eval_tasks=2",
    "rollout.max_turn_tokens=16",
    "rollout.budgets.steps=2",
    "model.max_batch_size=8",
]


def tracerl(*args: str, cwd: Path, pythonpath: Path | None = None, timeout: float = 600):
    """The real `tracerl` command (this venv's), as a user runs it."""
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    else:
        env.pop("PYTHONPATH", None)
    exe = Path(sys.executable).with_name("tracerl")
    return subprocess.run(
        [str(exe), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
