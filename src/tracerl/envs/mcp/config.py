"""How an MCP server is reached and how its tools are treated: `McpServer`.

In a run config (``env.mcp``) or in code (``McpTools(McpServer(...))``)::

    env:
      name: mypkg.envs:Notes
      mcp:
        - name: kv                               # a label: receipts, errors, logs
          command: [python, -m, mypkg.kv_server] # stdio: tracerl starts it
          scope: episode                         # a fresh server per episode (or: worker)
          annotations: {put: {readOnlyHint: false, destructiveHint: false}}
          dry_run: {delete: "tool:delete_preview"}
        - name: search
          url: http://127.0.0.1:8931/mcp         # streamable HTTP: someone else runs it
          headers: {Authorization: "Bearer ${SEARCH_TOKEN}"}

Values of ``env`` and ``headers`` may name environment variables as ``${VAR}``: they are
read when the server is reached, so a secret never lands in ``config.yaml`` or a receipt.
"""

from __future__ import annotations

import os
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class ToolHints(BaseModel):
    """A tool's MCP annotations (the spec's names, or snake_case). A hint left out keeps
    what the server says; the server's own omissions take the spec's defaults (not
    read-only, destructive, not idempotent, open world)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    read_only_hint: bool | None = Field(None, alias="readOnlyHint")
    """True: the tool changes nothing (a read: always executed)."""
    destructive_hint: bool | None = Field(None, alias="destructiveHint")
    """For a tool that is not read-only: whether it may destroy or overwrite data."""
    idempotent_hint: bool | None = Field(None, alias="idempotentHint")
    """Calling it twice with the same arguments has no further effect (safe to retry)."""
    open_world_hint: bool | None = Field(None, alias="openWorldHint")
    """It reaches outside the server (the web, other services)."""


DryRunMode = Literal["refuse", "tool", "argument"]


class McpServer(BaseModel):
    """One MCP server whose tools an environment offers the model."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    name: str
    """A label for this server: receipts, errors and logs name it."""
    command: list[str] | None = None
    """stdio: the command that starts the server (tracerl starts and stops it). A first
    word ``python`` is this Python (the one running tracerl)."""
    url: str | None = None
    """Streamable HTTP: the server's endpoint, e.g. ``http://127.0.0.1:8000/mcp``."""
    env: dict[str, str] = Field(default_factory=dict)
    """stdio: environment variables for the server, over the SDK's minimal default
    (HOME, PATH, ...: a server does not see the trainer's secrets unless given them)."""
    cwd: str | None = None
    """stdio: the server's working directory (default: tracerl's)."""
    headers: dict[str, str] = Field(default_factory=dict)
    """HTTP: headers sent with every request (``Authorization: Bearer ${TOKEN}``)."""
    scope: Literal["episode", "worker"] = "episode"
    """``episode``: every episode gets its own connection, and a stdio server of its own
    that ends with the episode (isolated state, ~1 s to start a Python server).
    ``worker``: one connection (and stdio server) per worker process, shared by its
    episodes, ended with the process."""
    tools: list[str] | None = None
    """The server's tools to offer (by the server's names); None: all of them."""
    prefix: str = ""
    """Put before each tool name the model sees (``kv_`` makes ``get`` ``kv_get``), for
    servers whose names clash with other tools."""
    annotations: dict[str, ToolHints] = Field(default_factory=dict)
    """Per tool (server's name): hints that replace what the server declares. Servers lie:
    a tool that writes but says ``readOnlyHint: true`` would run for real in training."""
    dry_run: dict[str, str] = Field(default_factory=dict)
    """Per write tool (server's name), how a dry run is done, since MCP has no dry-run
    mode of its own: ``refuse`` (the default: the call is not sent; the model is told it
    was not executed and the intended call is recorded), ``tool:NAME`` (call the server's
    tool NAME, a preview, with the same arguments) or ``argument:NAME`` (send the call
    with the boolean argument NAME set to true; the tool's schema must declare it)."""
    timeout_s: float = Field(30.0, gt=0)
    """Seconds one tool call may take (past it: the environment's ``timeout``)."""
    connect_timeout_s: float = Field(30.0, gt=0)
    """Seconds to start the server (stdio), connect and list its tools."""
    max_result_chars: int = Field(100_000, ge=64)
    """A result longer than this is cut with a visible marker before anything else sees
    it (the rollout then cuts the observation to ``rollout.observation_max_tokens``)."""

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(f"{v!r}: a server name is letters, digits, _ and - (at most 64)")
        return v

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        if v and not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", v):
            raise ValueError(f"{v!r}: a prefix is letters, digits and _")
        return v

    @field_validator("dry_run")
    @classmethod
    def _dry_run(cls, v: dict[str, str]) -> dict[str, str]:
        for tool, how in v.items():
            dry_run_mode(how, where=f"dry_run.{tool}")
        return v

    @model_validator(mode="after")
    def _transport(self) -> McpServer:
        if (self.command is None) == (self.url is None):
            raise ValueError(
                f"mcp server {self.name!r}: give exactly one of `command` (stdio: a server "
                "tracerl starts) and `url` (streamable HTTP)"
            )
        if self.command is not None and not self.command:
            raise ValueError(f"mcp server {self.name!r}: `command` is empty")
        if self.url is not None and not re.match(r"^https?://", self.url):
            raise ValueError(
                f"mcp server {self.name!r}: url {self.url!r} is not http(s)://...; a stdio "
                "server is a `command`"
            )
        return self

    @property
    def transport(self) -> str:
        return "stdio" if self.command is not None else "http"

    def where(self) -> str:
        """What the server is, for messages: its name and how it is reached."""
        how = " ".join(self.command) if self.command is not None else self.url
        return f"MCP server {self.name!r} ({self.transport}: {how})"


def dry_run_mode(how: str, *, where: str = "dry_run") -> tuple[DryRunMode, str | None]:
    """``refuse`` | ``tool:NAME`` | ``argument:NAME`` as (mode, NAME)."""
    mode, _, arg = how.partition(":")
    if mode == "refuse" and not arg:
        return "refuse", None
    if mode in ("tool", "argument") and arg:
        return mode, arg  # type: ignore[return-value]
    raise ValueError(
        f"{where}: {how!r} is not a dry-run mode; use 'refuse', 'tool:NAME' (a preview tool "
        "of the server) or 'argument:NAME' (a boolean argument the tool takes)"
    )


def expand(value: str, where: str) -> str:
    """`value` with each ``${VAR}`` replaced by the environment variable's value."""

    def one(m: re.Match[str]) -> str:
        if m.group(1) not in os.environ:
            raise ValueError(f"{where}: environment variable {m.group(1)} is not set")
        return os.environ[m.group(1)]

    return _VAR.sub(one, value)


def as_server(spec: Any) -> McpServer:
    """An `McpServer` from itself, a dict (a config's entry), a URL or a command list."""
    if isinstance(spec, McpServer):
        return spec
    if isinstance(spec, dict):
        return McpServer.model_validate(spec)
    if isinstance(spec, str) and re.match(r"^https?://", spec):
        return McpServer(name="mcp", url=spec)
    if isinstance(spec, list | tuple) and spec and all(isinstance(a, str) for a in spec):
        return McpServer(name="mcp", command=list(spec))
    raise ValueError(
        f"an MCP server is a mapping (name, command or url, ...), a URL or a command list; "
        f"got {spec!r:.120}"
    )
