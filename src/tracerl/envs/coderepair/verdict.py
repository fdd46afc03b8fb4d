"""The verdict on a graded run, computed outside the sandbox from the harness's records.

`grade` reads the framed observation records (those with this run's nonce) out of the
sandbox's output and evaluates every compiled assertion (`tracerl.envs.coderepair.grader`)
on plain data: the expected values never left this process, and nothing from the sandbox is
executed here. A test passes only if each of its assertions has exactly one observation and
holds, and the test reported reaching its end exactly once; a missing, duplicated or
malformed record makes it an error.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

from tracerl.envs.coderepair.grader import Check, Suite

FRAME = "\x1eTRACERL-OBS "


def new_nonce() -> str:
    return secrets.token_hex(16)


def read_observations(output: str, nonce: str) -> dict[str, Any]:
    """The harness's framed records from the sandbox's output (anything else is ignored)."""
    prefix = f"{FRAME}{nonce} "
    obs: dict[int, list[dict]] = {}
    tests: dict[str, list[dict]] = {}
    modules: dict[str, str] = {}
    for line in output.split("\n"):  # not splitlines(): it splits at the frame's \x1e
        at = line.find(prefix)
        if at < 0:
            continue
        try:
            rec = json.loads(line[at + len(prefix) :])
        except (ValueError, RecursionError):  # malformed, or nested to blow the stack
            continue
        if not isinstance(rec, dict):
            continue
        if isinstance(rec.get("i"), int):
            obs.setdefault(rec["i"], []).append(rec)
        elif isinstance(rec.get("test"), str):
            tests.setdefault(rec["test"], []).append(rec)
        elif isinstance(rec.get("module"), str):
            modules[rec["module"]] = str(rec.get("error"))
    return {"obs": obs, "tests": tests, "modules": modules}


def grade(
    suite: Suite,
    output: str,
    nonce: str,
    limit: str | None = None,
    counted: set[str] | None = None,
) -> dict[str, Any]:
    """The verdict: per test, passed / failed (an assertion does not hold) / error (missing
    or conflicting observations, an exception outside any assertion, the module failed to
    import). Summary keys as before: ran, failures, errors, ok, limit, failing.

    `counted`: the test files whose tests the counts (and so a share-of-tests reward) are
    about, the hidden ones; the others (the visible tests, whose expected values the agent
    can read) can only make `ok` false, never add to the share (`visible_failing`)."""
    seen = read_observations(output, nonce)
    failures, errors, ran, failing, visible_failing = 0, 0, 0, [], []
    for name, check_ids in suite.tests.items():
        verdict = _test_verdict(suite, name, check_ids, seen)
        if counted is not None and name.split("::")[0] not in counted:
            visible_failing += [name] if verdict != "pass" else []
            continue
        ran += 1
        if verdict != "pass":
            failures += verdict == "fail"
            errors += verdict == "error"
            failing.append(name)
    conflicts = sum(len(v) > 1 for v in seen["obs"].values())
    return {
        "ran": ran,
        "failures": failures,
        "errors": errors,
        "ok": ran > 0 and not failures and not errors and not visible_failing,
        "limit": limit,
        "failing": failing,
        "visible_failing": visible_failing,
        "checks": len(suite.checks),
        "conflicting_observations": conflicts,
        "suite_sha256": suite.sha256,
    }


def _test_verdict(suite: Suite, name: str, check_ids: list[int], seen: dict) -> str:
    records = seen["tests"].get(name, [])
    if len(records) != 1 or not records[0].get("done"):
        # no end record (the process died or was cut), an error outside any assertion, or
        # more than one end record (forged)
        ran_checks = [_holds(suite.checks[c], seen["obs"]) for c in check_ids]
        return "fail" if False in ran_checks else "error"
    results = [_holds(suite.checks[c], seen["obs"]) for c in check_ids]
    if None in results:
        return "error"
    return "pass" if all(results) else "fail"


def _holds(check: Check, obs: dict[int, list[dict]]) -> bool | None:
    """True / False, or None when an observation is missing or was reported twice."""
    values = []
    for kind, x in check.args:
        if kind == "const":
            values.append(("value", x))
            continue
        recs = obs.get(x, [])
        if len(recs) != 1:
            return None
        rec = recs[0]
        if "raised" in rec:
            values.append(("raised", rec))
        elif "value" in rec:
            value = _decode(rec["value"])
            if isinstance(value, _Opaque):
                value.truthy = rec.get("truthy") is True
            values.append(("value", value))
        else:
            return None
    if check.op == "raises":
        kind, rec = values[0]
        return kind == "raised" and _raised_as(rec, check.opts)
    if any(kind == "raised" for kind, _ in values):
        return False  # an exception where a value was asserted
    try:
        return bool(_OPS[check.op](*[v for _, v in values], check.opts))
    except Exception:
        return False


def _raised_as(rec: dict, opts: dict) -> bool:
    mro = [tuple(x) for x in rec.get("raised", []) if isinstance(x, list) and len(x) == 2]
    ok = any(
        qual == name and (module == where if where == "builtins" else module.startswith(where))
        for where, name in opts["raises"]
        for module, qual in mro
        if isinstance(module, str)
    )
    if ok and "regex" in opts:
        ok = re.search(opts["regex"], str(rec.get("message", ""))) is not None
    return ok


class _Opaque:
    """A value the sandbox could not express as plain data: equal to nothing; its truth is
    what the sandbox reported (its own ``__bool__``)."""

    def __init__(self, what: Any, truthy: bool = False) -> None:
        self.what, self.truthy = what, truthy

    def __bool__(self) -> bool:
        return self.truthy

    def __eq__(self, other: object) -> bool:
        return False

    def __hash__(self) -> int:
        return id(self)


def _decode(v: Any, depth: int = 0) -> Any:
    if depth > 50:  # deeper than any value a test compares: opaque, never equal
        return _Opaque("too deep")
    if isinstance(v, list):
        return [_decode(x, depth + 1) for x in v]
    if not isinstance(v, dict):
        return v
    if len(v) != 1:
        return _Opaque(v)
    ((tag, inner),) = v.items()
    try:
        if tag == "__tuple__":
            return tuple(_decode(x, depth + 1) for x in inner)
        if tag == "__set__":
            return {_decode(x, depth + 1) for x in inner}
        if tag == "__dict__":
            return {_decode(k, depth + 1): _decode(x, depth + 1) for k, x in inner}
        if tag == "__bytes__":
            return bytes.fromhex(inner)
    except (TypeError, ValueError):
        pass
    return _Opaque(v)


def _is(a: Any, b: Any) -> bool:
    """Identity is defined outside the sandbox only for None, True and False; otherwise
    equal values of the same type."""
    if any(x is s for x in (a, b) for s in (None, True, False)):
        return a is b
    return type(a) is type(b) and a == b


def _almost(a: Any, b: Any, o: dict) -> bool:
    if a == b:
        return True
    if o.get("delta") is not None:
        return abs(a - b) <= o["delta"]
    return round(abs(a - b), o.get("places") or 7) == 0


def _count_eq(a: Any, b: Any, _: dict) -> bool:
    rest = list(b)
    for x in a:
        for j, y in enumerate(rest):
            if x == y:
                del rest[j]
                break
        else:
            return False
    return not rest


_OPS = {
    "eq": lambda a, b, _: a == b,
    "ne": lambda a, b, _: a != b,
    "true": lambda a, _: bool(a),
    "false": lambda a, _: not a,
    "is_none": lambda a, _: a is None,
    "not_none": lambda a, _: a is not None,
    "is": lambda a, b, _: _is(a, b),
    "is_not": lambda a, b, _: not _is(a, b),
    "in": lambda a, b, _: a in b,
    "not_in": lambda a, b, _: a not in b,
    "gt": lambda a, b, _: a > b,
    "ge": lambda a, b, _: a >= b,
    "lt": lambda a, b, _: a < b,
    "le": lambda a, b, _: a <= b,
    "almost": _almost,
    "not_almost": lambda a, b, o: not _almost(a, b, o),
    "count_eq": _count_eq,
}
