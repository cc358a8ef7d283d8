"""compass-runner's podman tier with egress `boundary` (the default), end to end: real
rootful podman (runc), the runner's netns with tun0, a real sam-box, nano-init as the
container's entry point, and the test hosts of runner_hosts.py (allowed.example and
denied.example, an outside DNS server on 198.18.5.2:53, a listener on :853).

Binaries: COMPASS_RUNNER (default build/src/compass-runner/compass-runner); the runner finds
sam-box and nano-init beside it in the build tree, or COMPASS_SAM_BOX / COMPASS_NANO_INIT.
The default image is built once (`compass-runner image build`, cached by podman).
"""

import errno
import json
import os
import pathlib
import re
import secrets
import select
import signal
import socket
import subprocess
import tempfile
import time

import pytest

from probes import helpers as probe_helpers
from runner_hosts import runner_hosts  # noqa: F401 (a fixture)
from shell import sigterm_once_started

REPO = pathlib.Path(__file__).resolve().parents[2]
RUNNER = pathlib.Path(os.environ.get("COMPASS_RUNNER",
                                     REPO / "build/src/compass-runner/compass-runner"))
if not RUNNER.is_absolute():
    RUNNER = REPO / RUNNER
STATE_ROOT = pathlib.Path(os.environ.get("COMPASS_STATE_DIR", "/run/compass-runner"))
CONTAINERS_CONF = STATE_ROOT / "containers.conf"
ID_BASE = 0x70000000  # podman_userns.h kIdBase
ALLOW = "allowed.example:80"  # port-restricted: allowed.example:53 and :853 stay refused


def runner_env(**extra):
    env = dict(os.environ)
    env.pop("CONTAINERS_CONF", None)
    for ours, theirs in (("COMPASS_SAM_BOX", "SAM_BOX"), ("COMPASS_NANO_INIT", "NANO_INIT")):
        if theirs in os.environ and ours not in os.environ:
            env[ours] = str(pathlib.Path(os.environ[theirs]).resolve())
    env.update(extra)
    return env


def runner(*args, timeout=120, env=None, **kw):
    return subprocess.run([str(RUNNER), *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, env=env or runner_env(), **kw)


def podman(*args):
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, CONTAINERS_CONF=str(CONTAINERS_CONF)))


def run_argv(cmd, allow=(ALLOW,), extra=()):
    """`compass-runner run --backend podman [--egress-allow A]… EXTRA… -- CMD…`."""
    flags = [w for a in allow for w in ("--egress-allow", a)]
    return [str(RUNNER), "run", "--backend", "podman", *flags, *extra, "--", *cmd]


def run_agent(*cmd, allow=(ALLOW,), extra=(), timeout=120, env=None):
    return runner(*run_argv(cmd, allow, extra)[1:], timeout=timeout, env=env)


def run_agent_pid(*cmd, allow=(ALLOW,), extra=(), timeout=300, env=None):
    """run_agent, and the runner's pid as the result's `.pid` (its agent.json names it while
    it runs: see _left_by()). The timeout is well above the runner's own (120 s for podman to
    start the container, 60 s a podman command), so a start slowed by load or by podman's
    storage lock fails with the runner's message, not this one; a runner that still overruns
    it is killed and gc removes what it left."""
    proc = subprocess.Popen(run_argv(cmd, allow, extra), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env or runner_env())
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        runner("gc")
        raise
    r = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    r.pid = proc.pid
    return r


