"""Helpers of the microvm tier's tests (test_runner_microvm.py, test_runner_microvm_firewall.py):
where the binaries and the state are, running compass-runner, finding what one agent left
behind (QEMU, sam-box, its state dir, and egress `firewall`'s netns, veth and host NAT table),
a runner kept in the background (`Live`), and the probe helpers the guests' Python scripts
start with.

Binaries: COMPASS_RUNNER (default build/src/compass-runner/compass-runner); the runner finds
sam-box and nano-init beside it in the build tree, or COMPASS_SAM_BOX / COMPASS_NANO_INIT.

A test module still defines its own fixtures (pytest finds fixtures only in the test module
and conftest.py); `build_image()` is the body of their `image` fixture.
"""

import json
import os
import pathlib
import re
import select
import shutil
import subprocess
import time

import pytest

import probes

REPO = pathlib.Path(__file__).resolve().parents[2]
RUNNER = pathlib.Path(os.environ.get("COMPASS_RUNNER",
                                     REPO / "build/src/compass-runner/compass-runner"))
if not RUNNER.is_absolute():
    RUNNER = REPO / RUNNER
NANO_INIT = pathlib.Path(os.environ.get("COMPASS_NANO_INIT") or os.environ.get("NANO_INIT")
                         or RUNNER.parent.parent / "nano-init/nano-init")
STATE_ROOT = pathlib.Path(os.environ.get("COMPASS_STATE_DIR", "/run/compass-runner"))
GUEST_KERNEL = pathlib.Path(os.environ.get("COMPASS_GUEST_KERNEL")
                            or "/usr/local/lib/compass/guest-kernel")
QEMU = os.environ.get("COMPASS_QEMU") or "qemu-system-x86_64"
ALLOW = "allowed.example:80"  # port-restricted: allowed.example:53 and :853 stay refused
TCG = ("--backend", "microvm", "--accel", "tcg")


def runner_env(**extra):
    env = dict(os.environ)
    env.pop("CONTAINERS_CONF", None)
    for ours, theirs in (("COMPASS_SAM_BOX", "SAM_BOX"), ("COMPASS_NANO_INIT", "NANO_INIT")):
        if theirs in os.environ and ours not in os.environ:
            env[ours] = str(pathlib.Path(os.environ[theirs]).resolve())
    env.update(extra)
    return env


def runner(*args, timeout=300, env=None):
    return subprocess.run([str(RUNNER), *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, env=env or runner_env())


def build_image():
    """The `image` fixture's body: root, a built runner, and the default image (cached)."""
    if os.geteuid() != 0:
        pytest.fail("the microvm tier tests run as root")
    if not RUNNER.exists():
        pytest.fail(f"compass-runner not found at {RUNNER} (set COMPASS_RUNNER)")
    r = runner("image", "build", timeout=1800)
    assert r.returncode == 0, r.stderr


def guest_missing():
    """Why no microVM guest can boot on this host (not root, no guest kernel, no QEMU), or
    None. The kernel is looked for as the runner looks for it: boot/vmlinuz-RELEASE."""
    if os.geteuid() != 0:
        return "the microvm tier tests run as root"
    if not list(GUEST_KERNEL.glob("boot/vmlinuz-*")):
        return (f"no guest kernel in {GUEST_KERNEL} (boot/vmlinuz-RELEASE): run "
                "scripts/install-deps or set COMPASS_GUEST_KERNEL")
    if shutil.which(QEMU) is None:
        return f"{QEMU} is not installed (set COMPASS_QEMU)"
    return None


def guests_of(agent_id):
    """Running QEMU and sam-box processes of one agent (found by their command lines)."""
    found = []
    for proc in pathlib.Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state == "Z" or not argv or str(STATE_ROOT / agent_id).encode() not in b" ".join(argv):
            continue
        name = os.path.basename(argv[0].decode(errors="replace"))
        if name.startswith("qemu-system") or name == "sam-box":
            found.append(f"{name} pid {proc.name}")
    return found


def firewall_traces(agent_id):
    """What egress `firewall` makes on the host for one agent and that is still there: the
    netns compass-<id>, the veth cv<id>, the NAT table inet compass_nat_<id>."""
    found = []
    netns = pathlib.Path(f"/run/netns/compass-{agent_id}")
    if netns.exists():
        found.append(f"netns {netns}")
    link = subprocess.run(["ip", "-o", "link", "show", f"cv{agent_id}"], capture_output=True,
                          text=True)
    if link.returncode == 0:
        found.append(f"link cv{agent_id}: {link.stdout.strip()}")
    if shutil.which("nft"):
        tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True)
        if f"table inet compass_nat_{agent_id}" in [l.strip() for l in tables.stdout.split("\n")]:
            found.append(f"nft table inet compass_nat_{agent_id}")
    return found


def leftovers(agent_id):
    """Everything of one agent still on the host (empty once it is gone): its QEMU and
    sam-box, its state dir, and (egress `firewall`) its netns, veth and NAT table."""
    left = guests_of(agent_id)
    if (STATE_ROOT / agent_id).exists():
        left.append(f"state dir {STATE_ROOT / agent_id}")
    return left + firewall_traces(agent_id)


def wait_for(predicate, what, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class Live:
    """A microvm runner in the background: waits for its "agent ID running" line."""

    def __init__(self, *cmd, allow=(ALLOW,), extra=(), env=None):
        args = [str(RUNNER), "run", *TCG]
        for a in allow:
            args += ["--egress-allow", a]
        self.proc = subprocess.Popen([*args, *extra, "--", *cmd], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=env or runner_env())
        self.err = ""
        self.id = self._wait_running()
        self.record = json.loads((STATE_ROOT / self.id / "agent.json").read_text())

    def read_until(self, pattern, timeout):
        """Reads the runner's stderr (into .err) until `pattern` matches all of it; the match,
        or None at end of file or after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        fd = self.proc.stderr.fileno()
        while True:
            m = re.search(pattern, self.err)
            if m:
                return m
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            r, _, _ = select.select([fd], [], [], min(0.5, left))
            if r:
                chunk = os.read(fd, 65536).decode(errors="replace")
                if not chunk:
                    return None
                self.err += chunk

    def _wait_running(self, timeout=240):
        m = self.read_until(r"agent (a[0-9a-f]{10}) running", timeout)
        if m:
            return m.group(1)
        self.proc.kill()
        raise AssertionError(f"the agent did not start: {self.err}")

    def wait(self, timeout=120):
        out, err = self.proc.communicate(timeout=timeout)
        self.err += err.decode(errors="replace")
        return self.proc.returncode, out.decode(errors="replace")

    def end(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
            runner("gc")
        return leftovers(self.id)


# The start of a guest's probe script (`python3 -c PROBE_HELPERS + …`): probes.py's run(),
# tcp() and boundary_egress() with a TCG guest's timeouts, and open_ports() try the guest's
# virtio-serial ports as the agent.
PROBE_HELPERS = probes.helpers(run_secs=60, connect_secs=15, recv_secs=5) + r'''
def open_ports():
    import glob
    out = {}
    for dev in sorted(glob.glob("/dev/vport*")):
        try:
            os.close(os.open(dev, os.O_RDWR))
            out[dev] = "opened"
        except OSError as e:
            out[dev] = type(e).__name__
    return out
'''
