"""compass-runner's host tier (seed 002, "host"), with the real binary and real processes.

The agent runs as a child of the runner under the runner's uid: here uid 65534 (nobody), via
setpriv, with a private TMPDIR that nobody owns (seed 002: "set the Runner's TMPDIR to a
private directory"). Root is refused. Nothing here touches the network.
"""

import json
import os
import pathlib
import pty
import re
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time

import pytest

from boxlib import wait_for

REPO = pathlib.Path(__file__).resolve().parents[2]


def _binary(env, default):
    p = pathlib.Path(os.environ.get(env, REPO / default))
    return p if p.is_absolute() else REPO / p


RUNNER = _binary("COMPASS_RUNNER", "build/src/compass-runner/compass-runner")
NOBODY = 65534
AS_NOBODY = ["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups"]
BANNER = re.compile(r"compass-runner: agent (a[0-9a-f]{10}) running "
                    r"\(tier host, egress unenforced, pid (\d+)\)")


@pytest.fixture(autouse=True)
def _need_runner():
    if not RUNNER.exists():
        pytest.fail(f"compass-runner not found at {RUNNER} (cmake --build build)")


@pytest.fixture
def tmp_nobody():
    """A private directory owned by nobody (mode 0700): the runner's TMPDIR."""
    d = pathlib.Path(tempfile.mkdtemp(prefix="cr-host-"))
    os.chown(d, NOBODY, NOBODY)
    d.chmod(0o700)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def runner_env(tmpdir, **extra):
    env = {k: v for k, v in os.environ.items() if k != "COMPASS_RUNTIME_BACKEND"}
    env["TMPDIR"] = str(tmpdir)
    env.update(extra)
    return env


def runner(args, tmpdir, as_nobody=True, timeout=60, **extra_env):
    """Runs compass-runner to completion; returns the CompletedProcess."""
    cmd = (AS_NOBODY if as_nobody else []) + [str(RUNNER), *args]
    return subprocess.run(cmd, env=runner_env(tmpdir, **extra_env), cwd=tmpdir,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout)


def host_run(cmd, tmpdir, flags=(), **kw):
    return runner(["run", "--backend", "host", *flags, "--", *cmd], tmpdir, **kw)


def state_root(tmpdir):
    return pathlib.Path(tmpdir) / "compass-host"


def leftovers(tmpdir):
    root = state_root(tmpdir)
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def alive(pid):
    """True if pid is a process that has not exited (a zombie has)."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def agent_processes(sandbox_id):
    """Pids of live processes whose environment names this agent (as gc finds them)."""
    needle = f"COMPASS_AGENT_ID={sandbox_id}".encode()
    found = []
    for d in pathlib.Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if needle in (d / "environ").read_bytes().split(b"\0") and alive(int(d.name)):
                found.append(int(d.name))
        except OSError:
            pass
    return found


class HostAgent:
    """A runner started in the background (as nobody), its stderr collected by a thread."""

    def __init__(self, cmd, tmpdir, flags=()):
        self.tmpdir = tmpdir
        self.proc = subprocess.Popen(
            AS_NOBODY + [str(RUNNER), "run", "--backend", "host", *flags, "--", *cmd],
            env=runner_env(tmpdir), cwd=tmpdir, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.err_lines = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        m = wait_for(lambda: next((BANNER.search(l) for l in list(self.err_lines)
                                   if BANNER.search(l)), None) or self._died(),
                     timeout=20, what="the runner's banner")
        if m is True:
            raise AssertionError("runner ended before its banner:\n" + self.stderr)
        self.id, self.pid = m.group(1), int(m.group(2))

    def _read(self):
        for line in self.proc.stderr:
            self.err_lines.append(line)

    def _died(self):
        return self.proc.poll() is not None

    @property
    def stderr(self):
        return "".join(self.err_lines)

    @property
    def state_dir(self):
        return state_root(self.tmpdir) / self.id

    def wait(self, timeout=30):
        rc = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=5)
        return rc

    def end(self):
        """Ends the runner the way an operator would (SIGTERM: it stops and removes its
        agent; SIGKILL only if that did not work). Returns the pids the agent left behind,
        after killing them."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        # What the runner SIGKILLed on its way out may take a moment to be gone.
        try:
            wait_for(lambda: not agent_processes(self.id), timeout=5, what="agent processes")
        except AssertionError:
            pass
        left = agent_processes(self.id)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        return left


