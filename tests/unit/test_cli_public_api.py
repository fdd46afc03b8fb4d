"""The CLI's help reads only click's public parameter API, so it renders under any typer
release: typer's own type display (``display_type`` and the like) exists in some releases
and not in others (typer 0.12 has none), and reading it crashed every command's help there."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import typer
import typer.main
from typer.testing import CliRunner

import tracerl.cli
from tracerl.cli import app
from tracerl.cli.common import _hide_argument_type, _metavar, _plain_types

CLI_DIR = Path(tracerl.cli.__file__).parent
# typer's internals behind its help's type column, and its private modules: none of them is
# documented, and they come and go between releases (typer 0.12 has no `display_type`)
TYPER_PRIVATE = re.compile(
    r"\b(display_type\w*|type_descriptor|bare_type|display_name_raw)\b|\btyper\._\w+"
)
# the one exception: set (never read) where it exists, to leave an argument's type out
HOOK = "display_type_rich"
GROUP = typer.main.get_command(app)
COMMANDS = GROUP.list_commands(typer.Context(GROUP))
METAVAR = r"[A-Z][A-Z\[\]|]*"  # TEXT, INT, PATH, LIST[TEXT]


def _help(*args: str) -> str:
    result = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.stdout


def _options(command: str) -> list[tuple[str, bool]]:
    """Each option of a command, by its first long name, and whether it is a flag."""
    sub = GROUP.get_command(typer.Context(GROUP), command)
    return [
        (next(o for o in p.opts if o.startswith("--")), p.is_flag)
        for p in sub.get_params(typer.Context(sub))
        if p.param_type_name == "option"
    ]


def test_the_cli_uses_no_private_typer_name():
    allowed = inspect.getsource(_hide_argument_type)
    assert allowed.count(HOOK) == 2  # `hasattr(..., "HOOK")`, then `argument.HOOK = ...`
    for path in sorted(CLI_DIR.glob("*.py")):
        source = path.read_text()
        if path.name == "common.py":
            source = source.replace(allowed, "")
        for number, line in enumerate(source.splitlines(), 1):
            found = TYPER_PRIVATE.search(line)
            assert found is None, f"{path.name}:~{number} uses typer's {found.group()}: {line}"


def test_help_types_come_from_click_public_attributes_alone():
    """Parameters with nothing but click's public attributes (as a typer without any of its
    display hooks makes): option values get their upper-case names, flags and arguments
    none, and nothing else is asked of them."""

    def command(config: Path | None, port: int, tags: list[str] | None, live: bool) -> None:
        pass

    def param(kind: str, name: str, *, flag: bool = False, metavar: str | None = None):
        return SimpleNamespace(param_type_name=kind, name=name, is_flag=flag, metavar=metavar)

    params = [
        param("argument", "config"),
        param("option", "port"),
        param("option", "tags"),
        param("option", "live", flag=True),
        param("option", "help", flag=True),
        param("option", "episode", metavar="EPISODE"),
    ]
    _plain_types(SimpleNamespace(callback=command, get_params=lambda ctx: params), None)
    assert [p.metavar for p in params] == [None, "INT", "LIST[TEXT]", "", "", "EPISODE"]
    assert vars(params[0]) == vars(param("argument", "config"))  # no hook where typer has none


def test_the_private_name_check_can_fail():
    assert TYPER_PRIVATE.search('p.metavar = p.display_type(ctx).strip("<>")')
    assert TYPER_PRIVATE.search("p.display_type_rich = lambda ctx: None")
    assert TYPER_PRIVATE.search("from typer._click import Parameter")
    assert not TYPER_PRIVATE.search("p.metavar = _metavar(value_types[p.name])")


def test_the_top_level_help_lists_every_command():
    out = _help()
    assert COMMANDS and all(re.search(rf"^│ {re.escape(c)}\s", out, re.M) for c in COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_help_renders_with_plain_metavars(command):
    """An option that takes a value shows it in upper case (``--out PATH``); a flag shows
    none (``--resume``, ``--help``); no option shows typer's ``<type>`` form."""
    out = _help(command)
    for option, is_flag in _options(command):
        row = re.search(rf"^│(?: \*)?\s+{option}\s+(?:--[\w-]+\s+)?(\S+)", out, re.M)
        assert row is not None, f"{command} --help has no row for {option}:\n{out}"
        shown = row.group(1)
        if is_flag:
            assert not re.fullmatch(METAVAR, shown), f"{command} {option} shows {shown}"
        else:
            assert re.fullmatch(METAVAR, shown), f"{command} {option} shows {shown!r}"
        assert not shown.startswith("<"), f"{command} {option} shows typer's {shown}"


@pytest.mark.parametrize(
    ("command", "option", "metavar"),
    [
        ("demo", "--out", "PATH"),
        ("eval", "--model", "TEXT"),
        ("eval", "--split", "LIST[TEXT]"),
        ("eval", "--n", "INT"),
        ("show", "--index", "INT"),
        ("replay", "--episode", "TEXT"),
        ("review", "--decide", "INT"),
        ("check-env", "--arg", "LIST[TEXT]"),
        ("check-env", "--config", "PATH"),
        ("sft", "--out", "PATH"),
        ("sft", "--lr", "FLOAT"),
        ("serve", "--port", "INT"),
        ("serve", "--temperature", "FLOAT"),
        ("gateway", "--parser", "TEXT"),
    ],
)
def test_option_metavars_are_the_ones_help_has_always_shown(command, option, metavar):
    out = _help(command)
    assert re.search(rf"^│(?: \*)?\s+{option}\s+{re.escape(metavar)}\s", out, re.M), out


@pytest.mark.parametrize(
    ("command", "flag"),
    [("train", "--resume"), ("train", "--print-config"), ("review", "--correct")],
)
def test_flags_show_no_metavar(command, flag):
    out = _help(command)
    row = re.search(rf"^│\s+{flag}\s+(?:--[\w-]+\s+)?(\S+)", out, re.M)
    assert row is not None and row.group(1).islower(), out


def test_metavar_of_an_annotation():
    assert _metavar(str) == "TEXT"
    assert _metavar(int | None) == "INT"
    assert _metavar(float) == "FLOAT"
    assert _metavar(Path | None) == "PATH"
    assert _metavar(list[str] | None) == "LIST[TEXT]"
    assert _metavar(int | str) == "INT|TEXT"