class Live:
    """A runner in the background: waits for its "agent ID running" line."""

    def __init__(self, *cmd, allow=(ALLOW,), extra=(), env=None, state_root=STATE_ROOT):
        self.env = env or runner_env()
        self.proc = subprocess.Popen(run_argv(cmd, allow, extra), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=self.env)
        self.err = ""
        self.id = self._wait_running()
        self.record = json.loads((state_root / self.id / "agent.json").read_text())

    def _wait_running(self, timeout=60):
        deadline = time.monotonic() + timeout
        fd = self.proc.stderr.fileno()
        while time.monotonic() < deadline:
            r, _, _ = select.select([fd], [], [], 0.5)
            if r:
                chunk = os.read(fd, 65536).decode(errors="replace")
                if not chunk:
                    break
                self.err += chunk
                m = re.search(r"agent (a[0-9a-f]{10}) running", self.err)
                if m:
                    return m.group(1)
        self.proc.kill()
        raise AssertionError(f"the agent did not start: {self.err}")

    def end(self):
        """After a test, pass or fail: a runner still running is killed and gc reaps what it
        left; returns what is left of the agent (must be nothing)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
            runner("gc", env=self.env)
        return leftovers(self.id)

    def wait(self, timeout=60):
        out, err = self.proc.communicate(timeout=timeout)
        self.err += err.decode(errors="replace")
        return self.proc.returncode, out.decode(errors="replace")


def wait_for(predicate, what, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def leftovers(agent_id):
    """Everything of one agent that may outlive it; empty when teardown was complete."""
    left = []
    if podman("container", "exists", f"compass-{agent_id}").returncode == 0:
        left.append(f"container compass-{agent_id}")
    if pathlib.Path(f"/run/compass-rootfs/{agent_id}").exists():
        left.append(f"rootfs mount /run/compass-rootfs/{agent_id}")
    return left + _agent_traces().get(agent_id, [])


# An agent id (state.cc newAgentId()); the tests' own "compass-t…" netns and firewall_driver's
# "t…" ids are none.
AGENT_ID = "a[0-9a-f]{10}"


def _agent_traces():
    """What any agent has on the host now, by agent id: netns compass-ID, veth cvID, nft
    tables named with the id, uid range claim, sam-box process, state dir (and whether it
    has its record, agent.json, or only a sam-box socket)."""
    traces = {}

    def add(agent_id, what):
        traces.setdefault(agent_id, []).append(what)

    for where, pattern in (("/run/netns", f"compass-({AGENT_ID})"),
                           ("/sys/class/net", f"cv({AGENT_ID})")):
        names = os.listdir(where) if os.path.isdir(where) else []
        for m in filter(None, (re.fullmatch(pattern, n) for n in names)):
            add(m.group(1), f"{where}/{m.group(0)}")
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    for m in re.finditer(rf"^table (\S+ \S*?({AGENT_ID})\S*)$", tables, re.M):
        add(m.group(2), f"nft table {m.group(1)}")
    claims = pathlib.Path("/run/compass-uidmap")
    for claim in claims.iterdir() if claims.is_dir() else ():
        try:
            owner = claim.read_text()
        except OSError:
            continue  # released meanwhile
        if re.fullmatch(AGENT_ID, owner):
            add(owner, f"uid range claim {claim}")
    in_state_dir = re.compile(rf"{re.escape(str(STATE_ROOT))}/({AGENT_ID})\b")
    for proc in pathlib.Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        m = in_state_dir.search(" ".join(argv)) if argv[0].endswith("sam-box") else None
        if m:
            add(m.group(1), f"sam-box pid {proc.name}")
    for d in STATE_ROOT.glob("a*"):
        if re.fullmatch(AGENT_ID, d.name):
            orphan = not (d / "agent.json").exists()
            sock = orphan and (d / "sam" / "agent.sock").exists()
            add(d.name, f"state dir {d}" + (" without agent.json" if orphan else "")
                + (" but with a sam-box socket" if sock else ""))
    return traces


@pytest.fixture(scope="module")
def image():
    if os.geteuid() != 0:
        pytest.fail("the podman tier tests run as root")
    if not RUNNER.exists():
        pytest.fail(f"compass-runner not found at {RUNNER} (set COMPASS_RUNNER)")
    r = runner("image", "build", timeout=1800)
    assert r.returncode == 0, r.stderr


@pytest.fixture(scope="module")
def probes(image, runner_hosts):
    """One agent runs every probe and reports JSON; the tests below read its answers."""
    script = probe_helpers(run_secs=30, connect_secs=8, recv_secs=2) + r'''
status = open("/proc/self/status").read()
res = boundary_egress(10)
res.update({
  "resolv": open("/etc/resolv.conf").read(),
  "status": {k: v.strip() for k, v in (l.split(":", 1) for l in status.splitlines())},
  "isatty": [os.isatty(0), os.isatty(1), os.isatty(2)],
  "uid": os.getuid(),
  "tun_dev": os.path.exists("/dev/net/tun"),
  "sys_net": sorted(set(os.listdir("/sys/class/net")) | set(os.listdir("/sys/devices/virtual/net"))),
  "unshare_user": run("unshare", "-Urn", "true"),
})
try:
    socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    res["vsock"] = "open"
except OSError as e:
    res["vsock"] = e.errno
print("PROBES " + json.dumps(res))
'''
    r = run_agent("python3", "-c", script, timeout=300)
    line = [l for l in r.stdout.splitlines() if l.startswith("PROBES ")]
    assert r.returncode == 0 and line, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return json.loads(line[0][len("PROBES "):])


# ---------------------------------------------------------------------------------------
# Egress through the boundary


def test_allowed_name_over_ipv4_and_ipv6(probes, runner_hosts):
    assert runner_hosts.fetch(runner_hosts.ALLOWED_V4) == "allowed.example\n"  # reachable at all
    for key in ("curl4_allowed", "curl6_allowed"):
        assert probes[key]["rc"] == 0, probes[key]
        assert probes[key]["out"] == "allowed.example\n", probes[key]


def test_denied_name_is_refused_not_timed_out(probes, runner_hosts):
    # The host can reach denied.example: only the boundary stands between.
    assert runner_hosts.fetch(runner_hosts.DENIED_V4) == "denied.example\n"
    for key in ("curl_denied", "curl6_denied"):
        # 7 = connection refused (the SYN answered with RST); 28 would be a timeout.
        assert probes[key]["rc"] == 7, probes[key]
        assert "denied.example" not in probes[key]["out"], probes[key]


def test_raw_ip_literals_fail(probes):
    for key in ("curl_raw_ip", "curl_raw_ip6"):
        assert probes[key]["rc"] != 0, probes[key]
        assert "allowed.example" not in probes[key]["out"], probes[key]


def test_outside_resolver_gets_no_query_only_the_virtual_dns_answers(probes):
    # The outside server answers every A query with 198.18.5.2: seeing it means DNS escaped.
    for key in ("dig_outside", "dig_outside_tcp"):
        assert probes[key]["rc"] != 0, probes[key]
        assert "ANSWER SECTION" not in probes[key]["out"], probes[key]
    answers = probes["dig_virtual"]["out"].split()
    assert answers and all(a.startswith("100.") for a in answers), probes["dig_virtual"]


def test_tcp_53_and_853_out_fail(probes):
    for key in ("tcp_ip_53", "tcp_ip_853", "tcp_ip6_853", "tcp_name_53", "tcp_name_853"):
        assert not probes[key]["ok"], (key, probes[key])
        assert "dot-853" not in probes[key].get("data", ""), (key, probes[key])


def test_sandbox_network_is_lo_and_tun0_with_the_virtual_resolver(probes):
    links = re.findall(r"^\d+: ([^:@]+)", probes["links"]["out"], re.M)
    assert sorted(links) == ["lo", "tun0"], probes["links"]
    assert "default dev tun0" in probes["routes"]["out"], probes["routes"]
    assert "mtu 65520" in probes["links"]["out"], probes["links"]
    servers = re.findall(r"^nameserver\s+(\S+)", probes["resolv"], re.M)
    assert servers == ["100.127.255.253"], probes["resolv"]
    assert not probes["tun_dev"], "the container must not see /dev/net/tun"


def test_sysfs_shows_no_host_interface_and_no_other_agents_veth(probes):
    # The container's /sys is the host's: unmasked, /sys/class/net listed the host's eth0 and
    # every running agent's veth (cv<id>), naming the other agents.
    assert probes["sys_net"] == [], probes["sys_net"]


# ---------------------------------------------------------------------------------------
# The agent's privileges


def test_agent_cannot_change_the_network(probes):
    for key in ("nft_flush", "ip_link_add", "ip_addr_add"):
        assert probes[key]["rc"] != 0, (key, probes[key])
        assert "Operation not permitted" in probes[key]["err"], (key, probes[key])


def test_agent_gets_no_user_namespace_and_no_vsock(probes):
    # podman's own seccomp profile allows both; nano-init's filter does not (agent_filter.h).
    assert probes["unshare_user"]["rc"] != 0, probes["unshare_user"]
    assert "Operation not permitted" in probes["unshare_user"]["err"], probes["unshare_user"]
    assert probes["vsock"] == errno.EAFNOSUPPORT, probes["vsock"]


def test_agent_has_no_capability_and_no_new_privileges(probes):
    st = probes["status"]
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(st[cap], 16) == 0, (cap, st[cap])
    assert st["NoNewPrivs"] == "1"
    assert probes["uid"] == 1000


def test_agent_sees_no_operator_terminal(probes):
    assert probes["isatty"] == [False, False, False]


def test_a_sam_box_that_dies_is_reported_and_egress_stays_closed(image, runner_hosts):
    """The boundary killed under a running agent: the runner says so at once (it used to say
    nothing, and the roster looked normal), and the agent's flows are refused, not let out."""
    live = Live("sh", "-c", "sleep 3; curl -s -m 5 -o /dev/null -w '%{http_code}' "
                "http://allowed.example/; echo \" rc=$?\"")
    try:
        os.kill(live.record["sam_box_pid"], signal.SIGKILL)
        code, out = live.wait()
        assert code == 0, live.err
        assert "warning: the agent's sam-box (pid %d) was killed by signal 9 while the agent " \
            "runs" % live.record["sam_box_pid"] in live.err, live.err
        assert "every flow of the agent is refused from now on" in live.err
        assert out.startswith("000 rc="), out  # no answer: the flow never left
        assert not out.startswith("000 rc=0"), out
    finally:
        left = live.end()
    assert left == []


