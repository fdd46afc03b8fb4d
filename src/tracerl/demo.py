"""`make demo`: what exists today, end to end, on the real model.

This demo simplifies on purpose: one hand-written calculator tool, a few lines of call
parsing local to this file (the real action parsers belong to the environment layer), and a
sequential sampler. What it does *not* simplify is provenance: every token of the episodes it
writes is attributed when it is produced, and the file it writes is read back and compared.
"""

from __future__ import annotations

import ast
import json
import operator
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from tracerl.jsonl import read_trajectories, write_trajectories
from tracerl.models import load
from tracerl.models.conversation import Conversation
from tracerl.report.terminal import print_trajectory, trajectory_summary
from tracerl.rollout.sampler import HFSampler, SampleResult
from tracerl.types import Source, ToolCall, Trajectory

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression such as '17 * 23'.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "the expression"}},
            "required": ["expression"],
        },
    },
}
TASKS = ["What is 17 * 23? Use the calculator tool.", "Compute 1234 + 4321 with a tool call."]
_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
}


def calculate(expression: str) -> str:
    """Arithmetic only: numbers and + - * /. Anything else is an error value, not a crash."""

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError("only numbers and + - * / are allowed")

    try:
        return str(ev(ast.parse(expression, mode="eval").body))
    except (SyntaxError, ValueError, ZeroDivisionError) as e:
        return f"error: {e}"


def parse_calls(text: str, step: int) -> list[ToolCall]:
    """Demo-only parser for SmolLM2's ``<tool_call>[{...}]</tool_call>`` form."""
    start, end = text.find("<tool_call>"), text.find("</tool_call>")
    if start < 0 or end < start:
        return []
    raw = text[start + len("<tool_call>") : end]
    try:
        items = json.loads(raw)
    except json.JSONDecodeError:
        return []
    items = items if isinstance(items, list) else [items]
    calls = []
    for i, item in enumerate(items):
        if isinstance(item, dict) and isinstance(item.get("arguments"), dict):
            name = str(item.get("name"))
            calls.append(ToolCall(f"call_{step}_{i}", name, item["arguments"], raw=raw))
    return calls


def run_episode(bundle: Any, sampler: HFSampler, task: str, episode_id: str) -> list[Trajectory]:
    conv: Conversation = bundle.renderer.start(
        [{"role": "user", "content": task}], tools=[CALCULATOR], episode_id=episode_id
    )
    sampled: list[SampleResult] = []
    for step in range(2):
        res = sampler.generate(
            conv.token_ids, max_tokens=64, stop_token_ids=bundle.renderer.stop_token_ids
        )
        sampled.append(res)
        text = bundle.renderer.decode(res.token_ids)
        calls = parse_calls(text, step)
        conv.add_policy(
            res.token_ids,
            res.logprobs,
            finish_reason=res.finish_reason,
            tool_calls=calls,
            policy_version=res.policy_version,
        )
        if step == 1:
            break
        if calls:
            # This tool framework echoes the call before its result; the renderer marks that
            # echo so the action is never counted twice.
            conv.add_observation(
                [
                    {
                        "role": "tool",
                        "tool_call_id": c.id,
                        "content": f"{c.raw}\n=> {calculate(str(c.arguments.get('expression')))}",
                        "echo": c.raw,
                    }
                    for c in calls
                ]
            )
        else:
            conv.add_observation(
                [{"role": "user", "content": "No tool call found. Give the final answer."}]
            )
    _check_provenance(conv, sampled)
    return conv.samples()


def _check_provenance(conv: Conversation, sampled: list[SampleResult]) -> None:
    """The invariants a user should be able to rely on, checked on the real episode."""
    policy = [s for t in conv.samples() for s in t.segments if s.source is Source.POLICY]
    assert [list(s.token_ids) for s in policy] == [r.token_ids for r in sampled]
    for t in conv.samples():
        assert sum(t.loss_mask) == sum(len(s.token_ids) for s in t.policy_segments())


def main(out_dir: str = "runs/demo", console: Console | None = None) -> Path:
    console = console or Console()
    console.rule("[bold]tracerl demo")
    t0 = time.perf_counter()
    bundle = load("smollm2-135m-instruct")
    how = "converted from the GGUF and cached" if bundle.origin == "gguf" else "from the cache"
    console.print(f"loaded {bundle.model_id} {how} in {bundle.load_seconds:.1f} s")
    sampler = HFSampler(bundle.model, temperature=0.7, seed=7)
    trajectories: list[Trajectory] = []
    for i, task in enumerate(TASKS):
        console.rule(f"episode {i}: {task}")
        for traj in run_episode(bundle, sampler, task, episode_id=f"demo-{i}"):
            print_trajectory(traj, console)
            trajectories.append(traj)
    path = Path(out_dir) / "episodes" / "step_0.jsonl.gz"
    write_trajectories(path, trajectories)
    back = read_trajectories(path)
    same = back == trajectories and all(
        a.token_ids == b.token_ids and a.logprobs == b.logprobs
        for a, b in zip(back, trajectories, strict=True)
    )
    console.rule("summary")
    for traj in trajectories:
        console.print(traj.episode_id, trajectory_summary(traj))
    console.print(
        f"wrote {len(trajectories)} trajectories to {path}; read back bit-for-bit: {same}; "
        f"total {time.perf_counter() - t0:.1f} s"
    )
    if not same:
        raise SystemExit("round trip through JSONL changed the trajectories")
    return path
