"""A tool environment with no tools of its own, for MCP tests: its tools come from the
servers a config attaches (``env.mcp``). Its one task reads and writes a key-value store;
`NotesTasks` and `OrdersTasks` are tasks for tests/notes_server.py and tests/orders_server.py."""

from __future__ import annotations

from typing import Any

from tracerl.envs import Action, Env, StepResult, ToolEnv
from tracerl.types import ToolCall


class KvTasks(ToolEnv):
    name = "kv_tasks"
    version = "1"
    splits = ("train",)

    def __init__(
        self,
        *,
        effect: str = "write",
        allow_real_writes: bool = False,
        side_effect_guard: str = "dry_run",
    ) -> None:
        super().__init__(side_effect_guard=side_effect_guard)
        self.effect, self.allow = effect, allow_real_writes

    async def setup(self, task: dict[str, Any], seed: int) -> list[dict[str, Any]]:
        return [{"role": "user", "content": task["prompt"]}]

    def sample_tasks(self, n: int, *, seed: int = 0, split: str = "train") -> list[dict]:
        task = {
            "id": f"kv-{self.effect}",
            "prompt": "What color is stored? Then store red.",
            "effect": self.effect,
            "allow_real_writes": self.allow,
        }
        return [dict(task) for _ in range(n)]


class PlainEnv(Env):
    """An environment that runs its own `step` (not a ToolEnv): MCP servers cannot attach."""

    name = "plain"
    version = "1"

    async def reset(self, task: dict[str, Any], seed: int) -> list[dict[str, Any]]:
        return [{"role": "user", "content": "hi"}]

    async def step(self, action: Any) -> StepResult:
        return StepResult([], terminated=True)

    def sample_tasks(self, n: int, *, seed: int = 0, split: str = "train") -> list[dict]:
        return [{"id": f"plain-{i}"} for i in range(n)]


class NotesTasks(ToolEnv):
    """Tasks for the notes server (tests/notes_server.py): store a code in your notes. The
    reward reads the server's final state (its ``final_state`` calls, in the receipt): the
    episode succeeded when the code is in the database the episode wrote to."""

    name = "notes_tasks"
    version = "1"
    splits = ("train",)

    async def setup(self, task: dict[str, Any], seed: int) -> list[dict[str, Any]]:
        return [{"role": "user", "content": f"Store the code {task['code']} in your notes."}]

    def sample_tasks(self, n: int, *, seed: int = 0, split: str = "train") -> list[dict]:
        return [{"id": "remember", "code": "4711", "effect": "write"} for _ in range(n)]

    def reward(self, ctx: Any) -> float:
        import json

        state = json.loads(ctx.final_state["notes"]["dump"])
        return 1.0 if ctx.task["code"] in state["notes"] else 0.0


ORDERS = [{"id": "A1", "status": "pending"}, {"id": "A2", "status": "shipped"}]


class OrdersTasks(ToolEnv):
    """tau2-bench-style tasks for the orders server (tests/orders_server.py, shared by the
    episodes and keyed by an injected ``state_key``): at reset the environment loads the
    episode's world into the server (tau2's initialization actions), and the task asks for an
    order's status, which the model reads with ``list_orders`` or ``get_order``."""

    name = "orders_tasks"
    version = "1"
    splits = ("train",)

    async def setup(self, task: dict[str, Any], seed: int) -> list[dict[str, Any]]:
        (box,) = self.toolboxes  # the orders server: this episode's world, under its key
        loaded = await box.call(
            "load_orders", {"orders": ORDERS, **box.injected("load_orders")}, 30
        )
        if loaded.is_error:
            raise RuntimeError(f"the orders server did not load the world: {loaded.content}")
        return [{"role": "user", "content": f"What is the status of order {task['order_id']}?"}]

    def sample_tasks(self, n: int, *, seed: int = 0, split: str = "train") -> list[dict]:
        return [
            {"id": f"order-{o['id']}", "order_id": o["id"], "status": o["status"]}
            for o in (ORDERS[i % len(ORDERS)] for i in range(seed, seed + n))
        ]

    def check_script(self, task: dict[str, Any]) -> list[Action]:
        look = ToolCall("call_0_0", "list_orders", {})
        return [Action(text="", tool_calls=(look,)), Action(text="", answer=task["status"])]

    def reward(self, ctx: Any) -> float:
        return 1.0 if ctx.answer_text.strip() == ctx.task["status"] else 0.0


class VisitsTasks(ToolEnv):
    """Isolation, checked at every reset: each episode's world (the notes server's database
    under the key the run injects, shared by every episode: tests/notes_server.py) must be
    empty when it starts; the episode then notes its visit there. A reset that finds a note
    is in another episode's world: it fails, naming what it found. The same few tasks in
    every split and phase, first to last, so the phases of a run draw them at the same
    positions with the same seeds (where episode ids used to repeat)."""

    name = "visits"
    version = "1"
    splits = ("train", "heldout")
    WORDS = ("amber", "birch", "cedar")

    async def setup(self, task: dict[str, Any], seed: int) -> list[dict[str, Any]]:
        (box,) = self.toolboxes
        from tracerl.envs.mcp.schema import result_text

        seen = await box.call("read_notes", box.injected("read_notes"), 30)
        text, _ = result_text(seen, 10_000)
        if seen.is_error or text.strip() != "(no notes)":
            raise RuntimeError(f"this episode's world is another's: it holds {text!r}")
        wrote = await box.call("write_note", {"text": "visited", **box.injected("write_note")}, 30)
        if wrote.is_error:
            raise RuntimeError(f"the notes server did not note the visit: {wrote.content}")
        return [{"role": "user", "content": f"Answer with the word {task['word']}."}]

    def sample_tasks(self, n: int, *, seed: int = 0, split: str = "train") -> list[dict]:
        return [
            {"id": f"{split}-{w}", "word": w} for w in (self.WORDS * n)[: min(n, len(self.WORDS))]
        ]

    def check_script(self, task: dict[str, Any]) -> list[Action]:
        return [Action(text=task["word"], answer=task["word"])]

    def reward(self, ctx: Any) -> float:
        return 1.0 if ctx.answer_text.strip() == ctx.task["word"] else 0.0