def test_agent_is_not_root_on_the_host_and_only_it_can_use_its_socket(image, runner_hosts):
    live = Live("sh", "-c", "curl -s http://allowed.example/ >/dev/null; "
                "curl -s http://denied.example/ >/dev/null; exec sleep 120")
    try:
        rec = live.record
        assert rec["tier"] == "podman" and rec["posture"] == "boundary", rec
        assert rec["container"] == f"compass-{live.id}" and rec["netns"] == f"compass-{live.id}"
        assert rec["sam_box_pid"] > 0 and re.fullmatch(r"127\.0\.0\.1:\d+", rec["metrics_addr"])
        # The agent's first host pid is nano-init, and the command is its child.
        status = pathlib.Path(f"/proc/{rec['pid']}/status").read_text()
        uids = [int(u) for u in re.search(r"^Uid:\s+(.*)$", status, re.M).group(1).split()]
        assert all(u >= ID_BASE + 1000 for u in uids), uids
        assert all(u != 0 for u in uids)
        children = pathlib.Path(f"/proc/{rec['pid']}/task/{rec['pid']}/children")
        kids = wait_for(lambda: children.read_text().split(), "nano-init's child")
        kid_status = pathlib.Path(f"/proc/{kids[0]}/status").read_text()
        assert re.search(r"^Uid:\s+(\d+)", kid_status, re.M).group(1) == str(uids[0])
        assert re.search(r"^CapEff:\s+0+$", kid_status, re.M), kid_status
        # The socket stays 0600, owned by that host uid only.
        sock = os.stat(STATE_ROOT / live.id / "sam" / "agent.sock")
        assert oct(sock.st_mode & 0o777) == "0o600" and sock.st_uid == uids[0]
        # Its directory, mounted read-only at /run/sam, is root's: the agent cannot swap it.
        sam = os.stat(STATE_ROOT / live.id / "sam")
        assert sam.st_uid == 0 and oct(sam.st_mode & 0o777) == "0o755"
        assert oct(os.stat(STATE_ROOT / live.id).st_mode & 0o777) == "0o700"
        # The roster shows the boundary's posture and its flow counts (from sam-box).
        def counted():
            roster = json.loads(runner("agents", "--json").stdout)
            mine = [a for a in roster if a["id"] == live.id]
            return mine and mine[0]["allowed"] >= 1 and mine[0]["denied"] >= 1 and mine[0]
        mine = wait_for(counted, "one allowed and one denied flow in the roster")
        assert mine["egress"] == "boundary" and mine["tier"] == "podman", mine
        assert runner("stop", live.id).returncode == 0
        code, _ = live.wait()
        assert code == 128 + signal.SIGTERM, live.err
    finally:
        left = live.end()
    assert left == []


def test_agent_cannot_reach_into_nano_init(image):
    """nano-init (PID 1) and the agent are both uid 1000 in the container: nano-init is not
    dumpable, so the agent can neither list nor copy its descriptors (tun0, the boundary) nor
    read its memory or environment."""
    script = ("for f in /proc/1/fd /proc/1/environ /proc/1/mem; do "
              "if ls -L $f >/dev/null 2>&1 && head -c1 $f >/dev/null 2>&1; then echo OPEN $f; "
              "else echo DENIED $f; fi; done; "
              "python3 -c 'import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
              "fd = libc.syscall(438, os.pidfd_open(1), 0, 0); "  # pidfd_getfd(2)
              "print(\"GOT-FD\" if fd >= 0 else os.strerror(ctypes.get_errno()))'")
    r = run_agent("sh", "-c", script)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[:3] == ["DENIED /proc/1/fd", "DENIED /proc/1/environ", "DENIED /proc/1/mem"], \
        r.stdout
    assert lines[3] == "Operation not permitted", r.stdout


