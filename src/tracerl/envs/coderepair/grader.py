"""Grading a repair where the code under test cannot reach the grade.

The threat: the agent's patch is code, and the hidden tests import it. Run the tests in
the same process and read the grade from that process (its exit code, its printed summary),
and the patch can decide the grade: replace the test runner's methods, print "OK" and exit
0, rewrite the test files before they run, read the expected values out of them.

The design: **the sandbox reports observations; the verdict is computed outside it, from
expectations that never enter it.**

1. `compile_suite` (here, on the host) parses each test file (unittest `TestCase` methods
   or pytest-style `test_*` functions) and rewrites every assertion: each argument that is
   a literal (``3``, ``[2, 2]``, ``(1, 3)``, ``None``) is kept here as the expected value and
   removed from the code; each other argument becomes an *observation*,
   ``_obs(N, lambda: <expression>)``. ``with self.assertRaises(E): body`` becomes an
   observation of the body (the exception type stays here). What enters the sandbox is the
   inputs and the calls, never an expected value, so nothing in it can be read and echoed.
2. The harness (`harness.py`, started with ``python3 -I`` from the read-only ``/grade``;
   the tree at ``/work`` is last on ``sys.path``) runs the probes and writes each
   observation as a framed JSON line: the value, as exact built-in types only (an object
   with its own ``__eq__``, or a subclass of ``int``, is an opaque record), or the
   exception raised (``SystemExit`` included).
3. `verdict.grade` (on the host) evaluates every assertion on plain data. A test passes
   only if each of its assertions has exactly one observation and holds, and the test ran
   to its end. Missing, duplicated or malformed observations fail. Nothing from the sandbox
   is executed on the host.

So whatever the patch does inside the sandbox — patch `unittest`, monkeypatch assertion
methods, print a passing summary, ``sys.exit(0)``, ``os._exit(0)``, fork a child that
prints, rewrite or read the probes — the most it can do is report wrong or missing
observations. To pass, it must make the observed calls return the right values: fix the
code.

Authoring rules (checked, with a clear error naming file and line): assertions sit at the
top level of a test (or directly inside ``with self.assertRaises``), not inside loops,
conditions or ``try`` blocks, so every assertion runs exactly once; write expected values as
literals (a non-literal expected value is observed in the sandbox, and is then only as
trustworthy as the code that computes it).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HARNESS = Path(__file__).with_name("harness.py")

# assertion method -> (operation, number of compared arguments)
_METHODS = {
    "assertEqual": ("eq", 2),
    "assertEquals": ("eq", 2),
    "assertListEqual": ("eq", 2),
    "assertTupleEqual": ("eq", 2),
    "assertDictEqual": ("eq", 2),
    "assertSetEqual": ("eq", 2),
    "assertSequenceEqual": ("eq", 2),
    "assertNotEqual": ("ne", 2),
    "assertTrue": ("true", 1),
    "assertFalse": ("false", 1),
    "assertIsNone": ("is_none", 1),
    "assertIsNotNone": ("not_none", 1),
    "assertIs": ("is", 2),
    "assertIsNot": ("is_not", 2),
    "assertIn": ("in", 2),
    "assertNotIn": ("not_in", 2),
    "assertGreater": ("gt", 2),
    "assertGreaterEqual": ("ge", 2),
    "assertLess": ("lt", 2),
    "assertLessEqual": ("le", 2),
    "assertAlmostEqual": ("almost", 2),
    "assertNotAlmostEqual": ("not_almost", 2),
    "assertCountEqual": ("count_eq", 2),
}
_RAISES = {"assertRaises", "assertRaisesRegex", "raises"}  # the last: pytest.raises
_COMPARE = {
    ast.Eq: "eq",
    ast.NotEq: "ne",
    ast.Lt: "lt",
    ast.LtE: "le",
    ast.Gt: "gt",
    ast.GtE: "ge",
    ast.In: "in",
    ast.NotIn: "not_in",
    ast.Is: "is",
    ast.IsNot: "is_not",
}


class SuiteError(ValueError):
    """A test file the grader cannot compile (names the file, the line and what to do)."""


@dataclass
class Check:
    """One assertion: an operation over arguments, each a constant kept here or an
    observation id; `raises` lists the accepted exceptions as (module or prefix, name)."""

    op: str
    args: list[tuple[str, Any]]
    where: str
    opts: dict[str, Any] = field(default_factory=dict)


@dataclass
class Suite:
    probes: dict[str, str]  # path -> probe source (what enters the sandbox)
    modules: list[tuple[str, list[tuple[str | None, str]]]]  # path -> its tests
    checks: dict[int, Check]
    tests: dict[str, list[int]]  # "path::Class::test" -> its checks, in order
    sha256: str = ""  # of the test files compiled: which tests graded, for the receipt

    def sandbox_files(self) -> dict[str, str]:
        manifest = {"modules": [[p, [list(t) for t in ts]] for p, ts in self.modules]}
        return {
            "harness.py": HARNESS.read_text(),
            "manifest.json": json.dumps(manifest),
            **{f"probes/{p}": src for p, src in self.probes.items()},
        }


def compile_suite(files: dict[str, str]) -> Suite:
    """Compile test files (path -> source) into probes and checks. Cached by content."""
    return _compile(tuple(sorted(files.items())))


@functools.lru_cache(maxsize=256)
def _compile(items: tuple[tuple[str, str], ...]) -> Suite:
    digest = hashlib.sha256(json.dumps(items).encode()).hexdigest()
    suite = Suite({}, [], {}, {}, digest)
    for path, source in items:
        _Module(suite, path, source).compile()
    return suite


class _Module:
    def __init__(self, suite: Suite, path: str, source: str) -> None:
        self.suite, self.path, self.source = suite, path, source
        self.imports: dict[str, str] = {}  # local name -> module it comes from

    def error(self, node: ast.AST | None, what: str) -> SuiteError:
        line = f":{node.lineno}" if node is not None and hasattr(node, "lineno") else ""
        return SuiteError(f"grader: {self.path}{line}: {what}")

    def compile(self) -> None:
        try:
            tree = ast.parse(self.source, self.path)
        except SyntaxError as e:
            raise self.error(None, f"not valid Python ({e.msg}, line {e.lineno})") from e
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                for a in node.names:
                    self.imports[a.asname or a.name] = node.module
            elif isinstance(node, ast.Import):
                for a in node.names:
                    self.imports[a.asname or a.name.split(".")[0]] = a.name
        tests: list[tuple[str | None, str]] = []
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and _is_test_class(node):
                for fn in node.body:
                    if isinstance(fn, ast.FunctionDef):
                        if fn.name.startswith("test"):
                            self.test(fn, node.name)
                            tests.append((node.name, fn.name))
                        else:
                            self.refuse_asserts(fn.body, f"{fn.name} (outside a test)")
            elif isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
                self.test(node, None)
                tests.append((None, node.name))
            elif isinstance(node, ast.FunctionDef | ast.ClassDef):
                self.refuse_asserts(node.body, f"{node.name} (outside a test)")
        header = ast.parse("from _tracerl_probe import obs as _obs").body
        # pytest is only named for pytest.raises, which the probes no longer use (and the
        # sandbox's interpreter need not have it)
        body = [n for n in tree.body if not _imports_only_pytest(n)]
        tree.body = header + body
        self.suite.probes[self.path] = ast.unparse(ast.fix_missing_locations(tree))
        self.suite.modules.append((self.path, tests))

    # ---- one test ----------------------------------------------------------------------
    def test(self, fn: ast.FunctionDef, cls: str | None) -> None:
        name = "::".join(x for x in (self.path, cls, fn.name) if x)
        self.checks: list[int] = []
        fn.body = self.block(fn.body) or [ast.Pass()]
        if not self.checks:
            raise self.error(
                fn,
                f"{fn.name} asserts nothing: a test that only has to run without an error "
                "is decided inside the sandbox, where the tested code can fake it; assert "
                "something about a result",
            )
        self.suite.tests[name] = self.checks

    def block(self, stmts: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for s in stmts:
            out += self.statement(s)
        return out

    def statement(self, s: ast.stmt) -> list[ast.stmt]:
        if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call):
            method = _assert_method(s.value)
            if method in _METHODS:
                return self.assertion(s.value, method)
            if method in _RAISES and len(s.value.args) >= 2:  # assertRaises(E, fn, *args)
                fn, *rest = s.value.args[1:]
                call = ast.Call(fn, rest, s.value.keywords)
                names = self.exception_names(s.value.args[0])
                return self.new_check("raises", [call], s, raises=names)
            if method is not None:
                raise self.error(s, f"{method} is not supported; use one of {_supported()}")
        if isinstance(s, ast.Assert):
            return self.plain_assert(s)
        if isinstance(s, ast.With) and _assert_method(s.items[0].context_expr) in _RAISES:
            return self.raises(s)
        if isinstance(s, ast.With):  # another context manager: its body may assert
            s.body = self.block(s.body)
            return [s]
        if _has_assertion(s):
            raise self.error(
                s,
                "an assertion inside a loop, condition, try block or nested function; put "
                "assertions at the top level of the test so that each runs exactly once",
            )
        return [s]

    def refuse_asserts(self, stmts: list[ast.stmt], where: str) -> None:
        for s in stmts:
            if _has_assertion(s):
                raise self.error(
                    s, f"an assertion in {where}: assertions belong in the test functions"
                )

    def new_check(self, op: str, args: list[ast.expr], where: ast.AST, **opts: Any) -> list:
        """Register a check; returns the observation statements that feed it."""
        stmts, kept = [], []
        for a in args:
            try:
                kept.append(("const", ast.literal_eval(a)))
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                i = len(self.suite.checks) * 8 + len(kept)
                kept.append(("obs", i))
                stmts.append(_obs_stmt(i, a))
        cid = len(self.suite.checks)
        line = getattr(where, "lineno", 0)
        self.suite.checks[cid] = Check(op, kept, f"{self.path}:{line}", opts)
        self.checks.append(cid)
        return stmts

    def assertion(self, call: ast.Call, method: str) -> list[ast.stmt]:
        op, n = _METHODS[method]
        if len(call.args) < n or any(isinstance(a, ast.Starred) for a in call.args):
            raise self.error(call, f"{method} needs {n} plain arguments")
        opts = {}
        for kw in call.keywords:
            if kw.arg in ("places", "delta"):
                try:
                    opts[kw.arg] = ast.literal_eval(kw.value)
                except ValueError as e:
                    raise self.error(call, f"{method}: {kw.arg} must be a literal") from e
        if len(call.args) > n and op == "almost" and "places" not in opts:
            opts["places"] = ast.literal_eval(call.args[n])
        return self.new_check(op, call.args[:n], call, **opts)

    def plain_assert(self, s: ast.Assert) -> list[ast.stmt]:
        t = s.test
        if isinstance(t, ast.Compare) and len(t.ops) == 1 and type(t.ops[0]) in _COMPARE:
            return self.new_check(_COMPARE[type(t.ops[0])], [t.left, t.comparators[0]], s)
        if isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not):
            return self.new_check("false", [t.operand], s)
        return self.new_check("true", [t], s)

    def raises(self, s: ast.With) -> list[ast.stmt]:
        call = s.items[0].context_expr
        assert isinstance(call, ast.Call)
        if len(s.items) > 1 or s.items[0].optional_vars is not None or not call.args:
            raise self.error(s, "use `with self.assertRaises(Error):` alone, without `as`")
        accepted = self.exception_names(call.args[0])
        opts: dict[str, Any] = {"raises": accepted}
        regex = call.args[1] if len(call.args) > 1 else None
        regex = regex or next((k.value for k in call.keywords if k.arg in ("match",)), None)
        if regex is not None:
            opts["regex"] = ast.literal_eval(regex)
        self.refuse_nested(s.body)
        if len(s.body) == 1 and isinstance(s.body[0], ast.Expr):
            body: ast.expr = s.body[0].value
            return self.new_check("raises", [body], s, **opts)
        # several statements: observe a function made of them
        fname = f"_tracerl_block_{len(self.suite.checks)}"
        fdef = ast.FunctionDef(fname, _no_args(), s.body, [], None, None, [])
        fdef.lineno = s.lineno
        call_fn = ast.Call(ast.Name(fname, ast.Load()), [], [])
        return [fdef, *self.new_check("raises", [call_fn], s, **opts)]

    def refuse_nested(self, body: list[ast.stmt]) -> None:
        for s in body:
            if _has_assertion(s):
                raise self.error(s, "an assertion inside `with assertRaises`: move it out")

    def exception_names(self, node: ast.expr) -> list[tuple[str, str]]:
        if isinstance(node, ast.Tuple):
            return [n for e in node.elts for n in self.exception_names(e)]
        if isinstance(node, ast.Name):
            origin = self.imports.get(node.id)
            return [(origin.split(".")[0] + "." if origin else "builtins", node.id)]
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            origin = self.imports.get(node.value.id, node.value.id)
            return [(origin.split(".")[0] + ".", node.attr)]
        raise self.error(node, "the exception must be a name (ValueError, pkg.Error)")


def _assert_method(node: ast.expr) -> str | None:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        base, attr = node.func.value, node.func.attr
        if isinstance(base, ast.Name) and base.id == "self" and attr.startswith("assert"):
            return attr
        if isinstance(base, ast.Name) and base.id == "self" and attr == "fail":
            return attr
        if isinstance(base, ast.Name) and base.id == "pytest" and attr == "raises":
            return attr
    return None


def _imports_only_pytest(node: ast.stmt) -> bool:
    return isinstance(node, ast.Import) and [a.name for a in node.names] == ["pytest"]


def _is_test_class(node: ast.ClassDef) -> bool:
    bases = [b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases]
    return node.name.startswith("Test") or any(b.endswith("TestCase") for b in bases)


def _has_assertion(node: ast.AST) -> bool:
    return any(
        isinstance(n, ast.Assert) or (isinstance(n, ast.Call) and _assert_method(n) is not None)
        for n in ast.walk(node)
    )


def _supported() -> str:
    return ", ".join(sorted({*_METHODS, "assertRaises", "assertRaisesRegex"}))


def _no_args() -> ast.arguments:
    return ast.arguments([], [], None, [], [], None, [])


def _obs_stmt(i: int, expr: ast.expr) -> ast.stmt:
    lam = ast.Lambda(_no_args(), expr)
    call = ast.Call(ast.Name("_obs", ast.Load()), [ast.Constant(i), lam], [])
    return ast.Expr(call)
