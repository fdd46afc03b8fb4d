"""Environments: the async contract, tools, action parsers, faults, the checks, built-ins.

`check_env` plays episodes, so it lives a layer up: `tracerl.rollout.env_check` (or `tracerl`).
"""

from tracerl.envs.arithmetic import Arithmetic
from tracerl.envs.base import CallOutcome, Env, Message, StepResult, ToolEnv
from tracerl.envs.check import CheckReport, EnvCheckError
from tracerl.envs.faults import FaultInjector, SlowTools
from tracerl.envs.parsers import PARSERS, Action, ParseError, get_parser, parser_for_model
from tracerl.envs.refund_desk import RefundDesk
from tracerl.envs.registry import make, register, registered
from tracerl.envs.timeline import Timeline
from tracerl.envs.tools import InfraError, PolicyError, Tool, ToolResult, ToolSet, tool


def _search_env(**kwargs):  # imported on use: the search env pulls in bm25s
    """Search-R1-style question answering over a real (wiki) or generated corpus."""
    from tracerl.envs.search import SearchEnv

    return SearchEnv(**kwargs)


def _coderepair_env(**kwargs):
    """Fix a bug in a small repository with four tools, graded by hidden tests."""
    from tracerl.envs.coderepair.env import CodeRepair

    return CodeRepair(**kwargs)


def _reasoning_gym_env(**kwargs):  # imported on use: reasoning-gym is an optional extra
    """A reasoning-gym task family (pip extra) as a single-turn environment."""
    from tracerl.envs.adapters.reasoning_gym import ReasoningGym

    return ReasoningGym(**kwargs)


def _openenv_env(**kwargs):  # imported on use: its servers run in a venv of their own
    """An OpenEnv environment server (its own venv), played over HTTP."""
    from tracerl.envs.adapters.openenv import OpenEnv

    return OpenEnv(**kwargs)


register("refund_desk", RefundDesk)
register("coderepair", _coderepair_env)
register("arithmetic", Arithmetic)
register("search", _search_env)
register("timeline", Timeline)


def _verifiers_env(**kwargs):  # imported on use: verifiers runs in a venv of its own
    """A verifiers environment (its own venv), played by its own harness."""
    from tracerl.envs.adapters.verifiers import Verifiers

    return Verifiers(**kwargs)


register("reasoning_gym", _reasoning_gym_env)
register("openenv", _openenv_env)
register("verifiers", _verifiers_env, agent="tracerl.envs.adapters.verifiers.agent:solve")

__all__ = [
    "PARSERS",
    "Action",
    "Arithmetic",
    "CallOutcome",
    "CheckReport",
    "Env",
    "EnvCheckError",
    "FaultInjector",
    "InfraError",
    "Message",
    "ParseError",
    "PolicyError",
    "RefundDesk",
    "SlowTools",
    "StepResult",
    "Tool",
    "ToolEnv",
    "ToolResult",
    "ToolSet",
    "get_parser",
    "make",
    "parser_for_model",
    "register",
    "registered",
    "tool",
]


def __getattr__(name: str):  # a clear error for the name this package exported before
    if name == "check_env":
        raise ImportError(
            "check_env plays episodes, so it moved a layer up, above the environments: "
            "`from tracerl import check_env` (projects made by an older `tracerl init` "
            "import it from tracerl.envs; change that line)"
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
