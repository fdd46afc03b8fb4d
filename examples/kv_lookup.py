"""`kv_lookup`: answer what a key-value store holds, using a tool served over MCP.

The environment has tasks and a reward and no tool of its own: the tool comes from the MCP
server that examples/kv_lookup.yaml attaches (``env.mcp``: examples/kv_server.py over
stdio, its ``get`` only). A task asks "What is stored under k17?"; the store holds a digit
under each of 50 keys, so a model that does not call ``get`` guesses right one time in ten
at best, and on the held-out keys (k40..k49, never trained on) only the tool can tell it.

    tracerl check-env --config examples/kv_lookup.yaml
    tracerl train examples/kv_lookup.yaml
"""

from __future__ import annotations

import random
from typing import Any

from examples.kv_server import demo_data

from tracerl.envs import Action, ToolEnv
from tracerl.types import ToolCall

SPLITS = {"train": [f"k{i}" for i in range(40)], "heldout": [f"k{i}" for i in range(40, 50)]}

REWARD = """
components:
  - {name: attribution, fn: attribution_label, layer: attribution, weight: 0.0}
  - {name: looked_up, fn: looked_up, layer: constraint, weight: 0.2, gate: 1.0}
  - {name: em, fn: exact_match, layer: outcome, weight: 0.8, params: {review_f1: null}}
"""
"""An answer counts only if the episode read the task's key from the store (a guess that
happens to be right earns nothing: the gate); reading it earns 0.2, the right answer 0.8."""


class KvLookup(ToolEnv):
    name = "kv_lookup"
    version = "1.0"
    splits = tuple(SPLITS)
    reward_components = REWARD

    async def setup(self, task: dict[str, Any], seed: int) -> list[dict[str, Any]]:
        return [
            {"role": "system", "content": "Look the key up with the get tool, then answer."},
            {"role": "user", "content": f"What is stored under {task['key']}?"},
        ]

    def sample_tasks(self, n: int, *, seed: int = 0, split: str = "train") -> list[dict]:
        if split not in SPLITS:
            raise ValueError(f"kv_lookup: unknown split {split!r}; valid: {', '.join(SPLITS)}")
        rng = random.Random(f"kv_lookup:{split}:{seed}")
        values = demo_data()  # what the server's demo store holds: the gold answers
        keys = [rng.choice(SPLITS[split]) for _ in range(n)]
        return [{"id": f"kv-{k}", "key": k, "answers": [values[k]]} for k in keys]

    def looked_up(self, ctx: Any) -> Any:
        """Constraint: a ``get`` of the task's key answered by the server."""
        from tracerl.rewards.compose import Score

        reads = [
            c
            for s in ctx.steps
            for c in s.get("calls", [])
            if c["action"]["tool"] == "get" and c["action"]["args"].get("key") == ctx.task["key"]
        ]
        ok = any(c["result"]["error"] is None and not c["result"].get("is_error") for c in reads)
        return Score(float(ok), {"reads": len(reads)})

    def check_script(self, task: dict[str, Any]) -> list[Action]:
        get = ToolCall("call_0_0", "get", {"key": task["key"]})
        return [Action(text="", tool_calls=(get,)), Action(text="", answer=task["answers"][0])]
