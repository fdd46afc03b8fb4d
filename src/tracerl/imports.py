"""User code by name: ``package.module:attribute`` import paths and entry points.

The conventions of Gymnasium (``entry_point="pkg.module:Class"``), uvicorn and setuptools:
the module part is imported (the working directory is searched too, as `python -m` would,
so ``tracerl train`` finds a package in the folder it runs from), the attribute part is
looked up on it (dots walk into nested attributes). Installed packages offer objects under a
short name through entry points (``[project.entry-points."tracerl.envs"]``).

Every failure is a `UserError` that names the path, what went wrong and what to do.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
from collections.abc import Callable
from importlib import metadata
from typing import Any

from tracerl.errors import NotFoundError, UserError


def lazy_names(package: str, where: dict[str, str]) -> Callable[[str], Any]:
    """A package's module-level ``__getattr__`` (PEP 562) for the names in `where` (name: the
    module that defines it): each is imported on first use and kept, so importing the package
    loads none of them (no torch for a config's checks)."""

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name]), name)
        setattr(sys.modules[package], name, value)  # once
        return value

    return __getattr__


def is_import_path(name: str) -> bool:
    """``package.module:attribute`` (a colon, a module before it, an attribute after)."""
    module, sep, attr = name.partition(":")
    return bool(sep and module and attr) and all(
        part.isidentifier() for part in [*module.split("."), *attr.split(".")]
    )


def search_directory(folder: str | None = None) -> None:
    """Let ``module:attr`` paths find modules in `folder` (default: the working directory;
    appended, so a file there never shadows the standard library or an installed
    package)."""
    folder = folder or os.getcwd()
    if folder not in sys.path and not (folder == os.getcwd() and "" in sys.path):
        sys.path.append(folder)


def load_object(path: str, what: str) -> Any:
    """The object at ``package.module:attribute``; `what` names it in errors ("environment
    'x'", "reward function")."""
    if not is_import_path(path):
        raise UserError(
            f"{what} {path!r} is not an import path",
            "write it as package.module:attribute (e.g. mypkg.envs:UnitConv)",
        )
    module_name, _, attr = path.partition(":")
    search_directory()
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise UserError(
                f"{what} {path!r}: no module named {e.name!r} (searched the working directory "
                f"{os.getcwd()} and the installed packages)",
                "run from the folder that holds the package, or install it (pip install -e PATH)",
            ) from None
        raise UserError(
            f"{what} {path!r}: importing {module_name} failed: {e}",
            f"install what {module_name} needs, or fix its imports (--debug for the traceback)",
        ) from e
    except SyntaxError as e:
        raise UserError(
            f"{what} {path!r}: {e.filename}:{e.lineno}:{e.offset or 0}: {e.msg}",
            f"fix the syntax error in {module_name}",
        ) from None
    except Exception as e:  # the user's module raised while importing
        raise UserError(
            f"{what} {path!r}: importing {module_name} raised {type(e).__name__}: {e}",
            "fix the module (tracerl --debug ... shows the traceback)",
        ) from e
    obj: Any = module
    for i, part in enumerate(attr.split(".")):
        if not hasattr(obj, part):
            where = ".".join([module_name, *attr.split(".")[:i]])
            names = [n for n in dir(obj) if not n.startswith("_")]
            close = difflib.get_close_matches(part, names, n=1)
            raise NotFoundError(
                f"{what} {path!r}: {where} has no attribute {part!r}"
                + (f"; did you mean {close[0]!r}?" if close else ""),
                f"check the name after the colon in {path!r}",
            )
        obj = getattr(obj, part)
    return obj


def entry_points(group: str) -> dict[str, metadata.EntryPoint]:
    """The installed packages' entry points of `group`, by name."""
    return {ep.name: ep for ep in metadata.entry_points(group=group)}


def load_entry_point(ep: metadata.EntryPoint, what: str) -> Any:
    """An entry point's object; its failures are `UserError`s naming the package."""
    dist = getattr(ep, "dist", None)
    owner = f"package {dist.name!r}" if dist is not None else "an installed package"
    try:
        return ep.load()
    except Exception as e:
        raise UserError(
            f"{what} {ep.name!r} (entry point {ep.value!r} of {owner}) failed to load: "
            f"{type(e).__name__}: {e}",
            f"fix or reinstall {owner} (tracerl --debug ... shows the traceback)",
        ) from e


def describe(obj: Any) -> str | None:
    """The import path an object can be found at again (``module:qualname``), if any."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not module or not qualname or "<" in qualname or module == "__main__":
        return None
    return f"{module}:{qualname}"


PYTHON_OBJECT = "python:"
"""The prefix of a name that stands for a Python object handed to ``tracerl.train()`` (an
environment class, a reward function) that no import path finds again: registered in the
process that started the run, and in no other."""


def python_object_name(obj: Any) -> str:
    """``python:<qualname>``: the name such an object is registered under (an instance
    without a qualname of its own, a callable object, is named after its class)."""
    qualname = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    return PYTHON_OBJECT + qualname


def not_in_this_process(what: str, name: str, example: str, by_path: str) -> NotFoundError:
    """The error for a ``python:`` name this process has no object for: a run started from
    Python, resumed (or replayed) where that object was never given."""
    return NotFoundError(
        f"{what} {name!r} was a Python object given to tracerl.train() in the process that "
        "started the run; this process has no object under that name",
        f"give it again from Python ({example}), or move it into a module and name it by "
        f"import path ({by_path})",
    )
