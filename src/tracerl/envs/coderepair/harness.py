"""The grading harness: the only tracerl code that runs inside the grading sandbox.

Started as ``python3 -I /grade/harness.py NONCE`` with the agent's tree at ``/work`` and the
compiled probes at ``/grade`` (read-only). It imports each probe module, runs its tests, and
writes what the tests *observed*: the value (or the exception) of every expression an
assertion was about, as framed JSON lines. It decides nothing: it never sees an expected
value, and the verdict is computed outside the sandbox (`tracerl.envs.coderepair.grader`).
So the code under test may replace anything in this process, print anything or exit at any
time: the worst it can do is report wrong or missing observations, which fail.

Standard library only; this file is copied into the sandbox as it is.
"""

import builtins
import importlib.util
import json
import os
import sys

NONCE = sys.argv[1] if len(sys.argv) > 1 else ""
_OUT = os.dup(1)  # our own copy of stdout, taken before any tested code runs
_write, _dumps = os.write, json.dumps
MAX_ITEMS = 10_000
# the real built-in classes, taken before any tested code runs: a class of the package's
# that names itself after a built-in is not reported as one
_BUILTINS = {k: v for k, v in vars(builtins).items() if isinstance(v, type)}


def emit(record):
    line = "\x1eTRACERL-OBS " + NONCE + " " + _dumps(record, allow_nan=True) + "\n"
    _write(_OUT, line.encode("utf-8", "replace"))


def _name(cls):
    module = str(getattr(cls, "__module__", "?"))
    qualname = str(getattr(cls, "__qualname__", "?"))
    if module == "builtins" and _BUILTINS.get(qualname) is not cls:
        module = "<not builtins>"
    return [module, qualname]


def plain(value, budget=None):
    """JSON for exact built-in types only; anything else (a subclass, an object with its own
    __eq__) becomes an opaque record that equals no expected value."""
    budget = budget if budget is not None else [MAX_ITEMS]
    budget[0] -= 1
    if budget[0] < 0:
        return {"__object__": "too large"}
    t = type(value)
    if value is None or t in (bool, int, float, str):
        return value
    if t in (list, tuple):
        items = [plain(v, budget) for v in value]
        return items if t is list else {"__tuple__": items}
    if t in (set, frozenset):
        return {"__set__": [plain(v, budget) for v in value]}
    if t is dict:
        return {"__dict__": [[plain(k, budget), plain(v, budget)] for k, v in value.items()]}
    if t is bytes:
        return {"__bytes__": value.hex()}
    return {"__object__": ".".join(_name(t))}


def obs(i, fn):
    """Run one observed expression; record its value or the exception it raised."""
    try:
        value = fn()
    except BaseException as e:  # SystemExit and KeyboardInterrupt included: observed, not obeyed
        record = {"i": i, "raised": [_name(c) for c in type(e).__mro__]}
        try:
            record["message"] = str(e)[:1000]
        except BaseException:
            record["message"] = ""
        emit(record)
        return None
    try:
        record = {"i": i, "value": plain(value)}
        try:
            record["truthy"] = bool(value)
        except BaseException:
            record["truthy"] = None
    except BaseException:
        record = {"i": i, "value": {"__object__": "unreadable"}}
    emit(record)
    return value


def _load(path, n):
    spec = importlib.util.spec_from_file_location(f"_tracerl_probe_{n}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(module, test):
    cls_name, fn_name = test
    if cls_name is None:
        getattr(module, fn_name)()
        return
    cls = getattr(module, cls_name)
    inst = cls(fn_name)
    inst.setUp()
    try:
        getattr(inst, fn_name)()
    finally:
        inst.tearDown()


def main():
    sys.modules["_tracerl_probe"] = sys.modules[__name__]
    sys.path.append("/work")  # last: the tree cannot shadow the standard library
    os.chdir("/work")
    with open("/grade/manifest.json") as f:
        manifest = json.load(f)
    for n, (path, tests) in enumerate(manifest["modules"]):
        try:
            module = _load("/grade/probes/" + path, n)
        except BaseException as e:
            emit({"module": path, "error": type(e).__name__ + ": " + str(e)[:500]})
            continue
        for test in tests:
            name = path + "::" + "::".join(t for t in test if t)
            try:
                _run(module, test)
            except BaseException as e:
                emit({"test": name, "error": type(e).__name__ + ": " + str(e)[:500]})
            else:
                emit({"test": name, "done": True})
    emit({"end": True})


if __name__ == "__main__":
    main()
