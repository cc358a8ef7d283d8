"""Fixtures for the sam-box integration tests.

Topology (one per session, names unique per run: "sbt" + 6 hex digits):

    netns BOX  (sam-box runs here; /etc/netns/BOX/{hosts,resolv.conf})
      veth 198.18.0.1/24, 2001:db8::1/64
      route 198.18.1.0/24 via 198.18.0.2   (UP does not forward: a silent black hole)
    netns UP   (the upstream test host: upstream.py)
      veth 198.18.0.2/24, 2001:db8::2/64
      HTTP :80 :8080, HTTPS :443 (test CA), UDP echo :5353, all dual-stack

Everything created here is removed at the end of the session, also when tests fail.
"""

import hashlib
import os
import pathlib
import secrets
import select
import shutil
import subprocess
import sys
import tempfile

import pytest

import boxlib
from boxlib import STD_ALLOW, SamBox, SidecarEcho, bundle_yaml
from shell import sh

HERE = pathlib.Path(__file__).resolve().parent

HOSTS = """\
127.0.0.1 localhost
::1 localhost
198.18.0.2 api.example.com files.pypi.org a.b.pypi.org pypi.org evilpypi.org dual.example.com
2001:db8::2 dual.example.com v6only.example.com
127.0.0.1 loopback.example.com
::1 loopback6.example.com
169.254.169.254 metadata.example.com
::ffff:127.0.0.1 mapped.example.com
fe80::1 linklocal6.example.com
224.0.0.1 multicast.example.com
0.0.0.0 unspecified.example.com
198.18.1.1 blackhole.example.com
198.18.0.1 self.example.com
2001:db8::1 self6.example.com
64:ff9b::7f00:1 nat64.example.com
"""

TLS_NAMES = ["api.example.com", "files.pypi.org", "a.b.pypi.org", "pypi.org",
             "dual.example.com", "v6only.example.com"]



def pytest_sessionstart(session):
    problems = []
    if os.geteuid() != 0:
        problems.append("the sam-box integration tests must run as root (they create network "
                        "namespaces)")
    elif shutil.which("ip") is None:
        problems.append("`ip` (iproute2) is not installed")
    else:
        r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
        if r.returncode != 0:
            problems.append(f"`ip netns` is unavailable: {r.stderr.strip()}")
    if problems:
        pytest.exit("sam-box integration tests cannot run: " + "; ".join(problems),
                    returncode=1)


@pytest.fixture(scope="session", autouse=True)
def _kill_leftover_boxes():
    yield
    for box in boxlib._live:
        box.kill()


class Topology:
    pass


@pytest.fixture(scope="session")
def topo():
    t = Topology()
    t.tag = "sbt" + secrets.token_hex(3)
    t.box, t.up = t.tag + "b", t.tag + "u"
    t.veth_box, t.veth_up = t.tag + "vb", t.tag + "vu"
    t.tmp = tempfile.mkdtemp(prefix=t.tag + "-", dir="/tmp")
    t.etc = pathlib.Path("/etc/netns") / t.box
    t.made_etc_netns = not t.etc.parent.exists()
    t.up_proc = None
    try:
        _build(t)
        yield t
    finally:
        _teardown(t)


