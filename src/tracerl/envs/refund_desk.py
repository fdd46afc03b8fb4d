"""`refund_desk`: a small write-action environment.

A support agent handles one refund request: it can look up the order and the refund policy
(read tools) and issue a refund (a write tool, governed by permission rules). It exercises
what matters for write tasks: the write budget, the side-effect guard (training and
evaluation refund nothing for real: `issue_refund` runs as a dry run and the intended refund
is recorded in the step) and the terminal reserve (a commit must still fit in the budget).

The rules (also what `get_refund_policy` tells the model):

* an order is refundable within 30 days of delivery, once, up to its total;
* a support ``agent`` may refund at most $100; a ``supervisor`` at most $1000;
* otherwise the agent declines (or escalates) in its final answer.

Orders are generated from a fixed seed, so every task and every answer is reproducible.
"""

from __future__ import annotations

import json
import random
from typing import Any

from tracerl.envs.base import Message, StepResult, ToolEnv
from tracerl.envs.parsers import Action
from tracerl.envs.tools import PolicyError, ToolResult, tool
from tracerl.types import FaultKind, ToolCall

POLICY_VERSION = "2026-01"
ROLE_LIMITS = {"agent": 100.0, "supervisor": 1000.0}
REFUND_WINDOW_DAYS = 30
_NAMES = ["Ada", "Bo", "Chen", "Dana", "Eli", "Fatima", "Goran", "Hana", "Ivo", "Jun"]
_ITEMS = ["headphones", "kettle", "desk lamp", "backpack", "monitor", "blender", "jacket"]


def _catalog(n: int = 60, seed: int = 2026) -> dict[str, dict[str, Any]]:
    rng = random.Random(seed)
    orders = {}
    for i in range(n):
        oid = f"A{1001 + i}"
        orders[oid] = {
            "order_id": oid,
            "customer": rng.choice(_NAMES),
            "item": rng.choice(_ITEMS),
            "total": rng.choice([19.99, 35.0, 45.0, 60.0, 89.5, 99.0, 120.0, 240.0, 640.0, 1500.0]),
            "status": rng.choice(["delivered"] * 5 + ["shipped", "refunded"]),
            "days_since_delivery": rng.randint(1, 40),
        }
    return orders


ORDERS = _catalog()


def decide(order: dict[str, Any], amount: float, role: str) -> tuple[bool, str]:
    """The refund rules: (allowed, why)."""
    if order["status"] == "refunded":
        return False, f"order {order['order_id']} was already refunded"
    if order["status"] != "delivered":
        return False, f"order {order['order_id']} is not delivered yet"
    if order["days_since_delivery"] > REFUND_WINDOW_DAYS:
        return False, (
            f"order {order['order_id']} was delivered {order['days_since_delivery']} days ago; "
            f"the refund window is {REFUND_WINDOW_DAYS} days"
        )
    if amount > order["total"]:
        return False, f"${amount:.2f} exceeds the order total ${order['total']:.2f}"
    if amount > ROLE_LIMITS[role]:
        return False, f"a {role} may refund at most ${ROLE_LIMITS[role]:.0f}; escalate instead"
    return True, "allowed"


