"""The cache builds each artefact once and never shares a half-written folder, however many
threads ask at the same moment (the cause of a first run differing from later ones)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tracerl.cache import building, save_folder_atomically


def test_concurrent_first_uses_build_once_and_all_read_the_same_folder(tmp_path):
    target = tmp_path / "indexes" / "thing"
    builds = []

    def use(i: int) -> str:
        with building(target):
            if not (target / "done").is_file():
                builds.append(i)

                def save(folder):
                    folder.mkdir()
                    time.sleep(0.2)  # slow enough for every other thread to arrive
                    (folder / "data").write_text("built by one")
                    (folder / "done").write_text("")

                save_folder_atomically(target, save)
            return (target / "data").read_text()

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(use, range(8)))
    assert len(builds) == 1 and got == ["built by one"] * 8
    assert sorted(p.name for p in target.parent.iterdir()) == [".thing.lock", "thing"]


def test_concurrent_writers_never_share_a_temporary_folder(tmp_path):
    """Without the lock, writers race, but each writes a folder of its own and the target
    is always one whole folder (before: one temporary name per process, and a writer could
    delete another's half-written files under it)."""
    target = tmp_path / "out"
    errors = []
    start = threading.Barrier(6)

    def write(i: int) -> None:
        def save(folder):
            folder.mkdir()
            start.wait()
            for n in range(20):
                (folder / f"f{n}").write_text(str(i))

        try:
            save_folder_atomically(target, save)
        except Exception as e:  # pragma: no cover - the failure this test guards against
            errors.append(e)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    values = {p.read_text() for p in target.iterdir()}
    assert len(values) == 1 and len(list(target.iterdir())) == 20  # one writer's whole folder
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary folder left


def test_a_failed_save_leaves_nothing_behind(tmp_path):
    target = tmp_path / "out"

    def save(folder):
        folder.mkdir()
        (folder / "half").write_text("x")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        save_folder_atomically(target, save)
    assert list(tmp_path.iterdir()) == []