@pytest.fixture
def agents():
    """Factory for HostAgent; kills any runner a failed test left."""
    made = []

    def make(*a, **kw):
        agent = HostAgent(*a, **kw)
        made.append(agent)
        return agent

    yield make
    left = {a.id: a.end() for a in made}
    assert all(not pids for pids in left.values()), f"agents left processes behind: {left}"


def roster(tmpdir, as_nobody=True):
    r = runner(["agents", "--json"], tmpdir, as_nobody=as_nobody)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


# ---------------------------------------------------------------------------------------
# Root is refused


@pytest.mark.parametrize("extra_env", [
    {},
    {"USER": "nobody", "LOGNAME": "nobody", "HOME": "/nonexistent", "SUDO_UID": "65534"},
], ids=["plain", "environment-claims-nobody"])
def test_root_is_refused_whatever_the_environment_says(tmp_path, extra_env):
    marker = tmp_path / "ran"
    r = host_run(["touch", str(marker)], tmp_path, as_nobody=False, **extra_env)
    assert r.returncode == 2, r.stderr
    assert "refuses to run as root (uid 0)" in r.stderr
    assert "--backend podman" in r.stderr
    assert not marker.exists()
    assert leftovers(tmp_path) == []


def test_root_is_refused_when_the_environment_selects_host(tmp_path):
    r = runner(["run", "--", "true"], tmp_path, as_nobody=False, COMPASS_RUNTIME_BACKEND="host")
    assert r.returncode == 2
    assert "refuses to run as root" in r.stderr


# ---------------------------------------------------------------------------------------
# What the agent gets


def test_agent_runs_as_the_runners_uid_with_its_own_home_and_tmpdir(tmp_nobody):
    script = ("echo HOME=$HOME; echo TMPDIR=$TMPDIR; echo ID=$COMPASS_AGENT_ID; "
              "echo EGRESS=$COMPASS_EGRESS_POSTURE; echo UID=$(id -u); "
              "echo MODE=$(stat -c %a \"$HOME/..\"); touch \"$HOME/x\" \"$TMPDIR/y\" && "
              "echo WRITABLE=yes; echo STDIN=$(readlink /proc/self/fd/0); "
              "echo CONFIG=$(cat \"$COMPASS_AGENT_CONFIG/spec.json\" | tr -d ' \\n'); "
              "echo to-stderr >&2")
    r = host_run(["sh", "-c", script], tmp_nobody)
    assert r.returncode == 0, r.stderr
    m = BANNER.search(r.stderr)
    assert m, r.stderr
    sid = m.group(1)
    out = dict(line.split("=", 1) for line in r.stdout.splitlines())
    state = state_root(tmp_nobody) / sid
    assert out["HOME"] == str(state / "home")
    assert out["TMPDIR"] == str(state / "tmp")
    assert out["ID"] == sid
    assert out["EGRESS"] == "unenforced"
    assert out["UID"] == str(NOBODY)
    assert out["MODE"] == "700"
    assert out["WRITABLE"] == "yes"
    assert out["STDIN"] == "/dev/null"
    assert '"egress":"unenforced"' in out["CONFIG"] and '"tier":"host"' in out["CONFIG"]
    # The agent's stderr is relayed to the runner's stderr, its stdout to stdout.
    assert "to-stderr" in r.stderr.splitlines() and "to-stderr" not in r.stdout.splitlines()
    # Torn down: nothing of the agent is left.
    assert leftovers(tmp_nobody) == []