def _build(t):
    sh("ip", "netns", "add", t.box)
    sh("ip", "netns", "add", t.up)
    sh("ip", "link", "add", t.veth_box, "type", "veth", "peer", "name", t.veth_up)
    sh("ip", "link", "set", t.veth_box, "netns", t.box)
    sh("ip", "link", "set", t.veth_up, "netns", t.up)
    for ns, dev, v4, v6 in ((t.box, t.veth_box, "198.18.0.1/24", "2001:db8::1/64"),
                            (t.up, t.veth_up, "198.18.0.2/24", "2001:db8::2/64")):
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", ns, "addr", "add", v4, "dev", dev)
        sh("ip", "-n", ns, "-6", "addr", "add", v6, "dev", dev, "nodad")
        sh("ip", "-n", ns, "link", "set", dev, "up")
    # UP has forwarding off, so this prefix is a silent black hole: SYNs to it vanish, which
    # is what a connect timeout needs. Set explicitly: some kernels start a new namespace
    # with forwarding on, and UP would then answer host-unreachable.
    sh("ip", "netns", "exec", t.up, "sysctl", "-qw", "net.ipv4.ip_forward=0")
    sh("ip", "-n", t.box, "route", "add", "198.18.1.0/24", "via", "198.18.0.2")

    t.etc.mkdir(parents=True)
    (t.etc / "hosts").write_text(HOSTS)
    (t.etc / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")

    www = pathlib.Path(t.tmp) / "www"
    www.mkdir()
    (www / "small.txt").write_bytes(b"hello from upstream\n")
    big = os.urandom(4 << 20)
    (www / "big.bin").write_bytes(big)
    t.big_sha256 = hashlib.sha256(big).hexdigest()
    t.big_len = len(big)
    t.ca, cert, key = boxlib.make_tls_material(t.tmp, TLS_NAMES)
    # Run a snapshot of the binary, so that a rebuild during the session cannot swap it
    # under a running test.
    if boxlib.SAM_BOX.exists():
        snap = pathlib.Path(t.tmp) / "sam-box"
        shutil.copy2(boxlib.SAM_BOX, snap)
        # The credential helper is found next to sam-box's own executable.
        verifier = boxlib.SAM_BOX.parent / "sam-box-verify"
        if verifier.exists():
            shutil.copy2(verifier, snap.parent / verifier.name)
        boxlib.SAM_BOX_RUN = snap

    t.up_proc = subprocess.Popen(
        ["ip", "netns", "exec", t.up, sys.executable, str(HERE / "upstream.py"),
         "--dir", str(www), "--cert", cert, "--key", key],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    r, _, _ = select.select([t.up_proc.stdout], [], [], 15)
    line = t.up_proc.stdout.readline() if r else b""
    if line.strip() != b"ready":
        t.up_proc.kill()
        raise RuntimeError("upstream servers did not start: "
                           + t.up_proc.stderr.read().decode(errors="replace"))
    # The veth must pass traffic before any test relies on it.
    boxlib.wait_for(lambda: _probe(t), timeout=10, what="upstream reachable from BOX")


def _probe(t):
    s = boxlib.netns_connect(t.box, ("198.18.0.2", 80), timeout=1)
    s.close()
    return True


def _teardown(t):
    if t.up_proc is not None and t.up_proc.poll() is None:
        t.up_proc.terminate()
        try:
            t.up_proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            t.up_proc.kill()
            t.up_proc.wait(timeout=5)
    for box in boxlib._live:
        box.kill()
    # Any process still inside the namespaces (started by a failed test) goes too.
    for ns in (t.box, t.up):
        r = sh("ip", "netns", "pids", ns, check=False)
        for pid in r.stdout.split():
            try:
                os.kill(int(pid), 9)
            except (ProcessLookupError, ValueError):
                pass
    for ns in (t.box, t.up):
        sh("ip", "netns", "del", ns, check=False)  # also removes the veth pair
    shutil.rmtree(t.etc, ignore_errors=True)
    if t.made_etc_netns:
        try:
            t.etc.parent.rmdir()  # only if still empty (another run may be using it)
        except OSError:
            pass
    shutil.rmtree(t.tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------------
# sam-box fixtures


@pytest.fixture
def sam_box(topo):
    """A factory: sam_box(args=..., bundle=...) starts a box and stops it after the test."""
    boxes = []

    def make(args=(), bundle=None, start=True, **kw):
        b = SamBox(topo, args=args, bundle=bundle, **kw)
        boxes.append(b)
        return b.start() if start else b

    yield make
    for b in boxes:
        b.kill()


@pytest.fixture(scope="module")
def sidecar(topo):
    path = pathlib.Path(topo.tmp) / f"node-{secrets.token_hex(3)}.sock"
    s = SidecarEcho(path)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def std_box(topo, sidecar):
    """The standard box: an agent identity (insecure bundle), STD_ALLOW, the echo sidecar."""
    b = SamBox(topo, bundle=bundle_yaml(allow=STD_ALLOW),
               args=["--insecure-unverified-bundle", "--sidecar-socket", sidecar.path])
    b.start()
    yield b
    b.kill()


@pytest.fixture
def box(std_box):
    assert std_box.alive, f"the standard sam-box died:\n{std_box.stderr_text()[-3000:]}"
    return std_box
