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
    sandbox's DNS, but nothing comes back (within 1 s per datagram)."""
    r = sandbox(box, udp_cmd(ALLOWED) + " && echo -- && " + udp_cmd(DENIED, n=3), timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    ok, denied = r.stdout.split("--\n")
    ok_lines = ok.strip().splitlines()
    assert ok_lines[0].startswith("resolved "), ok
    assert [ln.split()[:2] for ln in ok_lines[1:]] == [["echo", "exact"]] * 5, ok
    denied_lines = denied.strip().splitlines()
    assert denied_lines[0].startswith("resolved "), denied  # the virtual DNS answers it
    assert denied_lines[1:] == ["timeout"] * 3, denied
