"""`tracerl init NAME`: a working starter package for a user's own environment.

    tracerl init unitconv            # writes ./unitconv/
    cd unitconv
    tracerl check-env unitconv.env:UnitConv
    tracerl train configs/unitconv.yaml
    python -m pytest tests

The starter is a small unit-conversion environment ("Convert 12.5 km to m") with one tool,
its own verifier (a ``reward`` method), the same verifier as a standalone function (to show
``trainer.reward: package.module:function``), a config, tests and a README. Its files are
templates shipped with tracerl (``template/*.tmpl``); ``{{name}}`` is replaced by NAME. The
environment class keeps the name ``UnitConv`` whatever NAME is: it says what the starter
does, and is the first thing a user renames when the environment becomes their own.

`init_project` writes into a temporary folder beside the target and renames it into place,
so it never overwrites anything and never leaves half a project behind.
"""

from __future__ import annotations

import importlib.machinery
import keyword
import os
import re
import secrets
import shutil
import sys
from importlib import resources
from pathlib import Path

from tracerl.errors import UserError

CLASS = "UnitConv"
FILES = {
    "pyproject.toml": "pyproject.toml.tmpl",
    "README.md": "README.md.tmpl",
    ".gitignore": "gitignore.tmpl",
    "{name}/__init__.py": "package_init.py.tmpl",
    "{name}/env.py": "env.py.tmpl",
    "{name}/rewards.py": "rewards.py.tmpl",
    "configs/{name}.yaml": "config.yaml.tmpl",
    "tests/test_{name}.py": "test_env.py.tmpl",
}
"""Each file of the project (NAME substituted in the path) and the template it comes from."""
RESERVED = {"tests", "configs", "runs", "tracerl"}
"""Names a project cannot take: its own folders (tests/, configs/, runs/), and tracerl."""
_NAME = re.compile(r"[a-z][a-z0-9_]*")


def check_name(name: str) -> None:
    """Raise `UserError` (one line: what is wrong and what to do) unless `name` can be the
    project's package: a lowercase identifier that shadows no standard or installed module."""
    if not _NAME.fullmatch(name) or keyword.iskeyword(name):
        raise UserError(
            f"{name!r} cannot be a package name: use lowercase letters, digits and _, "
            "starting with a letter, and not a Python keyword (e.g. unitconv, my_env)"
        )
    if name in RESERVED:
        raise UserError(
            f"{name!r} is reserved (the project has tests/, configs/, runs/ "
            "folders and uses tracerl): choose another name"
        )
    if name in sys.stdlib_module_names or name in sys.builtin_module_names:
        raise UserError(
            f"{name!r} is a module of Python's standard library; a package of that name would "
            f"shadow it: choose another name (e.g. my_{name})"
        )
    # the installed packages only: a folder in the working directory is not a module
    here = {"", os.getcwd()}
    path = [p for p in sys.path if p not in here]
    if importlib.machinery.PathFinder.find_spec(name, path) is not None:
        raise UserError(
            f"{name!r} is already an installed module; a package of that name would shadow "
            f"it: choose another name (e.g. my_{name})"
        )


def render(text: str, name: str) -> str:
    """A template's text for project `name` (``{{name}}``, ``{{Class}}``, ``{{version}}``)."""
    import tracerl

    values = {"name": name, "Class": CLASS, "version": tracerl.__version__}
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", value)
    return text


def init_project(name: str, parent: Path) -> Path:
    """Write the starter project `parent`/`name`/ and return its path. Raises `UserError` for
    a bad name or an existing target (nothing is ever overwritten)."""
    check_name(name)
    parent = Path(parent)
    target = parent / name
    if target.exists() or target.is_symlink():
        raise UserError(
            f"{target} already exists; tracerl init never overwrites: choose another NAME, "
            "another --dir, or remove it"
        )
    if parent.exists() and not parent.is_dir():
        raise UserError(f"--dir {parent} is a file, not a folder", "give a folder (or a new one)")
    parent.mkdir(parents=True, exist_ok=True)
    templates = resources.files(__name__) / "template"
    staging = parent / f".{name}.init-{secrets.token_hex(4)}"
    staging.mkdir()  # (the umask's permissions, as any folder the user makes)
    try:
        for dest, source in FILES.items():
            path = staging / dest.format(name=name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(render((templates / source).read_text(encoding="utf-8"), name))
        os.rename(staging, target)  # fails rather than replace a folder made meanwhile
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target