def test_bundle_allowlist_and_identity_banner_and_workdir(image, runner_hosts):
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as b:
        b.write("version: v1\nagent:\n  id: researcher-1.test.example\n"
                "egress:\n  allow: [allowed.example]\n")
        b.flush()
        r = run_agent("sh", "-c", "pwd; curl -sS -m 10 http://allowed.example/; "
                      "curl -sS -m 10 http://denied.example/; echo rc=$?",
                      allow=(), extra=("--bundle", b.name, "--workdir", "/tmp"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["/tmp", "allowed.example", "rc=7"], r.stdout
    # No platform credential is configured: the launch says the identity is not verified.
    assert "NOT verified" in r.stderr, r.stderr


def test_exit_status_is_the_agents(image):
    r = run_agent("sh", "-c", "echo out; echo err >&2; exit 3")
    assert r.returncode == 3, r.stderr
    assert "out" in r.stdout and "err" in r.stderr


def test_resize_lowers_memory_and_an_allocation_over_it_is_oom_killed(image):
    # The agent waits for SIGUSR1 (nano-init forwards it), sent once the resize is done, then
    # allocates 256 MiB: fine under the 512 MiB it started with, not under 64 MiB.
    script = r'''
trap 'go=1' USR1
echo waiting
i=0
while [ -z "$go" ]; do
  i=$((i+1)); [ $i -gt 1200 ] && { echo "no signal"; exit 3; }
  sleep 0.1
done
echo resized
exec python3 -c 'b = b"x" * (256 << 20); print("allocated")'
'''
    live = Live("sh", "-c", script, extra=("--memory", "512m", "--pids", "200", "--cpus", "1"))
    try:
        pid = live.record["pid"]
        limits = {("memory", "memory.limit_in_bytes"): (str(512 << 20), str(64 << 20)),
                  ("pids", "pids.max"): ("200", "50"),
                  ("cpu", "cpu.cfs_quota_us"): ("100000", "50000")}
        for (controller, name), (before, _) in limits.items():
            assert _cgroup(pid, controller).joinpath(name).read_text().strip() == before, name
        r = runner("resize", live.id, "--memory", "64m", "--pids", "50", "--cpus", "0.5")
        assert r.returncode == 0, r.stderr
        # It says what is now in force (podman inspect keeps showing the start's limits).
        assert f"resized agent {live.id}: memory 67108864 bytes, cpus 0.5, pids 50" in r.stderr, \
            r.stderr
        for (controller, name), (_, after) in limits.items():
            assert _cgroup(pid, controller).joinpath(name).read_text().strip() == after, name
        os.kill(live.record["pid"], signal.SIGUSR1)
        code, out = live.wait(timeout=120)
        assert "resized" in out and "allocated" not in out, (out, live.err)
        assert code == 137, (code, out, live.err)
    finally:
        left = live.end()
    assert left == []


def _cgroup(pid, controller):
    """The cgroup v1 directory of `pid` for `controller` (this host's hierarchy)."""
    for line in pathlib.Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return pathlib.Path("/sys/fs/cgroup/" + controllers + path)
    raise AssertionError(f"no {controller} cgroup for {pid}")


def test_rootfs_dir_runs_and_is_never_written(image, runner_hosts):
    env = dict(os.environ, CONTAINERS_CONF=str(CONTAINERS_CONF))
    mount = subprocess.run(["podman", "image", "mount", "localhost/compass-agent:latest"],
                           capture_output=True, text=True, env=env, check=True).stdout.strip()
    try:
        r = run_agent("sh", "-c",
                      "echo hi > /home/agent/new && cat /home/agent/new && id -u && "
                      "curl -sS -m 10 http://allowed.example/",
                      extra=("--rootfs", mount))
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == ["hi", "1000", "allowed.example"], r.stdout
        assert not pathlib.Path(mount, "home/agent/new").exists()
    finally:
        subprocess.run(["podman", "image", "unmount", "localhost/compass-agent:latest"],
                       capture_output=True, env=env)


# ---------------------------------------------------------------------------------------
# Refusals: nothing starts, nothing is left


def _runner_of(agent_id):
    """The runner pid in the agent's record; None without a record (not written yet, or gone)."""
    try:
        return json.loads((STATE_ROOT / agent_id / "agent.json").read_text())["runner_pid"]
    except (OSError, ValueError, KeyError):
        return None


def _left_by(runner_pid, before, settle=30):
    """What the runner `runner_pid`, which has exited, left on the host: the traces
    (_agent_traces()) of agents not in `before` that no other runner owns.

    Other sessions' agents may start and stop meanwhile. Each one's record, naming its own
    runner, is written before its netns, veth, tables, claim and sam-box are made, and removed
    only once they are gone; so an agent is taken for this runner's only if it has no record
    or one naming `runner_pid`, both before and after its traces are listed a second time
    (another agent that was being torn down is gone from that list). Only its state dir can
    be seen without its record, for a moment (made before it, removed after it): one such is
    waited for, up to `settle` s, to go. What this runner left stays: nothing of it runs."""
    def unowned(agent_id):
        return _runner_of(agent_id) in (None, runner_pid)

    deadline = time.monotonic() + settle
    while True:
        suspects = [i for i in _agent_traces() if i not in before and unowned(i)]
        again = _agent_traces()
        left = {i: again[i] for i in sorted(suspects) if i in again and unowned(i)}
        settling = all(w.endswith(("without agent.json", "socket")) for ws in left.values()
                       for w in ws)
        if not left or not settling or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def test_refuses_without_root(image):
    r = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                        str(RUNNER), "run", "--backend", "podman", "--", "true"],
                       capture_output=True, text=True, timeout=60, env=runner_env())
    assert r.returncode == 2, r
    assert "needs root" in r.stderr, r.stderr


