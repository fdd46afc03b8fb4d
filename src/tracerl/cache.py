"""The on-disk cache (`$TRACERL_CACHE`, default ``~/.cache/tracerl``): converted models,
tokenizers, retrieval indexes.

Two rules make a first run give the same results as a later one:

* a folder is written under a temporary name of its own (unique per process, thread and
  call) and renamed into place, so a crash never leaves a half-written folder that a later
  run would trust, and two writers never share a temporary folder;
* an artefact is built once: `building(target)` holds an exclusive lock on the target (a
  ``flock`` on a lock file beside it, which serialises threads and processes alike), so
  callers check for the artefact, and build it only if it is missing, under that lock.
  Without it, many episodes starting together each built the same index at once and
  deleted one another's half-written folders.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def cache_dir() -> Path:
    """`$TRACERL_CACHE`, default ``~/.cache/tracerl``."""
    return Path(os.environ.get("TRACERL_CACHE") or "~/.cache/tracerl").expanduser()


def _temporary_name(target: Path) -> Path:
    return target.with_name(
        f".{target.name}.tmp-{os.getpid()}-{threading.get_ident()}-{uuid.uuid4().hex[:8]}"
    )


def save_folder_atomically(target: Path, save: Callable[[Path], Any]) -> None:
    """Call `save(tmp)` on a temporary folder of this call's own, then rename it to `target`
    (replacing a folder already there)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary_name(target)
    try:
        save(tmp)
        tmp.mkdir(exist_ok=True)
        while True:
            shutil.rmtree(target, ignore_errors=True)
            try:
                os.replace(tmp, target)
                return
            except OSError as e:  # another writer put its folder there in between
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_text_atomically(path: Path, text: str) -> None:
    """Write a file under a temporary name of this call's own, then rename it into place."""
    write_bytes_atomically(path, text.encode())


def write_bytes_atomically(path: Path, data: bytes, *, durable: bool = False) -> None:
    """`write_text_atomically` for bytes. `durable`: the data and the rename are on disk
    when this returns (fsync of the file, then of its folder): a power cut leaves the old
    file or the new one, never a loss of both."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary_name(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    if durable:
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def building(target: Path) -> Iterator[None]:
    """Hold the exclusive build lock of a cached artefact (threads and processes alike).

    Use it around "load it if it is there, else build and save it", so that an artefact
    is built once however many callers need it at the same moment::

        with building(folder):
            if ready(folder): load(folder)
            else: build(); save_folder_atomically(folder, save)
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = target.with_name(f".{target.name}.lock")
    with open(lock, "a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