class RefundDesk(ToolEnv):
    name = "refund_desk"
    version = "1.0"
    splits = ("train", "test")

    def __init__(self, *, side_effect_guard: str = "dry_run") -> None:
        super().__init__(side_effect_guard=side_effect_guard)
        self.refunds: dict[str, float] = {}  # real state: refunds actually issued
        self._seen: set[str] = set()

    # ---- tools ---------------------------------------------------------------------------
    @tool(effect="read", timeout_s=5.0, version="1")
    def lookup_order(self, order_id: str) -> Any:
        """Look up an order: customer, item, total, status and days since delivery.

        Args:
            order_id: the order id, e.g. "A1001".
        """
        order = ORDERS.get(order_id.strip())
        if order is None:
            return _result(f"no order with id {order_id!r}", gain=0.0)
        first = order_id == self.task.get("order_id") and self._first("lookup")
        status = "refunded" if order_id in self.refunds else order["status"]
        return _result(json.dumps({**order, "status": status}), gain=0.5 if first else 0.0)

    @tool(effect="read", timeout_s=5.0, version="1")
    def get_refund_policy(self) -> Any:
        """Read the refund policy: eligibility window and per-role refund limits."""
        text = (
            f"Refund policy {POLICY_VERSION}: orders can be refunded once, within "
            f"{REFUND_WINDOW_DAYS} days of delivery, up to the order total. A support agent "
            f"may refund at most ${ROLE_LIMITS['agent']:.0f}; a supervisor at most "
            f"${ROLE_LIMITS['supervisor']:.0f}. Otherwise decline or escalate."
        )
        return _result(text, gain=0.5 if self._first("policy") else 0.0)

    @tool(effect="write", timeout_s=5.0, version="1")
    def issue_refund(self, order_id: str, amount: float, dry_run: bool = False) -> Any:
        """Issue a refund to the customer's original payment method.

        Args:
            order_id: the order to refund.
            amount: the amount in dollars, at most the order total.
        """
        order = ORDERS.get(order_id.strip())
        if order is None:
            raise PolicyError(f"no order with id {order_id!r}", FaultKind.INVALID_ARGUMENTS)
        if amount <= 0:
            raise PolicyError("amount must be positive", FaultKind.INVALID_ARGUMENTS)
        if order_id in self.refunds:
            raise PolicyError(f"order {order_id} was already refunded")
        allowed, why = decide(order, amount, self.task.get("role", "agent"))
        if not allowed:
            raise PolicyError(f"refund refused: {why}")
        refund_id = f"R-{self.rng.randrange(16**6):06x}"
        effect = {"refund": {"order_id": order_id, "amount": round(amount, 2), "id": refund_id}}
        if not dry_run:
            self.refunds[order_id] = round(amount, 2)
        # The model sees the same confirmation either way: a dry run must look like the real
        # thing to the policy, or training would teach behaviour for a different world.
        return _result(
            f"refund {refund_id} issued: ${amount:.2f} to order {order_id}", effect=effect
        )

    def _first(self, what: str) -> bool:
        new = what not in self._seen
        self._seen.add(what)
        return new

    # ---- episode -------------------------------------------------------------------------
    async def setup(self, task: dict[str, Any], seed: int) -> list[Message]:
        self._seen = set()
        return [
            {
                "role": "system",
                "content": f"You are a customer-support {task['role']} for an online shop. Use "
                "the tools to check facts before acting. Issue a refund only if the policy and "
                "your permissions allow it; otherwise explain why in your final answer.",
            },
            {"role": "user", "content": task["prompt"]},
        ]

    async def finish(self, action: Action) -> StepResult:
        self.done = True
        return StepResult([], terminated=True, info={"answer": action.answer})

    def snapshot(self) -> Any:
        return dict(self.refunds)

    def sample_tasks(self, n: int, *, seed: int = 0, split: str = "train") -> list[dict[str, Any]]:
        """Train tasks use odd-numbered orders, test tasks even ones."""
        parity = {"train": 1, "test": 0}.get(split)
        if parity is None:
            raise ValueError(f"refund_desk: split must be 'train' or 'test', got {split!r}")
        ids = [oid for oid in ORDERS if int(oid[1:]) % 2 == parity]
        rng = random.Random(seed)
        return [_task(ORDERS[rng.choice(ids)], rng) for _ in range(n)]

    def check_script(self, task: dict[str, Any]) -> list[Action]:
        oid = task["order_id"]
        calls = [
            ToolCall("call_0_0", "lookup_order", {"order_id": oid}),
            ToolCall("call_0_1", "get_refund_policy", {}),
        ]
        refund = ToolCall("call_1_0", "issue_refund", {"order_id": oid, "amount": 1.0})
        return [
            Action(text="", tool_calls=tuple(calls)),
            Action(text="", tool_calls=(refund,)),
            Action(text="done", answer="done"),
        ]


def reference_plan(task: dict[str, Any]) -> list[tuple[str, Any]]:
    """What a careful agent does on a task: ``("calls", [(tool, args), ...])`` and
    ``("answer", text)`` steps, independent of any model's call format (demo, baselines)."""
    oid, amount = task["order_id"], task["amount"]
    plan: list[tuple[str, Any]] = [
        ("calls", [("lookup_order", {"order_id": oid}), ("get_refund_policy", {})])
    ]
    if task["expected"]["action"] == "refund":
        plan.append(("calls", [("issue_refund", {"order_id": oid, "amount": amount})]))
        plan.append(("answer", f"Done: ${amount:.2f} is refunded for order {oid}."))
    else:
        plan.append(("answer", f"Sorry, I cannot refund this: {task['expected']['why']}."))
    return plan


def _task(order: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    role = rng.choice(["agent", "supervisor"])
    amount = order["total"] if rng.random() < 0.8 else round(order["total"] / 2, 2)
    allowed, why = decide(order, amount, role)
    return {
        "id": f"refund-{order['order_id']}-{role}-{amount:g}",
        "effect": "write",
        "order_id": order["order_id"],
        "role": role,
        "amount": amount,
        "prompt": f"Hi, I'm {order['customer']}. Please refund ${amount:.2f} for my "
        f"{order['item']} (order {order['order_id']}).",
        "expected": {"action": "refund" if allowed else "decline", "why": why},
    }


def _result(content: str, *, gain: float | None = None, effect: Any = None) -> ToolResult:
    return ToolResult(content, evidence=None if gain is None else {"gain": gain}, effect=effect)