def test_refuses_a_missing_image_and_a_rootfs_that_is_no_directory(image):
    r = run_agent("true", extra=("--image", "localhost/no-such-image:latest"))
    assert r.returncode == 2 and "no such image" in r.stderr, r.stderr
    with tempfile.NamedTemporaryFile() as f:
        r = run_agent("true", extra=("--rootfs", f.name))
        assert r.returncode == 2 and "not a directory" in r.stderr, r.stderr
    # The host's own root would be re-owned file by file (and never finish): refused at once.
    with tempfile.TemporaryDirectory() as d:
        link = pathlib.Path(d) / "root-link"
        link.symlink_to("/")
        r = run_agent("true", extra=("--rootfs", str(link)))
        assert r.returncode != 0 and "host's root directory" in r.stderr, r.stderr


def test_a_missing_image_found_by_podman_run_is_refused_and_leaves_nothing(image, runner_hosts):
    """`podman run --pull never` itself finds the image missing (no extra podman process per
    start): the same refusal, and what start made meanwhile (netns, sam-box, firewall) is gone.

    Robust to other sessions on the machine: the image name is this run's own (no other test
    can have made it), what is counted as left is only what no other runner owns (_left_by),
    and the allowlist's name, which the firewall resolves before the agent may start, is
    answered by runner_hosts' /etc/hosts block rather than by whatever resolver the machine
    has (that block exists only while some session uses runner_hosts)."""
    missing = f"localhost/no-such-image-{secrets.token_hex(4)}:latest"
    for egress in ("boundary", "firewall"):
        before = set(_agent_traces())
        r = run_agent_pid("true", extra=("--image", missing, "--egress", egress))
        assert r.returncode == 2, (egress, r.stderr)
        assert f"refusing to start: --image {missing}: no such image" in r.stderr, r.stderr
        assert not re.search(r"agent \S+ running", r.stderr), r.stderr  # none ever started
        assert _left_by(r.pid, before) == {}, (egress, r.stderr)


def test_a_workdir_the_image_or_rootfs_lacks_is_refused_and_leaves_nothing(image, runner_hosts):
    """--workdir names a directory of the agent's root file system. One the image lacks (or that
    is a file there) is found by `podman run` itself, exit 126, and then refused as the request's
    fault (exit 2, naming the flag), like a missing image; the agent never ran and nothing is
    left. With --rootfs it is refused before anything is made, and a host directory reached by
    a link in the rootfs does not count."""
    missing = f"/nonexistent-{secrets.token_hex(4)}"
    for egress, workdir in (("boundary", missing), ("firewall", "/etc/passwd")):
        before = set(_agent_traces())
        r = run_agent_pid("pwd", extra=("--workdir", workdir, "--egress", egress))
        assert r.returncode == 2, (egress, r.stderr)
        assert (f"refusing to start: --workdir {workdir}: no such directory in image "
                "localhost/compass-agent:latest") in r.stderr, r.stderr
        assert not re.search(r"agent \S+ running", r.stderr), r.stderr
        assert r.stdout == "", r.stdout  # pwd never ran
        assert _left_by(r.pid, before) == {}, (egress, r.stderr)
    with tempfile.TemporaryDirectory() as root:
        pathlib.Path(root, "etc").mkdir()
        pathlib.Path(root, "tmp-link").symlink_to("/tmp")  # /tmp is the host's, not the root's
        for workdir in (missing, "/tmp-link"):
            before = set(_agent_traces())
            r = run_agent_pid("pwd", extra=("--rootfs", root, "--workdir", workdir))
            assert r.returncode == 2, r.stderr
            assert f"--workdir {workdir}: no such directory in --rootfs {root}" in r.stderr
            assert _left_by(r.pid, before) == {}, r.stderr


@pytest.fixture(scope="module")
def issuer(tmp_path_factory):
    """A local HTTPS OIDC issuer on 127.0.0.1 (oidc_issuer.py), for --credential-issuer."""
    from oidc_issuer import TestIssuer
    i = TestIssuer(tmp_path_factory.mktemp("oidc"))
    i.start()
    yield i
    i.stop()


def _credential_run(issuer, tmp_path, sub, *cmd, issuer_url=None):
    """Runs CMD with a verified identity (boxlib.credentialed_runner_flags); returns (result,
    the node's records)."""
    import boxlib
    with boxlib.credentialed_runner_flags(tmp_path, issuer, sub, issuer_url) as (flags, node):
        r = run_agent_pid(*cmd, extra=flags)
    return r, node.records


def test_a_verified_bundle_identity_is_the_one_the_node_sees(image, issuer, tmp_path):
    """seed 003 "Identity": with --credential-issuer the runner's sam-box verifies the platform
    token (OIDC discovery, JWKS over HTTPS) and asserts the bundle's agent.id on mesh requests,
    replacing what the sandbox sent; the launch no longer says the identity is unverified."""
    r, records = _credential_run(
        issuer, tmp_path, "sa:agents:verified", "curl", "-sS", "-m", "10", "-H",
        "X-Sam-Agent: admin.test.example", "http://mesh.sam.alt/whoami")
    assert r.returncode == 0, r.stderr
    assert "NOT verified" not in r.stderr, r.stderr
    assert len(records) == 1, records
    sent = [v for k, v in records[0]["headers"] if k.lower() == "x-sam-agent"]
    assert sent == ["verified.test.example"], records


def test_a_credential_for_another_subject_never_starts_the_agent(image, issuer, tmp_path):
    before = set(_agent_traces())
    r, records = _credential_run(issuer, tmp_path, "sa:agents:someone-else", "sh", "-c",
                                 "echo AGENT-RAN")
    assert r.returncode != 0, r.stdout + r.stderr
    assert re.search(r"\bsub\b|subject|external_id", r.stderr), r.stderr  # sam-box's reason
    assert "AGENT-RAN" not in r.stdout + r.stderr
    assert records == []
    assert _left_by(r.pid, before) == {}, r.stderr


