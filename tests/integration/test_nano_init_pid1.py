"""nano-init as PID 1 (issue 3 "PID 1 duties"), with real processes, in PID and network
namespaces created per test with unshare(1). No traffic leaves these namespaces."""

import os
import signal
import stat
import subprocess
import time

import pytest

import boxlib
from nano_fixtures import (NANO_INIT, NOT_BUILT, dummy_boundary, nano, nano_command,  # noqa: F401
                           nano_has_netstack, nano_tmp, require_nano, run_nano)


def test_binary_is_static():
    require_nano()
    r = subprocess.run(["ldd", str(NANO_INIT)], capture_output=True, text=True)
    assert "not a dynamic executable" in (r.stdout + r.stderr), r.stdout + r.stderr


def test_help_and_version():
    require_nano()
    r = subprocess.run([str(NANO_INIT), "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("nano-init "), r
    r = subprocess.run([str(NANO_INIT), "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "run" in r.stdout and "copy" in r.stdout


def test_copy_makes_a_working_0755_copy(nano_tmp):
    require_nano()
    dest = nano_tmp / "copied-nano-init"
    old = os.umask(0o077)  # the mode must not depend on the umask
    try:
        r = subprocess.run([str(NANO_INIT), "copy", str(dest)], capture_output=True, text=True)
    finally:
        os.umask(old)
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(dest.stat().st_mode) == 0o755
    assert dest.read_bytes() == NANO_INIT.read_bytes()
    r = subprocess.run([str(dest), "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and "nano-init" in r.stdout


def test_bad_boundary_is_refused_before_anything_runs(nano_tmp):
    require_nano()
    marker = nano_tmp / "must-not-exist"
    r = subprocess.run(["unshare", "--net", str(NANO_INIT), "run", "vsock://1:1080", "touch",
                        str(marker)], capture_output=True, text=True)
    assert r.returncode != 0 and "vsock" in r.stderr
    assert not marker.exists()


def test_without_netstack_run_refuses(nano_has_netstack, dummy_boundary, nano_tmp):
    if nano_has_netstack:
        pytest.skip("this nano-init has its network stack")
    marker = nano_tmp / "ran"
    r = run_nano(dummy_boundary.path, ["touch", str(marker)])
    assert r.returncode != 0 and NOT_BUILT in r.stderr
    assert not marker.exists(), "the agent ran without its boundary"


def test_exit_status_propagates(nano, dummy_boundary):
    assert run_nano(dummy_boundary.path, ["sh", "-c", "exit 7"]).returncode == 7
    assert run_nano(dummy_boundary.path, ["true"]).returncode == 0
    r = run_nano(dummy_boundary.path, ["sh", "-c", "kill -TERM $$"])
    assert r.returncode == 128 + signal.SIGTERM, r.stderr
    assert run_nano(dummy_boundary.path, ["/nonexistent/agent"]).returncode == 127


def test_is_pid1_and_child_has_no_capabilities(nano, dummy_boundary):
    r = run_nano(dummy_boundary.path,
                 ["sh", "-c", "cat /proc/1/comm; grep -E '^(CapEff|CapPrm|CapBnd|CapAmb|"
                  "NoNewPrivs):' /proc/self/status"])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("\n")
    assert lines[0] == "nano-init"
    fields = dict(line.split(":\t") for line in lines[1:] if line)
    for key in ("CapEff", "CapPrm", "CapBnd", "CapAmb"):
        assert int(fields[key], 16) == 0, f"{key} = {fields[key]}"
    assert fields["NoNewPrivs"].strip() == "1"


def test_inherited_descriptors_do_not_reach_the_agent(nano, dummy_boundary):
    """A descriptor nano-init's launcher leaked (here a pipe at fd 47) must not cross into the
    agent: an open socket in the host's netns would be a way around tun0."""
    r_fd, w_fd = os.pipe()
    try:
        os.dup2(w_fd, 47, inheritable=True)
        r = subprocess.run(nano_command(dummy_boundary.path, ["sh", "-c", "ls /proc/$$/fd"]),
                           capture_output=True, text=True, timeout=30,
                           stdin=subprocess.DEVNULL, pass_fds=(47,))
    finally:
        os.close(47)
        os.close(r_fd)
        os.close(w_fd)
    assert r.returncode == 0, r.stderr
    fds = sorted(int(x) for x in r.stdout.split())
    assert 47 not in fds and fds[:3] == [0, 1, 2], fds


def test_orphan_is_reaped_within_one_second(nano, dummy_boundary):
    # The orphan exits 0.2 s after its parent died; 1 s later it must not be a zombie.
    script = ("sh -c 'sleep 0.2 & echo $!' > /tmp/orphan.$$; p=$(cat /tmp/orphan.$$); "
              "sleep 1.2; s=$(awk '{print $3}' /proc/$p/stat 2>/dev/null || echo gone); "
              "echo $s")
    r = run_nano(dummy_boundary.path, ["sh", "-c", script])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "gone", f"orphan state: {r.stdout!r}"


def test_setsid_grandchildren_are_gone_after_exit(nano, dummy_boundary, nano_tmp):
    """Not PID 1 here (no PID namespace), so nothing but nano-init can clean up: as a
    subreaper it must find and kill the setsid'd grandchild, even one ignoring SIGTERM."""
    pidfile = nano_tmp / "grandchild.pid"
    script = (f"setsid sh -c 'trap \"\" TERM; echo $$ > {pidfile}; "
              "while :; do sleep 1; done' & "
              f"while [ ! -s {pidfile} ]; do sleep 0.01; done; exit 5")
    start = time.monotonic()
    r = run_nano(dummy_boundary.path, ["sh", "-c", script], pidns=False)
    assert r.returncode == 5, r.stderr
    assert time.monotonic() - start < 10
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_sigterm_is_forwarded(nano, dummy_boundary, nano_tmp):
    ready = nano_tmp / "sigterm-ready"
    script = f"trap 'exit 42' TERM; touch {ready}; while :; do sleep 0.05; done"
    p = subprocess.Popen(nano_command(dummy_boundary.path, ["sh", "-c", script]),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        boxlib.wait_for(ready.exists, timeout=10, what="the agent to start")
        # nano-init is unshare's child; signal it directly (unshare does not forward).
        nano_pid = int(subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True,
                                      text=True).stdout.split()[0])
        os.kill(nano_pid, signal.SIGTERM)
        assert p.wait(timeout=10) == 42
    finally:
        p.kill()
        p.wait()
