"""nano-init over ONE byte stream to sam-box (issue 5): every flow an HTTP/2 stream.

nano-init runs as PID 1 of fresh PID + network namespaces (nano_fixtures.run_nano) against the
standard sam-box (conftest.py: api.example.com is the test host in UP, HTTP on 80, UDP echo
on 5353), with BOUNDARY
  - h2+unix://<sam-box socket>: h2c over one Unix socket connection;
  - h2+dev://<pty>: h2c over a real pty that socat bridges to sam-box's socket — the
    "plain byte stream, no VM" case of a virtio-serial port.
Nothing is sent anywhere but loopback and the test namespaces.
"""

import hashlib
import os
import pathlib
import shlex
import subprocess

import pytest

from boxlib import wait_for
from nano_fixtures import (dummy_boundary, nano, nano_has_netstack,  # noqa: F401
                           nano_command, nano_tmp, run_nano)

PY = "/usr/bin/python3"
ALLOWED = "api.example.com"
DENIED = "denied.example.org"  # not in STD_ALLOW: the virtual DNS answers it, sam-box refuses
BULK = 8 << 20


@pytest.fixture(params=["unix", "dev"])
def boundary(request, nano, std_box, tmp_path):
    """The BOUNDARY argument for one sandbox, over each kind of byte stream."""
    assert std_box.alive, f"sam-box died:\n{std_box.stderr_text()[-3000:]}"
    if request.param == "unix":
        yield f"h2+unix://{std_box.socket_path}"
        return
    link = tmp_path / "vport"
    socat = subprocess.Popen(["socat", f"PTY,link={link},raw,echo=0",
                              f"UNIX-CONNECT:{std_box.socket_path}"],
                             stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: link.exists() or socat.poll() is not None, timeout=10)
        assert socat.poll() is None, socat.stderr.read().decode(errors="replace")
        yield f"h2+dev://{link}"
    finally:
        socat.terminate()
        socat.wait(timeout=10)


@pytest.fixture(scope="module")
def bulk_file(topo):
    """BULK random bytes in UP's web root (served as /h2bulk.bin)."""
    path = pathlib.Path(topo.tmp) / "www" / "h2bulk.bin"
    data = os.urandom(BULK)
    path.write_bytes(data)
    os.chmod(path, 0o644)
    yield hashlib.sha256(data).hexdigest()
    path.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def big_file(topo):
    """64 MiB of random bytes served as /h2big.bin."""
    path = pathlib.Path(topo.tmp) / "www" / "h2big.bin"
    h = hashlib.sha256()
    with open(path, "wb") as f:
        for _ in range(64):
            chunk = os.urandom(1 << 20)
            h.update(chunk)
            f.write(chunk)
    os.chmod(path, 0o644)
    yield h.hexdigest(), 64 << 20
    path.unlink(missing_ok=True)


def sandbox(boundary, script, timeout=60):
    return run_nano(boundary, ["sh", "-c", script], timeout=timeout)


