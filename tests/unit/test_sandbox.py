"""The code-repair sandbox against hostile code: each attack blocked or contained, the host
unaffected, and the result the policy's (its code did it) — except when the sandbox itself
fails, which is the environment's."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tracerl.envs.coderepair.sandbox import Limits, bwrap_argv, run_sandboxed
from tracerl.types import Attribution

FAST = Limits(cpu_s=3, wall_s=10.0, output_bytes=20_000)


@pytest.fixture
def tree(tmp_path):
    """A work tree in a private folder (pytest's): the sandbox stages its own copy."""
    root = tmp_path / "repo"
    root.mkdir()
    (root / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    return root


def _run(tree: Path, code: str, limits: Limits = FAST):
    script = tree / "attack.py"
    script.write_text(code)
    return run_sandboxed(tree, ["/usr/bin/python3", "attack.py"], limits)


def _processes(uid: int) -> int:
    out = subprocess.run(["ps", "-o", "pid=", "-u", str(uid)], capture_output=True, text=True)
    return len(out.stdout.split())


def _settled(r) -> int:
    """Processes the sandbox's uid has left once the kernel has reaped its namespace (a
    bound far from what a busy machine needs: the reaping is not what is timed)."""
    for _ in range(600):
        if _processes(r.uid) == 0:
            return 0
        time.sleep(0.1)
    return _processes(r.uid)


def test_sandboxes_in_different_processes_never_share_a_uid():
    """Two runs on one machine (two trainings, Ray workers) each run sandboxes: a uid one
    process holds is never handed out by another, or one's fork bomb would exhaust the
    other's process limit."""
    from tracerl.envs.coderepair.uids import lock_uid, sandbox_uid

    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDS_A_UID],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        theirs = int(holder.stdout.readline())
        with sandbox_uid() as mine, sandbox_uid() as also_mine:
            assert len({theirs, mine, also_mine}) == 3
    finally:
        holder.communicate("done\n", timeout=60)
    freed = lock_uid(theirs)  # the other process has ended: its uid is free again
    assert isinstance(freed, int)
    os.close(freed)


HOLDS_A_UID = """
import sys
from tracerl.envs.coderepair.uids import sandbox_uid
with sandbox_uid() as uid:
    print(uid, flush=True)
    sys.stdin.readline()
"""


def test_code_runs_on_a_copy_of_the_tree_and_reports_its_output(tree):
    r = _run(tree, "import calc\nprint(calc.add(2, 3))\nopen('calc.py', 'w').write('x')\n")
    assert r.status == "ok" and r.output.strip() == "5" and r.owner is Attribution.POLICY
    assert "return a + b" in (tree / "calc.py").read_text()  # the source tree is untouched


def test_a_failing_command_is_the_policys_with_its_exit_code(tree):
    r = _run(tree, "raise SystemExit(3)")
    assert (r.status, r.returncode, r.limit) == ("failed", 3, None)
    assert r.owner is Attribution.POLICY


def test_no_network(tree):
    r = _run(tree, "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=3)\n")
    assert r.status == "failed" and "Network is unreachable" in r.output
    assert r.owner is Attribution.POLICY


def test_host_files_outside_the_tree_cannot_be_read(tree, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    os.chmod(secret, 0o644)  # readable by anyone on the host: the sandbox must still not see it
    os.chmod(tmp_path, 0o755)
    code = (
        "import os\n"
        f"for p in [{str(secret)!r}, '/etc/passwd', '/root', '/home']:\n"
        "    print(p, os.path.exists(p))\n"
        f"print(open({str(secret)!r}).read())\n"
    )
    r = _run(tree, code)
    assert r.status == "failed" and "host secret" not in r.output
    assert "FileNotFoundError" in r.output
    assert all(line.endswith("False") for line in r.output.splitlines()[:4])


def test_writes_outside_the_work_tree_never_reach_the_host(tree, tmp_path):
    target = tmp_path / "planted.txt"
    code = (
        "import os\n"
        "for p in ['/usr/planted', '/planted', " + repr(str(target)) + "]:\n"
        "    try:\n"
        "        open(p, 'w').write('x')\n"
        "        print(p, 'written')\n"
        "    except OSError as e:\n"
        "        print(p, type(e).__name__)\n"
    )
    r = _run(tree, code)
    assert r.status == "ok"
    assert not Path("/usr/planted").exists() and not Path("/planted").exists()
    assert not target.exists()  # a path the sandbox could create lives in its own tmpfs


def test_a_fork_bomb_is_contained_and_leaves_nothing_behind(tree):
    r = _run(tree, "import os\nwhile True:\n    os.fork()\n")
    assert r.status == "limit" and r.limit in ("processes", "cpu", "wall")
    assert r.owner is Attribution.POLICY
    assert _settled(r) == 0
    assert _run(tree, "print('still fine')").output.strip() == "still fine"


def test_an_output_flood_is_cut_at_the_cap(tree):
    r = _run(tree, "while True:\n    print('x' * 1000)\n")
    assert r.status == "limit" and r.limit == "output" and r.truncated
    assert len(r.output) <= FAST.output_bytes and r.owner is Attribution.POLICY
    assert _settled(r) == 0


def test_an_endless_loop_runs_out_of_cpu_time(tree):
    r = _run(tree, "while True:\n    pass\n")
    assert r.status == "limit" and r.limit == "cpu" and r.owner is Attribution.POLICY


def test_a_sleeping_hang_hits_the_wall_clock(tree):
    r = _run(tree, "import time\ntime.sleep(60)\n", Limits(cpu_s=3, wall_s=2.0))
    assert r.status == "limit" and r.limit == "wall" and r.wall_s < 10
    assert _settled(r) == 0


def test_memory_and_file_size_limits(tree):
    r = _run(tree, "x = bytearray(8 * 1024**3)\n")
    assert (r.status, r.limit) == ("limit", "memory")
    r = _run(tree, "open('big', 'wb').write(b'0' * (64 << 20))\n")
    assert (r.status, r.limit) == ("limit", "file_size")


def test_the_sandbox_failing_to_start_is_the_environments(tree, tmp_path):
    r = run_sandboxed(tree, ["true"], FAST, bwrap=str(tmp_path / "no-such-bwrap"))
    assert r.status == "sandbox_error" and r.owner is Attribution.ENVIRONMENT
    # bwrap refusing its arguments (a bad option) is also the sandbox's failure
    argv = bwrap_argv(tree, ["true"], FAST)
    bad = [argv[0], "--no-such-option", *argv[1:]]
    out = subprocess.run(bad, capture_output=True, text=True)
    assert out.returncode != 0 and out.stderr.startswith("bwrap:")


def test_a_sandbox_killed_from_outside_is_the_environments(tree):
    """The host killing the sandbox itself (bwrap, outside its namespaces: an operator, an
    OOM killer) is not the code's doing."""
    import threading

    def killer():
        for _ in range(100):  # wait for the payload to start, then kill bwrap from outside
            started = subprocess.run(["pgrep", "-f", r"^/bin/sleep 30\.25$"]).returncode == 0
            bwrap = [r"pkill", "-KILL", "-f", r"^\S*bwrap .*sleep 30\.25$"]
            if started and subprocess.run(bwrap).returncode == 0:
                return
            time.sleep(0.05)

    t = threading.Thread(target=killer)
    t.start()
    r = run_sandboxed(tree, ["/bin/sleep", "30.25"], FAST)
    t.join()
    assert r.status == "sandbox_error" and r.owner is Attribution.ENVIRONMENT
    assert "killed from outside" in r.detail


def test_code_cannot_pass_its_own_failure_off_as_the_sandboxs(tree):
    """Code that kills itself, or prints what bwrap prints when it fails, is still the
    policy's: whether the sandbox started is read from a pipe its start-up script writes
    before the code runs, never from the code's output or exit status."""
    for code in (
        "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
        "import os, signal\nos.killpg(0, signal.SIGKILL)\n",
        "print('bwrap: Can not mount tmpfs on /newroot')\nraise SystemExit(1)\n",
    ):
        r = _run(tree, code)
        assert r.status == "failed" and r.owner is Attribution.POLICY, (code, r)


def test_the_tracerl_package_is_masked_when_it_lives_under_usr(tree, monkeypatch):
    """Installed system-wide (a container image), tracerl would sit under the bound /usr,
    and its task templates hold the hidden tests: such folders are mounted over, empty."""
    from tracerl.envs.coderepair import sandbox

    monkeypatch.setattr(sandbox, "hidden_paths", lambda: [Path("/usr/share/doc")])
    code = "import os\nprint(len(os.listdir('/usr/share/doc')))\n"
    assert Path("/usr/share/doc").is_dir() and os.listdir("/usr/share/doc")
    assert _run(tree, code).output.strip() == "0"
    monkeypatch.undo()
    assert sandbox.hidden_paths() == []  # here tracerl lives in a virtual environment
    r = _run(tree, "import tracerl\n")
    assert r.status == "failed" and "No module named 'tracerl'" in r.output
