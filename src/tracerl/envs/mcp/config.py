"""How an MCP server is reached and how its tools are treated: `McpServer`.

In a run config (``env.mcp``) or in code (``McpTools(McpServer(...))``)::

    env:
      name: mypkg.envs:Notes
      mcp:
        - name: kv                               # a label: receipts, errors, logs
          command: [python, -m, mypkg.kv_server] # stdio: tracerl starts it
          scope: episode                         # a fresh server per episode (or: worker)
          annotations: {"get_*": {readOnlyHint: true}, put: {destructiveHint: false}}
          dry_run: {delete: "tool:delete_preview"}
        - name: notes                            # one server per episode, its own folder
          command: [notes-server, --root, "${episode_dir}", --task, "${task.id}"]
          final_state: [{tool: dump}]            # read before it closes: the receipt keeps it
        - name: search
          url: http://127.0.0.1:8931/mcp         # streamable HTTP: someone else runs it
          headers: {Authorization: "Bearer ${SEARCH_TOKEN}"}

Values of ``env`` and ``headers`` may name environment variables as ``${VAR}``: they are
read when the server is reached, so a secret never lands in ``config.yaml`` or a receipt.

The episode's own values fill ``${episode_id}``, ``${seed}``, ``${task.<field>}`` (``${task.id}``)
and ``${episode_dir}`` (a fresh empty folder for the episode, removed after it) wherever they
appear in ``command``, ``cwd``, ``env``, ``url``, ``headers``, ``inject`` and ``final_state``
arguments: a server that keeps state in a folder or a file, or by an argument, isolates
episodes with configuration alone. A server whose start depends on the episode needs
``scope: episode``; ``inject`` works with either scope.
"""

from __future__ import annotations

import os
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_EPISODE = re.compile(r"\$\{(episode_id|episode_dir|seed|task\.[A-Za-z_][A-Za-z0-9_]*)\}")
_PATTERN = re.compile(r"[*?\[]")


def is_pattern(name: str) -> bool:
    """A tool key with ``*``, ``?`` or ``[...]``: a shell-style pattern (`fnmatch`)."""
    return bool(_PATTERN.search(name))


def matching(name: str, keyed: dict[str, Any]) -> Any:
    """The value `keyed` holds for tool `name`: its exact entry, else the first pattern (in
    the order given) that matches it, else None."""
    import fnmatch

    if name in keyed:
        return keyed[name]
    for key, value in keyed.items():
        if is_pattern(key) and fnmatch.fnmatchcase(name, key):
            return value
    return None


def unmatched(keys: Any, names: Any) -> list[str]:
    """The keys (names or patterns) that match none of `names`: typos, or a server that
    changed."""
    import fnmatch

    names = list(names)
    return sorted(
        k for k in keys if not (fnmatch.filter(names, k) if is_pattern(k) else k in names)
    )


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


class FinalRead(BaseModel):
    """A read-only call made when the episode has ended, before its server closes."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    tool: str
    """The server's tool (it must be read-only: annotated, or overridden, ``readOnlyHint``)."""
    arguments: dict[str, Any] = Field(default_factory=dict)
    """Its arguments (the episode's placeholders are filled)."""
    key: str | None = None
    """Where the result goes in the receipt's ``final_state.<server>`` (default: the tool)."""

    @property
    def label(self) -> str:
        return self.key or self.tool


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
    """Per tool (the server's name, or a pattern such as ``get_*``: an exact name wins, then
    the first pattern that matches): hints that replace what the server declares. Most
    servers declare none, which makes every tool a write (budgeted, dry-run);
    ``{"get_*": {readOnlyHint: true}}`` lets the agent read. Servers lie, too: a tool that
    writes but says ``readOnlyHint: true`` would run for real in training."""
    inject: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Per tool (a name or a pattern; ``*``: all): arguments tracerl sets on every call,
    with the episode's placeholders filled (``{"*": {session: "${episode_id}"}}``). The model
    does not see them (they leave the schema it is shown) and cannot set them (a value it
    sends is replaced). Each must be a property of the tool's input schema. For a server
    that keys its state by an argument: episodes of one shared server stay apart."""
    final_state: list[FinalRead] = Field(default_factory=list)
    """Read-only calls made after the episode's last step, before the server is closed;
    their results are the receipt's ``final_state`` (``{server: {key: text}}``), which a
    reward reads (``ctx.final_state``) to compare the world with the gold one. A call that
    fails is the environment's fault."""
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

    @field_validator("final_state", mode="before")
    @classmethod
    def _final_state(cls, v: Any) -> Any:
        if isinstance(v, list):  # a bare tool name is a call without arguments
            return [{"tool": x} if isinstance(x, str) else x for x in v]
        return v

    @model_validator(mode="after")
    def _episode_scope(self) -> McpServer:
        used = self.started_with_placeholders()
        if used and self.scope == "worker":
            raise ValueError(
                f"mcp server {self.name!r}: {used} fills in the episode's values, but "
                "`scope: worker` starts one server for many episodes; use `scope: episode`, "
                "or keep the episode in the calls (`inject`)"
            )
        return self

    def started_with_placeholders(self) -> list[str]:
        """The episode placeholders the server's start (command, cwd, env, url, headers)
        uses."""
        texts = [*(self.command or ()), self.cwd or "", self.url or ""]
        texts += [*self.env.values(), *self.headers.values()]
        return sorted({m.group(0) for t in texts for m in _EPISODE.finditer(t)})

    def placeholders(self) -> set[str]:
        """The episode placeholders (``${episode_dir}``...) anywhere in the server's settings:
        none, and an episode starts the server as configured."""
        return {m.group(0) for m in _EPISODE.finditer(self.model_dump_json())}

    def for_episode(self, values: dict[str, str]) -> McpServer:
        """This server with the episode's placeholders filled (`episode_values`)."""
        where = f"mcp server {self.name!r}"
        out = fill(self.model_dump(mode="python"), values, where)
        return McpServer.model_validate(out)

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


def episode_values(
    episode_id: str, seed: int, task: dict[str, Any], episode_dir: str = ""
) -> dict[str, str]:
    """The values an episode gives its placeholders."""
    out = {"episode_id": episode_id, "seed": str(seed), "episode_dir": episode_dir}
    for k, v in task.items():
        if isinstance(v, str | int | float | bool):
            out[f"task.{k}"] = str(v)
    return out


def fill(value: Any, values: dict[str, str], where: str) -> Any:
    """`value` (a string, or lists and dicts of them) with each episode placeholder
    (``${episode_id}``, ``${seed}``, ``${episode_dir}``, ``${task.<field>}``) replaced;
    other ``${VAR}`` stay (environment variables, read when the server is reached)."""
    if isinstance(value, str):

        def one(m: re.Match[str]) -> str:
            name = m.group(1)
            if name not in values:
                fields = sorted(k.removeprefix("task.") for k in values if k.startswith("task."))
                raise ValueError(
                    f"{where}: ${{{name}}}: the task has no field "
                    f"{name.removeprefix('task.')!r} that is a string or number "
                    f"(its fields: {', '.join(fields) or 'none'})"
                )
            return values[name]

        return _EPISODE.sub(one, value)
    if isinstance(value, list | tuple):
        return [fill(v, values, where) for v in value]
    if isinstance(value, dict):
        return {k: fill(v, values, where) for k, v in value.items()}
    return value


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
