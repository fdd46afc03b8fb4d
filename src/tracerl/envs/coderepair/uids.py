"""Host uids for sandboxes: one per running sandbox on the machine, so the process limit
(counted per uid) is that sandbox's alone, however many run at once in however many
processes."""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from pathlib import Path
from typing import Literal

UID_BASE, UID_SLOTS = 2_000_000, 4096  # host uids no account uses: one per live sandbox
UID_LOCKS = Path(tempfile.gettempdir()) / "tracerl-sandbox-uids"
"""One lock file per uid: a uid is taken while some process (of any tracerl run on this
machine: two trainings, Ray workers, test workers) holds its file locked, and freed when
that process lets go or dies."""
_uids_lock = threading.Lock()
_uids_in_use: set[int] = set()


@contextlib.contextmanager
def sandbox_uid():
    """A host uid of its own for each running sandbox, so the process limit (counted per
    uid) is this sandbox's alone, however many run at once, in however many processes."""
    with _uids_lock:
        uid, held = next(
            (UID_BASE + i, fd)
            for i in range(UID_SLOTS)
            if UID_BASE + i not in _uids_in_use and (fd := lock_uid(UID_BASE + i)) is not False
        )
        _uids_in_use.add(uid)
    try:
        yield uid
    finally:
        with _uids_lock:
            _uids_in_use.discard(uid)
            if held is not None:
                os.close(held)  # the lock goes with the descriptor


def lock_uid(uid: int) -> int | Literal[False] | None:
    """A descriptor holding `uid`'s lock file; False if another process holds it; None where
    no lock file can be made (then uids are unique within this process only)."""
    import fcntl

    try:
        UID_LOCKS.mkdir(mode=0o1777, exist_ok=True)
        fd = os.open(UID_LOCKS / str(uid), os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    except OSError:
        os.close(fd)
        return None
    return fd
