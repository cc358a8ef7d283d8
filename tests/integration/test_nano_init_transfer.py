"""Bulk TCP and UDP through nano-init + a real sam-box.

nano-init runs as PID 1 of fresh PID + network namespaces (nano_fixtures.run_nano) and carries
every flow to a real sam-box in the BOX namespace, which dials the test hosts in UP
(conftest.py / upstream.py: api.example.com at 198.18.0.2, plain HTTP on 80 with
POST /sha256, UDP echo on 5353). Nothing is sent anywhere but loopback and the test
namespaces.
"""

import hashlib
import os
import pathlib
import shlex

import pytest

from nano_fixtures import (dummy_boundary, nano, nano_has_netstack,  # noqa: F401
                           nano_tmp, run_nano)

PY = "/usr/bin/python3"
ALLOWED = "api.example.com"
DENIED = "denied.example.org"  # not in STD_ALLOW: the virtual DNS answers it, sam-box refuses
BULK = 100 << 20


@pytest.fixture
def box(nano, std_box):
    assert std_box.alive, f"sam-box died:\n{std_box.stderr_text()[-3000:]}"
    return std_box


@pytest.fixture(scope="module")
def bulk_file(topo):
    """BULK random bytes in UP's web root (served as /bulk.bin); also the upload source."""
    path = pathlib.Path(topo.tmp) / "www" / "bulk.bin"
    h = hashlib.sha256()
    with open(path, "wb") as f:
        for _ in range(BULK >> 20):
            chunk = os.urandom(1 << 20)
            h.update(chunk)
            f.write(chunk)
    os.chmod(path, 0o644)
    yield path, h.hexdigest()
    path.unlink(missing_ok=True)


def sandbox(box, script, timeout=60):
    """Runs `sh -c script` as the agent of nano-init, wired to `box`."""
    return run_nano(box.socket_path, ["sh", "-c", script], timeout=timeout)


def test_bulk_100mib_download_and_upload_are_byte_exact(box, bulk_file):
    """100 MiB each way over plain HTTP, checked by SHA-256 on the far side of each copy."""
    path, digest = bulk_file
    r = sandbox(box,
                f"curl -sS --fail --max-time 30 http://{ALLOWED}/bulk.bin | sha256sum"
                " && echo -- && "
                f"curl -sS --fail --max-time 30 --data-binary @{path} "
                f"-H 'Content-Type: application/octet-stream' http://{ALLOWED}/sha256",
                timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    down, up = r.stdout.split("--\n")
    assert down.split()[0] == digest, "download differs"
    assert up.strip() == digest, "upload differs"


UDP_CLIENT = r"""
import socket, sys
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
try:
    addr = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_DGRAM)[0][4]
except OSError as e:
    print("resolve-error", e.errno)
    sys.exit(0)
print("resolved", addr[0])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(1.0)
payloads = [bytes([i]) * (1 + 100 * i) + b"#%d" % i for i in range(n)]
got = []
for p in payloads:
    try:
        s.sendto(p, addr)
    except OSError as e:
        print("send-error", e.errno)
        continue
    try:
        data, _ = s.recvfrom(65535)
        got.append(data)
        print("echo", "exact" if data == p else "differs", len(data))
    except socket.timeout:
        print("timeout")
    except OSError as e:
        print("recv-error", e.errno)
"""


def udp_cmd(host, n=5):
    return f"{PY} -c {shlex.quote(UDP_CLIENT)} {host} 5353 {n}"


def test_udp_echo_allowed_name_and_silence_for_denied_name(box):
    """An allowed name: each datagram echoed byte-exact. A denied name: resolvable through the
    sandbox's DNS, but nothing comes back (within 1 s per datagram): this client's socket is
    not connected, and Linux reports no ICMP error to such a socket (udp(7))."""
    r = sandbox(box, udp_cmd(ALLOWED) + " && echo -- && " + udp_cmd(DENIED, n=3), timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    ok, denied = r.stdout.split("--\n")
    ok_lines = ok.strip().splitlines()
    assert ok_lines[0].startswith("resolved "), ok
    assert [ln.split()[:2] for ln in ok_lines[1:]] == [["echo", "exact"]] * 5, ok
    denied_lines = denied.strip().splitlines()
    assert denied_lines[0].startswith("resolved "), denied  # the virtual DNS answers it
    assert denied_lines[1:] == ["timeout"] * 3, denied


CONNECTED_UDP_CLIENT = r"""
import socket, sys, time
host, family = sys.argv[1], {"4": socket.AF_INET, "6": socket.AF_INET6}[sys.argv[2]]
addr = socket.getaddrinfo(host, 5353, family, socket.SOCK_DGRAM)[0][4]
s = socket.socket(family, socket.SOCK_DGRAM)
s.settimeout(10.0)
s.connect(addr)
for attempt in range(2):
    if attempt:
        time.sleep(1.1)  # refusals are answered at most once a second per flow
    try:
        s.send(b"hello")
        data = s.recv(65535)
        print("echo", data == b"hello")
    except ConnectionRefusedError:
        print("refused")
    except socket.timeout:
        print("timeout")
"""


@pytest.mark.parametrize("family", ["4", "6"])
def test_a_connected_udp_socket_to_a_denied_name_is_refused_not_left_waiting(box, family):
    """A refused UDP flow is answered as a closed port would be (ICMP port unreachable), so a
    connected socket fails with ECONNREFUSED instead of waiting out its timeout (10 s here);
    an allowed name still echoes on the same kind of socket."""
    script = shlex.quote(CONNECTED_UDP_CLIENT)
    r = sandbox(box, f"{PY} -c {script} {DENIED} {family} && echo -- && "
                     f"{PY} -c {script} {ALLOWED} {family}", timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    denied, allowed = r.stdout.split("--\n")
    # The first datagram's refusal, and a later one's while the flow is held refused.
    assert denied.split() == ["refused", "refused"], r.stdout + r.stderr
    assert allowed.split() == ["echo", "True", "echo", "True"], r.stdout + r.stderr