def test_an_issuer_that_never_answers_fails_with_sam_boxs_reason(image, issuer, tmp_path):
    """An issuer that accepts and then says nothing: sam-box gives up on it (its own fetch
    timeout, 10 s) and says why; the runner waits for that rather than cutting sam-box off
    at its usual 5 s with no reason to show."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # connections complete in the backlog and are never answered
        r, records = _credential_run(
            issuer, tmp_path, "sa:agents:verified", "sh", "-c", "echo AGENT-RAN",
            issuer_url=f"https://127.0.0.1:{silent.getsockname()[1]}")
    assert r.returncode != 0, r.stdout + r.stderr
    assert records == []
    assert "AGENT-RAN" not in r.stdout + r.stderr
    assert "sam-box exited with status" in r.stderr, r.stderr
    assert "did not create" not in r.stderr, r.stderr


def test_refuses_a_sidecar_socket_that_cannot_reach_a_node(image, tmp_path):
    """A wrong --sidecar-socket would otherwise show only inside the sandbox, as a refused
    mesh.sam.alt: the runner refuses it before anything starts."""
    bundle = tmp_path / "bundle.yaml"
    bundle.write_text("version: v1\nagent:\n  id: a.example\n  external_id: a\n")
    missing = tmp_path / "node.sock"
    r = run_agent("true", extra=("--bundle", str(bundle), "--sidecar-socket", str(missing)))
    assert r.returncode == 2, r.stderr
    assert str(missing) in r.stderr and "sam-node run --socket-path" in r.stderr, r.stderr
    plain = tmp_path / "plain-file"
    plain.write_text("")
    r = run_agent("true", extra=("--bundle", str(bundle), "--sidecar-socket", str(plain)))
    assert r.returncode == 2 and "not a Unix socket" in r.stderr, r.stderr
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(missing))
        r = run_agent("true", extra=("--sidecar-socket", str(missing)))
        assert r.returncode == 2 and "needs --bundle" in r.stderr, r.stderr
        r = run_agent("true", extra=("--bundle", str(bundle), "--sidecar-socket", str(missing),
                                     "--egress", "firewall"))
        assert r.returncode == 2 and "--egress boundary" in r.stderr, r.stderr


def test_refuses_when_containers_conf_enables_a_pasta_forward(image):
    with tempfile.NamedTemporaryFile("w", suffix=".conf") as f:
        f.write('[network]\npasta_options = ["-T", "5432"]\n')
        f.flush()
        r = run_agent("true", env=runner_env(CONTAINERS_CONF=f.name))
    assert r.returncode == 2, r.stderr
    assert f.name in r.stderr and "pasta_options" in r.stderr and "5432" in r.stderr, r.stderr


def test_a_boundary_that_cannot_start_leaves_nothing(image):
    before = set(_agent_traces())
    with tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False) as f:
        f.write("#!/bin/sh\necho 'sam-box: refusing for this test' >&2\nexit 2\n")
    os.chmod(f.name, 0o755)
    try:
        r = run_agent_pid("true", env=runner_env(COMPASS_SAM_BOX=f.name))
    finally:
        os.unlink(f.name)
    assert r.returncode != 0 and "sam-box" in r.stderr, r.stderr
    assert "refusing for this test" in r.stderr, r.stderr  # its log's last lines
    assert _left_by(r.pid, before) == {}, r.stderr


SAM_BOX = pathlib.Path(os.environ.get("COMPASS_SAM_BOX") or os.environ.get("SAM_BOX")
                       or RUNNER.parent.parent / "sam-box/sam-box").resolve()


def _slow_sam_box(tmp_path, then):
    """A sam-box that starts 3 s late, so the runner is still making the boundary while podman
    creates the container: `then` is "exec" (the real sam-box follows) or "fail"."""
    script = tmp_path / f"sam-box-slow-{then}"
    tail = f'exec {SAM_BOX} "$@"' if then == "exec" else "echo 'sam-box: failing late' >&2; exit 2"
    script.write_text(f"#!/bin/sh\nsleep 3\n{tail}\n")
    script.chmod(0o755)
    return runner_env(COMPASS_SAM_BOX=str(script))


def _agent_containers():
    return set(podman("ps", "-a", "--filter", "label=compass.agent", "--format",
                      "{{.Names}}").stdout.split())


def _runc_containers():
    return set(subprocess.run(["runc", "list", "-q"], capture_output=True, text=True,
                              timeout=60).stdout.split())


def test_the_agent_waits_at_the_gate_until_the_boundary_serves(image, runner_hosts, tmp_path):
    """podman starts before sam-box serves; nano-init holds the agent at its exec gate until it
    does. With a sam-box 3 s late the agent's first request still goes through it."""
    r = run_agent("curl", "-sS", "--max-time", "10", "http://allowed.example/",
                  env=_slow_sam_box(tmp_path, "exec"))
    assert r.returncode == 0 and r.stdout == "allowed.example\n", (r.stdout, r.stderr)


def test_a_boundary_that_fails_late_leaves_nothing_and_never_runs_the_agent(image, tmp_path):
    """sam-box fails while podman is creating the container: the runner waits for the container
    to reach its gate before it tears down, so neither it nor runc's state is left."""
    before, runc_before = set(_agent_traces()), _runc_containers()
    r = run_agent_pid("sh", "-c", "echo AGENT-RAN", env=_slow_sam_box(tmp_path, "fail"))
    assert r.returncode != 0 and "failing late" in r.stderr, r.stderr
    assert "AGENT-RAN" not in r.stdout + r.stderr
    assert _left_by(r.pid, before) == {}, r.stderr
    assert _runc_containers() <= runc_before