def test_allowed_name_and_a_larger_download_are_byte_exact(boundary, bulk_file):
    r = sandbox(boundary,
                f"curl -sS --fail --max-time 10 http://{ALLOWED}/small.txt && echo -- && "
                f"curl -sS --fail --max-time 60 http://{ALLOWED}/h2bulk.bin | sha256sum",
                timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    small, bulk = r.stdout.split("--\n")
    assert small == "hello from upstream\n"
    assert bulk.split()[0] == bulk_file, "download differs"


def test_denied_name_is_refused_not_timed_out(boundary):
    # -v: curl sums up a refusal of both families as "Couldn't connect to server"; each
    # connect() underneath must have failed with ECONNREFUSED, well within --max-time.
    r = sandbox(boundary, f"curl -sSv --max-time 5 http://{DENIED}/ 2>&1; echo rc=$?")
    assert "Connection refused" in r.stdout, r.stdout + r.stderr
    assert "rc=7" in r.stdout, r.stdout
    assert "timed out" not in r.stdout


def test_concurrent_flows_share_the_byte_stream(boundary):
    n = 8
    script = " ".join(
        f"curl -sS --fail --max-time 20 -o /tmp/out{i} http://{ALLOWED}/small.txt &"
        for i in range(n)) + " wait; " + " ".join(f"cat /tmp/out{i};" for i in range(n))
    r = sandbox(boundary, script)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout == "hello from upstream\n" * n, r.stdout + r.stderr


SLOW_READER = r"""
import hashlib, sys, time
first = sys.stdin.buffer.read(1)
time.sleep(2)  # the test condition: a stalled agent, not a wait for readiness
peak = [l for l in open("/proc/1/status") if l.startswith("VmHWM:")][0].split()[1]
h = hashlib.sha256(first)
for chunk in iter(lambda: sys.stdin.buffer.read(1 << 16), b""):
    h.update(chunk)
print(h.hexdigest(), peak)
"""


def test_a_stalled_agent_does_not_make_nano_init_buffer_the_download(boundary, big_file):
    """HTTP/2 flow control end to end: while the agent reads nothing, sam-box may send only
    what nano-init credited, so nano-init's peak RSS (VmHWM of PID 1) stays far below the
    file's size; afterwards the download completes byte-exact."""
    digest, size = big_file
    r = sandbox(boundary, f"curl -sS --fail --max-time 60 http://{ALLOWED}/h2big.bin | "
                f"{PY} -c {shlex.quote(SLOW_READER)}", timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    got, peak_kib = r.stdout.split()
    assert got == digest, "download differs"
    assert int(peak_kib) * 1024 < size // 4, f"nano-init peaked at {peak_kib} KiB"


STALLED_DOWNLOADS = r"""
import socket, sys, time, urllib.request
held = []
for _ in range(int(sys.argv[1])):
    s = socket.create_connection((sys.argv[2], 80), timeout=10)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(b"GET /h2big.bin HTTP/1.0\r\nHost: x\r\n\r\n")  # and never read
    held.append(s)
def rss():  # nano-init's, as PID 1: it grows while the downloads fill their windows
    return [l.split()[1] for l in open("/proc/1/status") if l.startswith("VmRSS")][0]
seen = []
while len(seen) < 200 and (len(seen) < 10 or len(set(seen[-10:])) > 1):
    seen.append(rss())
    time.sleep(0.1)
print(urllib.request.urlopen(f"http://{sys.argv[2]}/small.txt", timeout=20).read().decode(),
      end="")
"""


def test_downloads_the_agent_never_reads_hold_back_only_their_own_streams(boundary, big_file):
    """100 downloads the agent never reads fill their own streams' windows (256 KiB each, more
    than nano-init's 16 MiB connection window in all) and a fresh request still gets its
    answer. Before, those bytes also used up the connection window, credited back only as
    each flow took them, and every other flow of the sandbox froze."""
    r = sandbox(boundary, f"{PY} -c {shlex.quote(STALLED_DOWNLOADS)} 100 {ALLOWED}",
                timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert r.stdout == "hello from upstream\n", r.stdout


UDP_CLIENT = r"""
import socket, sys
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
addr = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_DGRAM)[0][4]
print("resolved", addr[0])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(5.0)
for i in range(n):
    p = bytes([i]) * (1 + 100 * i) + b"#%d" % i
    s.sendto(p, addr)
    try:
        data, _ = s.recvfrom(65535)
        print("echo", "exact" if data == p else "differs", len(data))
    except socket.timeout:
        print("timeout")
"""


def test_udp_echo_and_dns_stays_virtual(boundary):
    r = sandbox(boundary, f"{PY} -c {shlex.quote(UDP_CLIENT)} {ALLOWED} 5353 5")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.strip().splitlines()
    resolved = lines[0].split()[1]
    a, b, _, _ = (int(x) for x in resolved.split("."))
    assert a == 100 and 64 <= b <= 127, f"DNS answered {resolved}, not a synthetic address"
    assert [ln.split()[:2] for ln in lines[1:]] == [["echo", "exact"]] * 5, r.stdout


def test_a_missing_device_stops_start_up_with_the_reason(nano, tmp_path):
    r = run_nano(f"h2+dev://{tmp_path}/no-such-port", ["true"])
    assert r.returncode == 70, r.stdout + r.stderr
    assert f"open({tmp_path}/no-such-port, O_RDWR)" in r.stderr, r.stderr


def test_a_failed_byte_stream_fails_open_flows_and_refuses_new_ones(nano, std_box, tmp_path,
                                                                     big_file):
    """socat is the byte stream. Once it is gone, a download in progress fails (not a hang
    until --max-time) and a new flow is refused."""
    link = tmp_path / "vport"
    go, bigrc, part = tmp_path / "go", tmp_path / "bigrc", tmp_path / "big.part"
    socat = subprocess.Popen(["socat", f"PTY,link={link},raw,echo=0",
                              f"UNIX-CONNECT:{std_box.socket_path}"],
                             stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: link.exists(), timeout=10)
        script = (f"curl -sS --max-time 10 http://{ALLOWED}/small.txt; "
                  f"(curl -sS --limit-rate 200k --max-time 50 -o {part} "
                  f"http://{ALLOWED}/h2big.bin 2>/dev/null; echo $? > {bigrc}) & "
                  f"while [ ! -e {go} ]; do sleep 0.05; done; "
                  f"curl -sSv --max-time 5 http://{ALLOWED}/small.txt 2>&1; echo rc=$?; wait")
        proc = subprocess.Popen(nano_command(f"h2+dev://{link}", ["sh", "-c", script]),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL)
        try:
            # The download is under way once its first bytes are in the file.
            wait_for(lambda: (part.exists() and part.stat().st_size > 0) or
                     proc.poll() is not None, timeout=30)
            socat.terminate()
            socat.wait(timeout=10)
            go.touch()
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    finally:
        if socat.poll() is None:
            socat.terminate()
            socat.wait(timeout=10)
    assert out.startswith("hello from upstream\n"), out + err
    assert "rc=7" in out, out + err
    assert "timed out" not in out, out + err
    rc = int(bigrc.read_text())
    assert rc not in (0, 28), f"the download in progress ended with curl exit {rc}"