def test_agent_sees_no_operator_terminal(tmp_nobody):
    """The runner has a terminal on stdin/stdout/stderr; the agent must not see it."""
    master, slave = pty.openpty()
    os.fchown(slave, NOBODY, NOBODY)
    script = ("test -t 0 && echo T0=tty || echo T0=no; test -t 1 && echo T1=tty || echo T1=no; "
              "test -t 2 && echo T2=tty || echo T2=no; "
              "(exec 3</dev/tty) 2>/dev/null && echo CTTY=yes || echo CTTY=no; "
              "echo SID=$(ps -o sid= -p $$ | tr -d ' ') PID=$$")
    # setsid -c makes the pty the runner's controlling terminal, as an operator's shell would.
    proc = subprocess.Popen(
        ["setsid", "-c", "-w"] + AS_NOBODY +
        [str(RUNNER), "run", "--backend", "host", "--", "sh", "-c", script],
        env=runner_env(tmp_nobody), cwd=tmp_nobody, stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    output = b""
    while True:
        r, _, _ = select.select([master], [], [], 20)
        if not r:
            break
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the last writer closed the terminal
            break
        if not chunk:
            break
        output += chunk
    rc = proc.wait(timeout=20)
    os.close(master)
    text = output.decode(errors="replace")
    assert rc == 0, text
    assert "T0=no" in text and "T1=no" in text and "T2=no" in text, text
    assert "CTTY=no" in text, text
    m = re.search(r"SID=(\d+) PID=(\d+)", text)
    assert m and m.group(1) == m.group(2), text  # a session of its own


def test_agent_working_directory(tmp_nobody):
    work = tmp_nobody / "work"
    work.mkdir()
    os.chown(work, NOBODY, NOBODY)
    r = host_run(["pwd"], tmp_nobody, flags=["--workdir", str(work)])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(work)
    r = host_run(["pwd"], tmp_nobody)  # default: the runner's own directory
    assert r.stdout.strip() == str(tmp_nobody)


def test_bundle_without_egress_is_a_read_only_config_view(tmp_nobody):
    bundle = tmp_nobody / "bundle.yaml"
    bundle.write_text("version: v1\nagent:\n  id: researcher-1.example\n")
    bundle.chmod(0o644)
    script = ('cat "$COMPASS_AGENT_CONFIG/bundle.yaml"; echo NAME=$COMPASS_AGENT_NAME; '
              'echo more >> "$COMPASS_AGENT_CONFIG/bundle.yaml" 2>/dev/null '
              '&& echo WROTE || echo READONLY')
    r = host_run(["sh", "-c", script], tmp_nobody, flags=["--bundle", str(bundle)])
    assert r.returncode == 0, r.stderr
    assert "id: researcher-1.example" in r.stdout
    assert "NAME=researcher-1.example" in r.stdout
    assert "READONLY" in r.stdout


# ---------------------------------------------------------------------------------------
# Exit status and banner


@pytest.mark.parametrize("script,status", [
    ("exit 0", 0), ("exit 3", 3), ("exit 255", 255),
    ("kill -TERM $$", 128 + signal.SIGTERM), ("kill -KILL $$", 128 + signal.SIGKILL),
])
def test_exit_status_is_the_agents(tmp_nobody, script, status):
    r = host_run(["sh", "-c", script], tmp_nobody)
    assert r.returncode == status, r.stderr


def test_banner_says_plainly_that_egress_is_not_enforced(tmp_nobody):
    r = host_run(["true"], tmp_nobody)
    assert r.returncode == 0
    assert "egress is NOT enforced" in r.stderr
    assert "--backend podman" in r.stderr
    m = BANNER.search(r.stderr)
    assert m, r.stderr
    # The warning comes before the agent runs, not after.
    assert r.stderr.index("egress is NOT enforced") < m.start()


def test_an_argument_that_is_not_utf8_reaches_the_agent(tmp_nobody):
    """An argument is any bytes (from a hostile review: the tier refused a start with a JSON
    error, after its banner); the agent gets them as given."""
    r = host_run(["sh", "-c", 'printf %s "$1" | od -An -tx1', "x", "\udcff\udcfe"], tmp_nobody)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ff", "fe"], r.stdout


def test_missing_program_cannot_start(tmp_nobody):
    r = host_run(["no-such-agent-program"], tmp_nobody)
    assert r.returncode == 70, r.stderr
    assert "cannot start agent" in r.stderr and "no-such-agent-program" in r.stderr
    assert leftovers(tmp_nobody) == []


def test_background_processes_of_the_agent_go_with_it(tmp_nobody):
    pidfile = tmp_nobody / "bg.pid"
    r = host_run(["sh", "-c", f"sleep 1000 & echo $! > {pidfile}; echo started"], tmp_nobody,
                 timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "started"
    bg = int(pidfile.read_text())
    wait_for(lambda: not alive(bg), timeout=10, what="the agent's background sleep to end")


# ---------------------------------------------------------------------------------------
# Egress policy: refused, never ignored


@pytest.mark.parametrize("flags,named", [
    (["--egress-allow", "x.example"], "--egress-allow"),
    (["--egress-allow", ""], "--egress-allow"),
    (["--egress", "firewall"], "--egress firewall"),
    (["--egress", "boundary"], "--egress boundary"),
], ids=["allow-x", "allow-empty", "egress-firewall", "egress-boundary"])
def test_configured_egress_policy_is_refused(tmp_nobody, flags, named):
    marker = tmp_nobody / "ran"
    r = host_run(["touch", str(marker)], tmp_nobody, flags=flags)
    assert r.returncode == 2, r.stderr
    assert "cannot enforce egress" in r.stderr
    assert named in r.stderr
    assert "--backend podman" in r.stderr
    assert not marker.exists()
    assert leftovers(tmp_nobody) == []


@pytest.mark.parametrize("egress", ["egress:\n  allow: [api.example.com]\n", "egress: {}\n"],
                         ids=["with-names", "empty-section"])
def test_bundle_with_egress_section_is_refused(tmp_nobody, egress):
    bundle = tmp_nobody / "bundle.yaml"
    bundle.write_text("version: v1\nagent:\n  id: researcher-1.example\n" + egress)
    bundle.chmod(0o644)
    marker = tmp_nobody / "ran"
    r = host_run(["touch", str(marker)], tmp_nobody, flags=["--bundle", str(bundle)])
    assert r.returncode == 2, r.stderr
    assert "cannot enforce egress" in r.stderr
    assert "bundle's `egress` section" in r.stderr
    assert "--backend podman" in r.stderr
    assert not marker.exists()


@pytest.mark.parametrize("flags", [["--memory", "64m"], ["--cpus", "1"], ["--pids", "10"],
                                   ["--image", "localhost/x"], ["--rootfs", "/"],
                                   ["--sidecar-socket", "/tmp/x.sock"]])
def test_sandbox_only_flags_are_refused_not_ignored(tmp_nobody, flags):
    r = host_run(["true"], tmp_nobody, flags=flags)
    assert r.returncode == 2, r.stderr
    assert flags[0] in r.stderr
    assert "--backend podman" in r.stderr


# ---------------------------------------------------------------------------------------
# Roster: agents, resize, stop, signals, gc


def test_agents_lists_the_running_host_agent_as_unenforced(tmp_nobody, agents):
    a = agents(["sh", "-c", "sleep 1000"], tmp_nobody)
    for as_nobody in (True, False):  # the operator, and root looking at the same TMPDIR
        entries = [e for e in roster(tmp_nobody, as_nobody) if e["id"] == a.id]
        assert len(entries) == 1
        e = entries[0]
        assert e["tier"] == "host"
        assert e["egress"] == "unenforced"
        assert e["pid"] == a.pid
        assert e["runner_pid"] == a.proc.pid
        assert e["allowed"] is None and e["denied"] is None
        assert isinstance(e["uptime_s"], int) and e["uptime_s"] >= 0
        assert e["command"] == ["sh", "-c", "sleep 1000"]
    # The pid is the agent's: its environment carries its id.
    environ = pathlib.Path(f"/proc/{a.pid}/environ").read_bytes().split(b"\0")
    assert f"COMPASS_AGENT_ID={a.id}".encode() in environ

    r = runner(["agents"], tmp_nobody)
    assert r.returncode == 0
    header, *rows = r.stdout.splitlines()
    assert header.split() == ["ID", "TIER", "EGRESS", "PID", "UPTIME", "ALLOWED", "DENIED",
                              "COMMAND"]
    row = next(line for line in rows if line.startswith(a.id))
    assert row.split()[:4] == [a.id, "host", "unenforced", str(a.pid)]
    assert row.split()[5:7] == ["-", "-"]
    assert row.endswith("sh -c 'sleep 1000'")


def test_the_roster_shows_control_characters_escaped(tmp_nobody, agents):
    """From a hostile review: a newline or an escape in the agent's command drew a fake row in
    `agents` or drove the operator's terminal. Such a word is shown as $'…'."""
    a = agents(["sh", "-c", "sleep 1000", "x", "a\nFAKE host unenforced\x1b[31m'\\"], tmp_nobody)
    r = runner(["agents"], tmp_nobody)
    assert r.returncode == 0
    assert "\x1b" not in r.stdout
    rows = [line for line in r.stdout.splitlines() if "FAKE" in line]
    assert len(rows) == 1 and rows[0].startswith(a.id), r.stdout
    assert rows[0].endswith("x $'a\\x0aFAKE host unenforced\\x1b[31m\\'\\\\'"), rows[0]


def test_resize_is_refused_on_the_host_tier(tmp_nobody, agents):
    a = agents(["sleep", "1000"], tmp_nobody)
    r = runner(["resize", a.id, "--memory", "64m"], tmp_nobody)
    assert r.returncode == 1
    assert "no cgroup" in r.stderr and a.id in r.stderr
    assert a.proc.poll() is None  # the agent is untouched


def test_stop_ends_the_agent_and_its_record(tmp_nobody, agents):
    a = agents(["sh", "-c", "sleep 1000"], tmp_nobody)
    r = runner(["stop", a.id], tmp_nobody)
    assert r.returncode == 0, r.stderr
    # stop returns once the runner is gone: no wait needed for anything below.
    assert a.proc.poll() is not None
    assert a.wait() == 128 + signal.SIGTERM
    assert "received SIGTERM" in a.stderr
    assert not alive(a.pid)
    assert not a.state_dir.exists()
    assert all(e["id"] != a.id for e in roster(tmp_nobody))


def test_stop_gives_the_agent_its_sigterm_first(tmp_nobody, agents):
    script = "trap 'echo cleaned-up; exit 7' TERM; while :; do sleep 0.1; done"
    a = agents(["sh", "-c", script], tmp_nobody)
    r = runner(["stop", a.id], tmp_nobody, as_nobody=False)  # root may stop it too
    assert r.returncode == 0, r.stderr
    assert a.wait() == 7
    assert "cleaned-up" in a.proc.stdout.read()


def test_stop_unknown_id_is_an_error_naming_it(tmp_nobody):
    r = runner(["stop", "a0000000000"], tmp_nobody)
    assert r.returncode == 1
    assert '"a0000000000"' in r.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_signal_to_the_runner_stops_the_agent(tmp_nobody, agents, sig):
    a = agents(["sh", "-c", "sleep 1000"], tmp_nobody)
    os.kill(a.proc.pid, sig)
    assert a.wait() == 128 + signal.SIGTERM
    assert f"received {signal.Signals(sig).name}" in a.stderr
    assert not alive(a.pid)
    assert not a.state_dir.exists()


def test_gc_removes_what_a_killed_runner_left(tmp_nobody, agents):
    pids = tmp_nobody / "pids"
    pids.touch()
    os.chown(pids, NOBODY, NOBODY)
    a = agents(["sh", "-c", f"sleep 1000 & echo $! >> {pids}; sleep 1001 & echo $! >> {pids}; "
                "echo $$ >> {pids}; wait".replace("{pids}", str(pids))], tmp_nobody)
    wait_for(lambda: len(pids.read_text().split()) == 3, timeout=10, what="the agent's pids")
    agent_pids = [int(p) for p in pids.read_text().split()]
    os.kill(a.proc.pid, signal.SIGKILL)
    a.wait()
    # The runner is gone; its agent's shell died with it (PDEATHSIG), its children did not.
    assert a.state_dir.exists()
    assert all(e["id"] != a.id for e in roster(tmp_nobody))
    assert any(alive(p) for p in agent_pids)
    # ...but `agents` says there is something to collect.
    r = runner(["agents"], tmp_nobody)
    assert r.returncode == 0 and a.id in r.stderr and "compass-runner gc" in r.stderr, r.stderr

    r = runner(["gc"], tmp_nobody)
    assert r.returncode == 0, r.stderr
    assert f"removed agent {a.id}" in r.stdout
    assert not a.state_dir.exists()
    wait_for(lambda: not any(alive(p) for p in agent_pids), timeout=10,
             what="the dead runner's agent processes to be killed")
    # Idempotent: nothing left to say about it.
    r = runner(["gc"], tmp_nobody)
    assert r.returncode == 0 and a.id not in r.stdout


def test_gc_leaves_live_agents_alone(tmp_nobody, agents):
    a = agents(["sleep", "1000"], tmp_nobody)
    r = runner(["gc"], tmp_nobody)
    assert r.returncode == 0
    assert a.id not in r.stdout
    assert a.proc.poll() is None and a.state_dir.exists()


# ---------------------------------------------------------------------------------------
# The state root


def test_state_root_shared_with_others_is_refused(tmp_nobody):
    root = state_root(tmp_nobody)
    root.mkdir()
    os.chown(root, NOBODY, NOBODY)
    root.chmod(0o777)
    r = host_run(["true"], tmp_nobody)
    assert r.returncode == 70
    assert "group- or world-writable" in r.stderr
    root.chmod(0o755)
    os.chown(root, 0, 0)
    r = host_run(["true"], tmp_nobody)
    assert r.returncode == 70
    assert "owned by uid 0" in r.stderr and "TMPDIR" in r.stderr
    # No agent is about to run: no warning about one that would have had no egress control.
    assert "NOT enforced" not in r.stderr, r.stderr


def test_the_state_root_goes_with_the_last_agent_in_it(tmp_nobody):
    """$TMPDIR/compass-host left behind in a shared /tmp, owned by its user, refuses every other
    user's host-tier start (from a new-user trial): it is removed once empty, and kept while
    another agent of the same user is in it."""
    r = host_run(["true"], tmp_nobody)
    assert r.returncode == 0, r.stderr
    assert not state_root(tmp_nobody).exists()

    long_lived = subprocess.Popen(
        AS_NOBODY + [str(RUNNER), "run", "--backend", "host", "--", "sleep", "30"],
        env=runner_env(tmp_nobody), cwd=tmp_nobody, stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while len(leftovers(tmp_nobody)) != 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(leftovers(tmp_nobody)) == 1
        r = host_run(["true"], tmp_nobody)
        assert r.returncode == 0, r.stderr
        assert len(leftovers(tmp_nobody)) == 1, "the root went while an agent was in it"
    finally:
        long_lived.terminate()
        long_lived.wait(timeout=30)
    assert not state_root(tmp_nobody).exists()


def test_state_root_symlink_is_refused(tmp_nobody):
    elsewhere = tmp_nobody / "elsewhere"
    elsewhere.mkdir()
    os.chown(elsewhere, NOBODY, NOBODY)
    state_root(tmp_nobody).symlink_to(elsewhere)
    r = host_run(["true"], tmp_nobody)
    assert r.returncode == 70
    assert "is a symlink" in r.stderr
    assert list(elsewhere.iterdir()) == []
