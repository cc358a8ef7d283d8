"""nano-init as PID 1 (issue 3 "PID 1 duties"), with real processes, in PID and network
namespaces created per test with unshare(1). No traffic leaves these namespaces.

`nano-init supervise` (the microVM tier's PID 1, whose egress the guest's nftables hold) does
the same duties with no network set-up at all, so its tests run it in the host's network
namespace: it must touch no network there."""

import os
import pathlib
import signal
import stat
import struct
import subprocess
import time

import pytest

import boxlib
from nano_fixtures import (NANO_INIT, NOT_BUILT, dummy_boundary, nano, nano_command,  # noqa: F401
                           nano_has_netstack, nano_tmp, require_nano, run_nano)


def _elf_type_and_segments(path):
    """(e_type, [p_type, …]) of a 64-bit little-endian ELF file (elf(5))."""
    data = pathlib.Path(path).read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, "not a 64-bit LE ELF"
    e_type = struct.unpack_from("<H", data, 16)[0]
    phoff = struct.unpack_from("<Q", data, 32)[0]
    phentsize, phnum = struct.unpack_from("<HH", data, 54)
    return e_type, [struct.unpack_from("<I", data, phoff + i * phentsize)[0]
                    for i in range(phnum)]


def test_binary_is_a_static_pie():
    """No interpreter (nothing to load in an image that holds only nano-init) and position
    independent, so the kernel maps the sandbox's PID 1, which parses every packet the agent
    sends, at a random address (ASLR) rather than at a fixed one."""
    require_nano()
    r = subprocess.run(["ldd", str(NANO_INIT)], capture_output=True, text=True)
    assert "statically linked" in (r.stdout + r.stderr), r.stdout + r.stderr
    e_type, segments = _elf_type_and_segments(NANO_INIT)
    pt_interp, pt_dynamic, et_dyn = 3, 2, 3
    assert pt_interp not in segments, "nano-init asks for a dynamic loader"
    assert e_type == et_dyn and pt_dynamic in segments, "nano-init is not position independent"


