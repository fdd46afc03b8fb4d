"""Which of the carried wheels this Python needs (for `make gpu-check` on a GPU machine).

A wheel is picked when its distribution is not installed here, or is installed at an older
version than the wheel's: the image's own copy is kept when it is as new or newer (its
torch, numpy, ... are built for its CUDA, and an older pin of ours must not replace them).

Usage: python benchmarks/gpu_tools/pick_wheels.py WHEEL_DIR
Prints the picked wheels' paths on stdout, one a line, and one line per wheel on stderr
saying what was decided and why.
"""

from __future__ import annotations

import importlib.metadata as md
import re
import sys
from pathlib import Path


def newer(a: str, b: str) -> bool:
    """Is version `a` newer than `b`? (`packaging`'s order where it is installed, else the
    leading release numbers': 5.25.0 > 5.17.0, 2.13.0+cpu == 2.13.0.)"""
    try:
        from packaging.version import InvalidVersion, Version
    except ImportError:
        pass
    else:
        try:
            return Version(a) > Version(b)
        except InvalidVersion:
            return False

    def release(v: str) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:4])

    return release(a) > release(b)


def canonical(name: str) -> str:
    """PEP 503's normalised name: `typing_extensions` and `Typing-Extensions` are one."""
    return re.sub(r"[-_.]+", "-", name).lower()


def installed() -> dict[str, str]:
    """Every distribution this Python sees, by canonical name, with its version."""
    found: dict[str, str] = {}
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(canonical(name), dist.version)
    return found


def decide(wheel: Path, have: dict[str, str]) -> tuple[bool, str]:
    """(install it?, why) for one wheel file `NAME-VERSION-...whl`."""
    name, version = wheel.name.split("-")[:2]
    current = have.get(canonical(name))
    if current is None:
        return True, f"{name} {version}: missing here, installing"
    if newer(version, current):
        return True, f"{name} {version}: here {current} is older, installing"
    return False, f"{name} {version}: here {current}, kept"


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    have = installed()
    for wheel in sorted(Path(sys.argv[1]).glob("*.whl")):
        pick, why = decide(wheel, have)
        print(f"pick_wheels: {why}", file=sys.stderr)
        if pick:
            print(wheel)


if __name__ == "__main__":
    main()