def test_a_boundary_that_dies_after_making_its_socket_never_runs_the_agent(image, tmp_path):
    """sam-box makes its socket, then is killed while podman still starts the container: the
    gate must not open onto a dead boundary."""
    script = tmp_path / "sam-box-dies"
    script.write_text(
        "#!/bin/sh\nsock=''; prev=''\n"
        'for a in "$@"; do [ "$prev" = --socket ] && sock="$a"; prev="$a"; done\n'
        '( while [ ! -S "$sock" ]; do sleep 0.001; done; kill -9 $$ ) &\n'
        f'exec {SAM_BOX} "$@"\n')
    script.chmod(0o755)
    before = set(_agent_traces())
    r = run_agent_pid("sh", "-c", "echo AGENT-RAN", env=runner_env(COMPASS_SAM_BOX=str(script)))
    assert r.returncode != 0, r.stdout + r.stderr
    assert "sam-box was killed by signal 9" in r.stderr, r.stderr
    assert "AGENT-RAN" not in r.stdout + r.stderr
    assert _left_by(r.pid, before) == {}, r.stderr


def test_sigterm_while_the_boundary_starts_keeps_the_gate_shut(image, tmp_path):
    before, containers_before = set(_agent_traces()), _agent_containers()
    def created():
        wait_for(lambda: _agent_containers() - containers_before, "podman to create the container")

    argv = run_argv(["sh", "-c", "echo AGENT-RAN"])
    p, out, err = sigterm_once_started(argv, _slow_sam_box(tmp_path, "exec"), created)
    assert p.returncode == 128 + signal.SIGTERM, err
    assert "stopped by SIGTERM before the agent started" in err, err
    assert "AGENT-RAN" not in out + err
    assert _left_by(p.pid, before) == {}, err


def _await_exited(name, what):
    """The container's status ("Exited (N) …") once it has exited, waiting up to 60 s."""
    def ended():
        status = podman("ps", "-a", "--filter", f"name=^{name}$", "--format",
                        "{{.Status}}").stdout.strip()
        return status.startswith("Exited") and status

    return wait_for(ended, what, timeout=60)


def test_runner_killed_while_the_boundary_starts_never_runs_the_agent(image, tmp_path):
    """kill -9 of the runner while sam-box is starting: podman, which outlives it, finishes the
    start; nano-init finds the gate closed and exits 70 without running the agent; gc removes
    the rest, runc's state included."""
    containers_before, runc_before = _agent_containers(), _runc_containers()
    out = tmp_path / "killed-runner.out"
    with open(out, "w") as sink:
        p = subprocess.Popen(run_argv(["sh", "-c", "echo AGENT-RAN"]), stdin=subprocess.DEVNULL,
                             stdout=sink, stderr=sink, env=_slow_sam_box(tmp_path, "exec"))
    try:
        name = next(iter(wait_for(lambda: _agent_containers() - containers_before,
                                  "podman to create the container")))
    finally:
        p.kill()
        p.wait()

    assert _await_exited(name, "the container to end at its closed gate").startswith(
        "Exited (70)")
    assert "AGENT-RAN" not in out.read_text()
    assert runner("gc").returncode == 0
    assert leftovers(name.removeprefix("compass-")) == []
    assert _runc_containers() <= runc_before


def test_runner_killed_with_a_running_agent_stops_it(image, runner_hosts):
    """kill -9 of the runner once its agent runs: nano-init holds the gate as a lifeline
    (`--lifeline`), sees the runner's end close, and stops the sandbox as on SIGTERM; the
    container ends by itself, not at the next gc."""
    live = Live("sleep", "300")
    name = f"compass-{live.id}"
    try:
        live.proc.kill()
        live.proc.wait()

        assert _await_exited(name, "the container to end once its runner is gone").startswith(
            f"Exited ({128 + signal.SIGTERM})")
        assert runner("gc").returncode == 0
    finally:
        assert live.end() == []


# ---------------------------------------------------------------------------------------
# Teardown


def test_fifty_start_stop_cycles_leave_nothing(image, runner_hosts):
    ids = []
    for i in range(50):
        kind = i % 5
        if kind in (0, 1):
            r = run_agent("sh", "-c", f"exit {i % 7}")
            assert r.returncode == i % 7, r.stderr
            m = re.search(r"agent (a[0-9a-f]{10}) running", r.stderr)
            assert m, r.stderr
            ids.append(m.group(1))
            continue
        live = Live("sleep", "300")
        ids.append(live.id)
        if kind == 2:  # kill -9 of the agent (nano-init, the container's first process)
            os.kill(live.record["pid"], signal.SIGKILL)
            code, _ = live.wait()
            assert code == 137, live.err
        elif kind == 3:  # compass-runner stop
            assert runner("stop", live.id).returncode == 0
            code, _ = live.wait()
            assert code == 143, live.err
        else:  # kill -9 of the runner, then gc
            live.proc.kill()
            live.proc.wait()
            r = runner("gc")
            assert r.returncode == 0, r.stderr
            assert live.id in r.stdout, r.stdout
    left = {i: leftovers(i) for i in ids}
    assert {i: l for i, l in left.items() if l} == {}


def test_gc_leaves_the_agents_of_another_state_root_alone(image, runner_hosts, tmp_path):
    """COMPASS_STATE_DIR is chosen per runner, while containers, netns and uid claims are
    host-wide: gc under the default root took a live agent recorded under another root for an
    orphan and removed it under its runner, saying nothing. Once that agent's runner is gone,
    gc names the root whose gc removes it."""
    other = tmp_path / "state"
    env = runner_env(COMPASS_STATE_DIR=str(other))
    live = Live("sh", "-c", "sleep 6; echo survived", env=env, state_root=other)
    try:
        assert oct(other.stat().st_mode & 0o777) == "0o700"
        r = runner("gc")
        assert r.returncode == 0, r.stderr
        assert live.id not in r.stdout + r.stderr
        code, out = live.wait(timeout=120)
        assert code == 0 and "survived" in out, live.err
    finally:
        assert live.end() == []

    orphan = Live("sleep", "300", env=env, state_root=other)
    try:
        orphan.proc.kill()  # kill -9 of its runner: its record stays under `other`
        orphan.proc.wait()
        _await_exited(f"compass-{orphan.id}", "the container to end once its runner is gone")
        r = runner("gc")
        assert r.returncode == 0, r.stderr
        assert f"COMPASS_STATE_DIR={other} compass-runner gc" in r.stderr, r.stderr
        assert leftovers(orphan.id) != [], "the default root's gc removed another root's agent"
        r = runner("gc", env=env)
        assert r.returncode == 0 and orphan.id in r.stdout, r.stdout + r.stderr
    finally:
        assert orphan.end() == []


