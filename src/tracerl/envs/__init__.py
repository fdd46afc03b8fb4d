"""Environments: the async contract, tools, action parsers, faults, `check_env`, built-ins."""

from tracerl.envs.arithmetic import Arithmetic
from tracerl.envs.base import CallOutcome, Env, Message, StepResult, ToolEnv
from tracerl.envs.check import CheckReport, EnvCheckError, check_env
from tracerl.envs.faults import FaultInjector, SlowTools
from tracerl.envs.parsers import PARSERS, Action, ParseError, get_parser, parser_for_model
from tracerl.envs.refund_desk import RefundDesk
from tracerl.envs.registry import make, register, registered
from tracerl.envs.tools import InfraError, PolicyError, Tool, ToolResult, ToolSet, tool


def _search_env(**kwargs):  # imported on use: the search env pulls in bm25s
    from tracerl.envs.search import SearchEnv

    return SearchEnv(**kwargs)


def _coderepair_env(**kwargs):
    from tracerl.envs.coderepair.env import CodeRepair

    return CodeRepair(**kwargs)


register("refund_desk", RefundDesk)
register("coderepair", _coderepair_env)
register("arithmetic", Arithmetic)
register("search", _search_env)

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
    "check_env",
    "get_parser",
    "make",
    "parser_for_model",
    "register",
    "registered",
    "tool",
]
