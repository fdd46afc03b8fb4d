"""The CLI's help reads only click's public parameter API, so it renders under any typer
release the dependency range admits: typer's own type hooks (``display_type`` and the like)
exist in some releases and not in others."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer
import typer.main
from typer.testing import CliRunner

import tracerl.cli
from tracerl.cli import app
from tracerl.cli.common import _metavar

CLI_DIR = Path(tracerl.cli.__file__).parent
# typer's internals behind its help's type column, and its private modules: none of them is
# documented, and they come and go between releases (typer 0.12 has no `display_type`)
TYPER_PRIVATE = re.compile(
    r"\b(display_type\w*|type_descriptor|bare_type|display_name_raw)\b|\btyper\._\w+"
)
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


def test_the_cli_reads_no_private_typer_name():
    for path in sorted(CLI_DIR.glob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            found = TYPER_PRIVATE.search(line)
            assert found is None, f"{path.name}:{number} uses typer's {found.group()}: {line}"


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
