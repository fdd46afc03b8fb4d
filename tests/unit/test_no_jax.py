"""Nothing tracerl runs imports JAX: where JAX is installed (most GPU images), importing it
takes 75% of the GPU's memory. bm25s (the search index) imported it; the index now selects
with numpy, and a whole run of the demo's config imports no `jax` from any dependency. A
stand-in `jax` package, which writes a file when imported, is put on the path of a fresh
Python process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

FAKE_JAX = {
    "__init__.py": """
        import os
        from pathlib import Path

        Path(os.environ["FAKE_JAX_MARKER"]).write_text("imported")
    """,
    "lax.py": """
        import numpy as np

        def top_k(x, k):  # JAX's: the k largest, in descending order
            x = np.asarray(x)
            i = np.argsort(-x, kind="stable")[:k]
            return x[i], i
    """,
}

QUERIES = ["glass river town", "mountain pass", "who founded the city", "zzzz qqq"]


def _search_code(import_jax_first: bool) -> str:
    """A program that builds and searches an index, and prints its hits and what it imported."""
    return textwrap.dedent(f"""
        import json, sys
        from pathlib import Path

        {"import jax" if import_jax_first else ""}
        from tracerl.envs.search import BM25Index, load_corpus

        index = BM25Index(load_corpus("synthetic"), cache=Path(sys.argv[1]))
        hits = index.search_many({QUERIES!r}, 5)
        print(json.dumps({{
            "hits": [[[h.doc.id, h.score] for h in q] for q in hits],
            "jax": sys.modules.get("jax") is not None,
            "jax_in_bm25s": sys.modules["bm25s.selection"].JAX_IS_AVAILABLE,
        }}))
    """)


@pytest.fixture
def fake_jax(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment whose Python finds the stand-in `jax`, and the file its import writes."""
    package = tmp_path / "site" / "jax"
    package.mkdir(parents=True)
    for name, source in FAKE_JAX.items():
        (package / name).write_text(textwrap.dedent(source))
    marker = tmp_path / "jax-was-imported"
    path = os.pathsep.join([str(package.parent), os.environ.get("PYTHONPATH", "")])
    env = {
        **os.environ,
        "PYTHONPATH": path,
        "FAKE_JAX_MARKER": str(marker),
        "TRACERL_CACHE": str(tmp_path / "cache"),
    }
    return env, marker


def _run(code: str, env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _in_process_hits(tmp_path: Path) -> list[list[list]]:
    from tracerl.envs.search import BM25Index, load_corpus

    index = BM25Index(load_corpus("synthetic"), cache=tmp_path / "here")
    return [[[h.doc.id, h.score] for h in q] for q in index.search_many(QUERIES, 5)]


def test_bm25s_alone_would_import_the_stand_in(fake_jax):
    """The stand-in is found: a plain ``import bm25s`` imports it (so the tests below can
    fail)."""
    env, marker = fake_jax
    out = _run("import bm25s; print(bm25s.selection.JAX_IS_AVAILABLE)", env)
    assert out.strip() == "True"
    assert marker.read_text() == "imported"


def test_building_and_searching_the_index_never_imports_jax(fake_jax, tmp_path):
    env, marker = fake_jax
    result = json.loads(_run(_search_code(False), env, str(tmp_path / "ix")))
    assert not marker.exists(), "building or searching the index imported jax"
    assert result["jax"] is False
    assert result["jax_in_bm25s"] is False
    # the same hits and scores as in this process (which has no JAX at all)
    assert result["hits"] == _in_process_hits(tmp_path)
    assert any(result["hits"]), "no query found anything: the comparison says nothing"


def test_a_jax_imported_before_stays_imported_and_unused(fake_jax, tmp_path):
    """A process that imported JAX itself keeps its module; bm25s still selects with numpy
    (where it would run JAX's top-k on the GPU)."""
    env, marker = fake_jax
    result = json.loads(_run(_search_code(True), env, str(tmp_path / "ix")))
    assert marker.read_text() == "imported"  # by the process itself, before the index
    assert result["jax"] is True
    assert result["jax_in_bm25s"] is False
    assert result["hits"] == _in_process_hits(tmp_path)


def test_a_whole_demo_run_never_imports_jax(fake_jax, tmp_path):
    """Not the index alone: `tracerl train` of the demo's config (the search environment, its
    evaluations, checkpoints and the dashboard), shrunk to tiny-random and one step, imports
    no `jax` from any dependency, so on a GPU image with JAX nothing but the run takes the
    GPU's memory."""
    env, marker = fake_jax
    overrides = [
        f"out_dir={tmp_path / 'runs'}",
        "model.spec=tiny-random",
        "warm_start=null",
        "trainer.steps=1",
        "trainer.group_size=2",
        "env.tasks_per_step=1",
        "env.eval_tasks=2",
        "env.adversarial_eval_tasks=2",
        "rollout.max_turn_tokens=8",
    ]
    tracerl = str(Path(sys.executable).with_name("tracerl"))
    done = subprocess.run(
        [tracerl, "train", "configs/demo.yaml", *overrides],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    run = tmp_path / "runs" / "demo-search"
    assert (run / "report" / "index.html").is_file() and any((run / "episodes").iterdir())
    assert not marker.exists(), "something in `tracerl train` imported jax"
