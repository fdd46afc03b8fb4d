"""Mistakes a user can fix: one class for all of them, so every command reports them alike.

A `UserError` says what is wrong, where (a file and line, a config key, a name) and what to
do about it. The `tracerl` command prints it in one or two lines, without a traceback, and
exits with status 2 (``tracerl --debug ...`` shows the traceback). Library callers catch it
like any exception; its subclasses keep their older bases (``ValueError``, ``KeyError``...)
so existing ``except`` clauses still work.
"""

from __future__ import annotations


class UserError(Exception):
    """A mistake in what the user gave (a config, a name, a file), with a `hint` on what to
    do about it (the second line the command prints)."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:  # KeyError subclasses would otherwise print repr()
        return self.message


class NotFoundError(UserError, KeyError):
    """A name that resolves to nothing: an environment, a reward, a component."""


def unknown(
    what: str,
    name: str,
    valid: list[str],
    hint: str,
    listed: str = "valid",
    error: type[UserError] = NotFoundError,
) -> UserError:
    """``unknown <what> 'x' (did you mean 'y'?); <listed>: a, b, c`` with `hint`, as an
    `error` (a `NotFoundError` unless the caller has its own class)."""
    import difflib

    close = difflib.get_close_matches(name, valid, n=1)
    return error(
        f"unknown {what} {name!r}"
        + (f" (did you mean {close[0]!r}?)" if close else "")
        + f"; {listed}: {', '.join(valid) or 'none'}",
        hint,
    )