def test_help_and_version():
    require_nano()
    r = subprocess.run([str(NANO_INIT), "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("nano-init "), r
    r = subprocess.run([str(NANO_INIT), "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "run" in r.stdout and "copy" in r.stdout
    assert "supervise" in r.stdout


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


# What no egress rule can see stays shut for the agent (src/nano-init/agent_filter.h): a user
# namespace (its own nf_tables and netlink), an AF_VSOCK socket (outside every netns); forks,
# threads and subprocesses still work (clone3 answers ENOSYS and glibc falls back to clone).
FILTER_PROBE = r"""
import ctypes, os, socket, subprocess, threading
out = []
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x10000000) == 0:  # CLONE_NEWUSER
    out.append("userns OPEN")
else:
    out.append(f"userns errno {ctypes.get_errno()}")
try:
    socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    out.append("vsock OPEN")
except OSError as e:
    out.append(f"vsock errno {e.errno}")
t = threading.Thread(target=lambda: out.append("thread ok"))
t.start()
t.join()
out.append("fork " + str(subprocess.run(["sh", "-c", "exit 3"]).returncode))
print(";".join(out))
"""
FILTER_EXPECTED = "userns errno 1;vsock errno 97;thread ok;fork 3"


def test_agent_gets_no_user_namespace_and_no_vsock(nano, dummy_boundary):
    r = run_nano(dummy_boundary.path, ["python3", "-c", FILTER_PROBE])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == FILTER_EXPECTED, r.stdout
    # Also through unshare(1), as an agent would try it.
    r = run_nano(dummy_boundary.path, ["unshare", "-Ur", "true"])
    assert r.returncode != 0 and "Operation not permitted" in r.stderr, r


def test_nano_init_takes_descriptors_for_its_flows_and_the_agent_keeps_its_limit(
        nano, dummy_boundary):
    """Started at a soft nofile of 1024 (a guest's), nano-init ran out of descriptors near 500
    flows over HTTP/2 (a socketpair each): it raises its own limit as far as it may (here to
    the hard limit: root on this host lacks CAP_SYS_RESOURCE; a microVM guest's root has it),
    and gives the agent the one it was started with."""
    script = "grep 'open files' /proc/1/limits; ulimit -Sn; ulimit -Hn"
    r = subprocess.run(nano_command(dummy_boundary.path, ["sh", "-c", script],
                                    prefix=["prlimit", "--nofile=1024:16384", "--"]),
                       capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    limits, soft, hard = r.stdout.splitlines()
    assert limits.split()[3:5] == ["16384", "16384"], limits  # nano-init, PID 1
    assert (soft, hard) == ("1024", "16384"), r.stdout  # the agent


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


# ---------------------------------------------------------------------------------------
# nano-init supervise: PID 1 duties, no network set-up (no namespace, tun0, netstack, resolv.conf)

NOBODY = 65534


def supervise_command(cmd, user=(NOBODY, NOBODY), pidns=False):
    """argv that runs `nano-init supervise --user UID:GID CMD…` in the host's network namespace
    (as PID 1 of a new PID namespace if pidns, else as a subreaper)."""
    wrap = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"] if pidns else []
    flags = ["--user", f"{user[0]}:{user[1]}"] if user else []
    return [*wrap, str(NANO_INIT), "supervise", *flags, *cmd]


def run_supervise(cmd, timeout=30, **kw):
    return subprocess.run(supervise_command(cmd, **kw), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def sup_dir(nano_tmp):
    """A directory the agent (uid 65534) can write its pid and readiness files in."""
    require_nano()
    if os.geteuid() != 0:
        pytest.skip("nano-init supervise --user needs root")
    d = nano_tmp / "supervise"
    d.mkdir()
    os.chown(d, NOBODY, NOBODY)
    return d


def test_supervise_runs_the_agent_as_the_user_with_no_capability_or_group(sup_dir):
    r = run_supervise(["sh", "-c", "grep -E '^(Uid|Gid|Groups|CapEff|CapPrm|CapInh|CapBnd|"
                       "CapAmb|NoNewPrivs):' /proc/self/status"])
    assert r.returncode == 0, r.stderr
    fields = dict(line.split(":", 1) for line in r.stdout.splitlines() if line)
    fields = {k: v.strip() for k, v in fields.items()}
    assert fields["Uid"].split() == [str(NOBODY)] * 4, fields["Uid"]
    assert fields["Gid"].split() == [str(NOBODY)] * 4, fields["Gid"]
    assert fields["Groups"] == "", f"supplementary groups: {fields['Groups']!r}"
    for key in ("CapEff", "CapPrm", "CapInh", "CapBnd", "CapAmb"):
        assert int(fields[key], 16) == 0, f"{key} = {fields[key]}"
    assert fields["NoNewPrivs"] == "1"


def test_supervise_gives_the_agent_no_user_namespace_and_no_vsock(sup_dir):
    r = run_supervise(["python3", "-c", FILTER_PROBE])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == FILTER_EXPECTED, r.stdout


def test_supervise_touches_no_network(sup_dir):
    """Same network and mount namespaces as its launcher, no tun0 anywhere, resolv.conf as it
    was: everything network is the launcher's (the guest's nftables), not nano-init's."""
    before_links = set(os.listdir("/sys/class/net"))
    before_resolv = open("/etc/resolv.conf").read() if os.path.exists("/etc/resolv.conf") else None
    r = run_supervise(["sh", "-c", "readlink /proc/self/ns/net /proc/self/ns/mnt; "
                       "ls /sys/class/net"])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split()
    assert lines[:2] == [os.readlink("/proc/self/ns/net"), os.readlink("/proc/self/ns/mnt")]
    assert set(lines[2:]) == before_links  # no tun0 (nor any link) made
    assert set(os.listdir("/sys/class/net")) == before_links
    if before_resolv is not None:
        assert open("/etc/resolv.conf").read() == before_resolv
    assert r.stderr == "", r.stderr


def test_supervise_exit_status_propagates(sup_dir):
    assert run_supervise(["sh", "-c", "exit 7"]).returncode == 7
    assert run_supervise(["true"]).returncode == 0
    r = run_supervise(["sh", "-c", "kill -TERM $$"])
    assert r.returncode == 128 + signal.SIGTERM, r.stderr
    assert run_supervise(["/nonexistent/agent"]).returncode == 127


def test_supervise_passes_words_after_cmd_through(sup_dir):
    r = run_supervise(["sh", "-c", 'echo "$@"', "sh", "--help", "--user", "0:0"])
    assert r.returncode == 0, r.stderr
    assert r.stdout == "--help --user 0:0\n"


@pytest.mark.parametrize("pidns", [False, True], ids=["subreaper", "pid1"])
def test_supervise_kills_setsid_orphans_and_returns_the_childs_status(sup_dir, pidns):
    """The agent exits 5 leaving a setsid'd orphan that ignores SIGTERM: nano-init must kill it
    (SIGKILL after the grace period), reap it, and then exit 5."""
    pidfile = sup_dir / f"orphan-{'pid1' if pidns else 'subreaper'}.pid"
    script = (f"setsid sh -c 'trap \"\" TERM; echo $$ > {pidfile}; "
              "while :; do sleep 1; done' & "
              f"while [ ! -s {pidfile} ]; do sleep 0.01; done; exit 5")
    start = time.monotonic()
    r = run_supervise(["sh", "-c", script], pidns=pidns)
    assert r.returncode == 5, r.stderr
    assert time.monotonic() - start < 10
    if not pidns:  # its pid is ours too: it must be gone, not a zombie
        pid = int(pidfile.read_text())
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_supervise_forwards_sigterm(sup_dir):
    ready = sup_dir / "sigterm-ready"
    script = f"touch {ready}; while :; do sleep 0.05; done"
    p = subprocess.Popen(supervise_command(["sh", "-c", script]), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        boxlib.wait_for(ready.exists, timeout=10, what="the agent to start")
        p.send_signal(signal.SIGTERM)  # p is nano-init itself here (no unshare)
        assert p.wait(timeout=10) == 128 + signal.SIGTERM
    finally:
        p.kill()
        p.wait()


def _gated(sup_dir, name, extra=(), then=""):
    """Starts `nano-init supervise --user nobody --gate-fd 3 EXTRA sh -c 'touch MARKER; THEN'`
    with a pipe's read end as its fd 3; returns (process, write end, marker). close_fds=False:
    the only descriptor it inherits besides stdio is that fd 3 (os.pipe() ends are
    close-on-exec)."""
    marker = sup_dir / name
    r, w = os.pipe()

    def as_fd3():
        os.dup2(r, 3)
        os.set_inheritable(3, True)

    p = subprocess.Popen([str(NANO_INIT), "supervise", "--user", f"{NOBODY}:{NOBODY}",
                          "--gate-fd", "3", *extra, "--", "sh", "-c", f"touch {marker}{then}"],
                         preexec_fn=as_fd3, close_fds=False, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, text=True)
    os.close(r)
    return p, w, marker


def _blocked_reading_fd3(pid):
    try:
        fields = pathlib.Path(f"/proc/{pid}/syscall").read_text().split()
    except OSError:
        return False
    return len(fields) > 1 and fields[0] == "0" and int(fields[1], 16) == 3  # read(3, …)


def test_supervise_gate_holds_the_agent_until_armed(sup_dir):
    p, w, marker = _gated(sup_dir, "gate-opened")
    try:
        boxlib.wait_for(lambda: _blocked_reading_fd3(p.pid), timeout=10,
                        what="nano-init to wait on its gate")
        assert not marker.exists()
        assert pathlib.Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().strip() == ""
        os.write(w, b"armed\n")
        os.close(w)
        w = -1
        out, err = p.communicate(timeout=10)
        assert p.returncode == 0, err
        assert marker.exists()
    finally:
        if w >= 0:
            os.close(w)
        p.kill()
        p.wait()


@pytest.mark.parametrize("line", [b"", b"ok\n", b"armed"], ids=["closed", "other", "no-newline"])
def test_supervise_gate_closed_unopened_never_starts_the_agent(sup_dir, line):
    p, w, marker = _gated(sup_dir, f"gate-refused-{len(line)}")
    try:
        os.write(w, line)
        os.close(w)
        _, err = p.communicate(timeout=10)
        assert p.returncode == 70, err
        assert "egress gate (fd 3)" in err and "the agent was not started" in err, err
        assert not marker.exists()
    finally:
        p.kill()
        p.wait()


def _holds_fd3(pid):
    try:
        return os.readlink(f"/proc/{pid}/fd/3").startswith("pipe:")
    except OSError:
        return False


@pytest.mark.parametrize("lifeline", [False, True], ids=["without", "with"])
def test_supervise_lifeline_stops_the_sandbox_once_the_launcher_is_gone(sup_dir, lifeline):
    """With --lifeline nano-init keeps the opened gate (never the agent): the launcher's end
    closing, as when a runner is killed with SIGKILL, stops the agent like SIGTERM would.
    Without it the gate is closed once open, and the agent goes on until told to end."""
    release = sup_dir / f"release-{lifeline}"
    p, w, marker = _gated(sup_dir, f"lifeline-{lifeline}", ["--lifeline"] if lifeline else [],
                          f"; while [ ! -e {release} ]; do sleep 0.05; done; exit 9")
    try:
        os.write(w, b"armed\n")
        boxlib.wait_for(marker.exists, timeout=10, what="the agent to start")
        agent = int(pathlib.Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()[0])
        assert not _holds_fd3(agent), "the agent inherited the gate"
        assert _holds_fd3(p.pid) == lifeline
        os.close(w)
        w = -1
        if lifeline:
            _, err = p.communicate(timeout=10)
            assert p.returncode == 128 + signal.SIGTERM, err
            assert "the launcher is gone" in err, err
        else:
            release.touch()
            _, err = p.communicate(timeout=10)
            assert p.returncode == 9, err
    finally:
        if w >= 0:
            os.close(w)
        p.kill()
        p.wait()


def test_supervise_gate_that_is_not_open_is_refused(sup_dir):
    marker = sup_dir / "gate-missing"
    r = run_supervise(["--gate-fd", "9", "touch", str(marker)])
    assert r.returncode == 70 and "egress gate (fd 9)" in r.stderr, r.stderr
    assert not marker.exists()


def test_supervise_refuses_bad_usage(sup_dir):
    marker = sup_dir / "must-not-exist"
    for args in (["supervise"], ["supervise", "--user", "65534", "touch", str(marker)],
                 ["supervise", "--user", "x:1", "touch", str(marker)],
                 ["supervise", "--user", "1:1"]):
        r = subprocess.run([str(NANO_INIT), *args], capture_output=True, text=True, timeout=30,
                           stdin=subprocess.DEVNULL)
        assert r.returncode == 2, (args, r)
        assert r.stderr, args
    assert not marker.exists()
