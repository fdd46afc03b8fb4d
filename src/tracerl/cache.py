"""The on-disk cache (`$TRACERL_CACHE`, default ``~/.cache/tracerl``): converted models,
tokenizers, retrieval indexes. Folders are written under a temporary name and renamed into
place, so a crash never leaves a half-written folder that a later run would trust."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any


def cache_dir() -> Path:
    """`$TRACERL_CACHE`, default ``~/.cache/tracerl``."""
    return Path(os.environ.get("TRACERL_CACHE") or "~/.cache/tracerl").expanduser()


def save_folder_atomically(target: Path, save: Callable[[Path], Any]) -> None:
    """Call `save(tmp)` on a temporary folder, then rename it to `target`."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    save(tmp)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