def test_a_long_command_or_an_unreadable_record_never_makes_a_live_agent_an_orphan(
        image, runner_hosts):
    """From a hostile review: a command whose record came to over 1 MiB of JSON (quotes
    double) read as no record, so `agents` did not list the agent, `stop` did not know it,
    and gc removed it as an orphan under its runner. The record now keeps 8 KiB of the
    command (bytes that are not UTF-8 replaced, where they stopped the start); a record that
    cannot be read at all makes gc leave its agent alone and say so."""
    big = '"' * 120_000
    # "\udcff" reaches the runner as the byte 0xff (surrogateescape): not UTF-8.
    live = Live("sh", "-c", "sleep 8; echo survived", "\udcff", big, big, big, big, big)
    try:
        path = STATE_ROOT / live.id / "agent.json"
        assert path.stat().st_size < 64 * 1024, path.stat().st_size
        assert live.record["command"][-1].endswith("more bytes not recorded]"), \
            live.record["command"][-1]
        assert live.id in runner("agents").stdout
        saved = path.read_bytes()
        path.write_text("{ not a record")
        try:
            r = runner("agents")
            assert f"{live.id}/agent.json cannot be read" in r.stderr, r.stderr
            r = runner("gc")
            assert r.returncode == 0, r.stderr
            assert f"{live.id}/agent.json cannot be read" in r.stderr, r.stderr
            assert "removed" not in r.stdout, r.stdout
        finally:
            path.write_bytes(saved)
        code, out = live.wait(timeout=120)
        assert code == 0 and "survived" in out, live.err
    finally:
        assert live.end() == []


def test_gc_running_all_the_while_never_reaps_an_agent_that_is_starting(image, runner_hosts):
    """gc reads the records first and lists containers, netns and claims after (a podman ps
    in between): an agent whose runner started in that gap has a record but was not among the
    live ones. It must be left alone, not torn down under its runner."""
    import threading
    stop = threading.Event()
    gcs = []

    def collect():
        while not stop.is_set():
            gcs.append(runner("gc", timeout=120))

    t = threading.Thread(target=collect)
    t.start()
    try:
        results = [run_agent("sh", "-c", f"echo started-{i}") for i in range(8)]
    finally:
        stop.set()
        t.join()
    assert len(gcs) >= 3, "gc did not run alongside the starts"
    for i, r in enumerate(results):
        assert r.returncode == 0 and f"started-{i}" in r.stdout, r.stderr
    assert all(g.returncode == 0 for g in gcs), [g.stderr for g in gcs if g.returncode]


# ---------------------------------------------------------------------------------------
# nano-init as the podman tier runs it: no CAP_NET_ADMIN, tun0 from its launcher

NANO_INIT = pathlib.Path(os.environ.get("COMPASS_NANO_INIT") or os.environ.get("NANO_INIT")
                         or RUNNER.parent.parent / "nano-init/nano-init")


def _unprivileged_nano_init_on_a_tun0(configure):
    """nano-init as uid 65534 (no capability) in a fresh netns whose tun0 the test made and
    passes as fd 3, configured (as the runner does) or not."""
    import ctypes
    import fcntl
    import struct
    import threading
    ns = f"compass-t{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        out = {}

        def make_tun():
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
            assert libc.setns(fd, 0x40000000) == 0
            os.close(fd)
            tun = os.open("/dev/net/tun", os.O_RDWR)
            fcntl.ioctl(tun, 0x400454ca, struct.pack("16sH", b"tun0", 0x0001 | 0x1000))
            out["tun"] = tun

        t = threading.Thread(target=make_tun)
        t.start()
        t.join()
        if configure:
            subprocess.run(["ip", "-n", ns, "-batch", "-"], check=True, text=True, input=(
                "link set lo up\nlink set tun0 up\naddress add 100.64.0.1/10 dev tun0\n"
                "address add 100::1/64 dev tun0 nodad\nroute add 0.0.0.0/0 dev tun0\n"
                "route add ::/0 dev tun0\n"))
        with tempfile.TemporaryDirectory() as d:
            os.chmod(d, 0o755)
            # A boundary that accepts nothing: enough for a command that makes no flow.
            r = subprocess.run(
                ["ip", "netns", "exec", ns, "setpriv", "--reuid", "65534", "--regid", "65534",
                 "--clear-groups", "--inh-caps=-all", "--bounding-set=-all", str(NANO_INIT),
                 "run", f"{d}/none.sock", "sh", "-c", "ip -o addr show dev tun0; echo ran"],
                capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                pass_fds=(3,), preexec_fn=lambda: os.dup2(out["tun"], 3))
        os.close(out["tun"])
        return r
    finally:
        subprocess.run(["ip", "netns", "del", ns])


def test_nano_init_adopts_a_configured_tun0_without_net_admin():
    r = _unprivileged_nano_init_on_a_tun0(configure=True)
    assert r.returncode == 0, r.stderr
    assert "100.64.0.1/10" in r.stdout and "ran" in r.stdout, r.stdout


def test_nano_init_without_net_admin_names_what_tun0_lacks():
    r = _unprivileged_nano_init_on_a_tun0(configure=False)
    assert r.returncode == 70, (r.stdout, r.stderr)
    assert "ran" not in r.stdout
    for missing in ("tun0 lacks", "tun0 up", "100.64.0.1/10", "100::1/64",
                    "IPv4 default route", "IPv6 default route"):
        assert missing in r.stderr, r.stderr
