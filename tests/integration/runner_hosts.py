"""Test hosts for the compass-runner tests: two real HTTP servers that agents reach by name.

    root netns (where compass-runner, sam-box and podman run)
      veth cr-up-h  198.18.5.1/24, 2001:db8:5::1/64
    netns cr-up
      veth cr-up-u  198.18.5.2 198.18.5.3 /24, 2001:db8:5::2 2001:db8:5::3 /64
      HTTP :80        answers "allowed.example\n" on .2/::2 and "denied.example\n" on .3/::3
      DNS  UDP+TCP :53  answers every A query with 198.18.5.2 and AAAA with 2001:db8:5::2
                       (a real outside resolver: a test that sees its answer has escaped)
      TCP  :853       writes "dot-853\n" and closes (DNS-over-TLS's port)

/etc/hosts gains a marked block ("# compass-test-hosts begin" … "end") naming
allowed.example and denied.example (v4 and v6), so sam-box, the firewall's forwarder and
the host resolve them. The file is edited in place (same inode), so bind mounts of it stay
valid.

The podman tier runs in the root netns (podman cannot run under `ip netns exec`), so the
hosts hang off the root netns. Forwarding (for the firewall mode) is not touched here.

Several test modules — and several pytest processes at once — may use the hosts: the first
user builds them, the last one removes them. /run/compass-test-hosts/users holds the pids
of the users; a dead user's entry is dropped, and when no live user remains at start-up,
whatever a killed session left (netns, veth, servers, /etc/hosts block) is removed first.

Usage in a test module:

    from runner_hosts import runner_hosts  # noqa: F401 (a fixture)

    def test_x(runner_hosts):
        runner_hosts.ALLOWED_V4 ...
"""

import fcntl
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import pytest

from shell import sh

NETNS = "cr-up"
VETH_HOST = "cr-up-h"
VETH_UP = "cr-up-u"
HOST_V4, HOST_V6 = "198.18.5.1", "2001:db8:5::1"
ALLOWED_V4, DENIED_V4 = "198.18.5.2", "198.18.5.3"
ALLOWED_V6, DENIED_V6 = "2001:db8:5::2", "2001:db8:5::3"
ALLOWED, DENIED = "allowed.example", "denied.example"
SUBNET_V4, SUBNET_V6 = "198.18.5.0/24", "2001:db8:5::/64"

HOSTS_FILE = pathlib.Path("/etc/hosts")
BEGIN, END = "# compass-test-hosts begin", "# compass-test-hosts end"
HOSTS_BLOCK = (f"{BEGIN}\n{ALLOWED_V4} {ALLOWED}\n{DENIED_V4} {DENIED}\n"
               f"{ALLOWED_V6} {ALLOWED}\n{DENIED_V6} {DENIED}\n{END}\n")

STATE = pathlib.Path("/run/compass-test-hosts")
LOCK, USERS, SERVER_PID = STATE / "lock", STATE / "users", STATE / "server.pid"


# ---------------------------------------------------------------------------------------
# /etc/hosts block


def _strip_block(text):
    out, inside = [], False
    for line in text.splitlines(keepends=True):
        if line.strip() == BEGIN:
            inside = True
        elif line.strip() == END:
            inside = False
        elif not inside:
            out.append(line)
    return "".join(out)


def _write_hosts(text):
    # In place, never by rename: the file keeps its inode, so whatever bind-mounts
    # /etc/hosts (a container, a sandbox, /etc/hosts itself being a mount point) keeps
    # seeing the current text. Overwriting from the start and truncating after (rather than
    # truncating first) means a resolver never reads an empty file; and as the block is
    # always appended at the end, adding only extends the file and removing only cuts it.
    with open(HOSTS_FILE, "r+") as f:
        f.write(text)
        f.truncate()


def _add_hosts_block():
    text = _strip_block(HOSTS_FILE.read_text())
    if text and not text.endswith("\n"):
        text += "\n"
    _write_hosts(text + HOSTS_BLOCK)


def _remove_hosts_block():
    text = HOSTS_FILE.read_text()
    stripped = _strip_block(text)
    if stripped != text:
        _write_hosts(stripped)


# ---------------------------------------------------------------------------------------
# Build and remove


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _kill_server():
    try:
        pid = int(SERVER_PID.read_text())
    except (OSError, ValueError):
        pid = None
    if pid is not None and _alive(pid):
        os.kill(pid, signal.SIGKILL)
    SERVER_PID.unlink(missing_ok=True)
    # Anything else still in the namespace (a server from a session killed before it wrote
    # its pid) goes too, or `ip netns del` would leave the namespace alive behind it.
    r = sh("ip", "netns", "pids", NETNS, check=False)
    for p in r.stdout.split():
        try:
            os.kill(int(p), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def _remove_all():
    _kill_server()
    sh("ip", "netns", "del", NETNS, check=False)  # also removes the veth pair
    sh("ip", "link", "del", VETH_HOST, check=False)  # if the namespace was already gone
    _remove_hosts_block()


def _build():
    sh("ip", "netns", "add", NETNS)
    sh("ip", "link", "add", VETH_HOST, "type", "veth", "peer", "name", VETH_UP)
    sh("ip", "link", "set", VETH_UP, "netns", NETNS)
    sh("ip", "addr", "add", f"{HOST_V4}/24", "dev", VETH_HOST)
    sh("ip", "-6", "addr", "add", f"{HOST_V6}/64", "dev", VETH_HOST, "nodad")
    sh("ip", "link", "set", VETH_HOST, "up")
    sh("ip", "-n", NETNS, "link", "set", "lo", "up")
    for a in (ALLOWED_V4, DENIED_V4):
        sh("ip", "-n", NETNS, "addr", "add", f"{a}/24", "dev", VETH_UP)
    for a in (ALLOWED_V6, DENIED_V6):
        sh("ip", "-n", NETNS, "-6", "addr", "add", f"{a}/64", "dev", VETH_UP, "nodad")
    sh("ip", "-n", NETNS, "link", "set", VETH_UP, "up")
    # Answers go back to whatever the root netns sends from (the firewall mode NATs agents
    # to the host end; sam-box connects from it directly).
    sh("ip", "-n", NETNS, "route", "add", "default", "via", HOST_V4)
    sh("ip", "-n", NETNS, "-6", "route", "add", "default", "via", HOST_V6)

    log = STATE / "server.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", NETNS, sys.executable, __file__, "--serve"],
            stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
            start_new_session=True)  # outlives this session when another one still uses it
    line = proc.stdout.readline()
    proc.stdout.close()  # the server prints nothing after "ready"
    if line.strip() != b"ready":
        proc.kill()
        raise RuntimeError("test host servers did not start: "
                           + log.read_text(errors="replace"))
    SERVER_PID.write_text(str(proc.pid))
    _add_hosts_block()
    _wait_reachable()


def _wait_reachable(timeout=10.0):
    deadline = time.monotonic() + timeout
    for family, addr in ((socket.AF_INET, ALLOWED_V4), (socket.AF_INET6, ALLOWED_V6)):
        while True:
            try:
                with socket.create_connection((addr, 80), timeout=1):
                    break
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"test host {addr}:80 unreachable from the root netns: "
                                       f"{exc}") from exc
                time.sleep(0.05)


class _Users:
    """The lock-protected list of sessions using the hosts."""

    def __enter__(self):
        STATE.mkdir(mode=0o700, exist_ok=True)
        self.fd = os.open(LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            pids = [int(p) for p in USERS.read_text().split()]
        except (OSError, ValueError):
            pids = []
        self.pids = [p for p in pids if _alive(p)]
        return self

    def save(self):
        USERS.write_text("".join(f"{p}\n" for p in self.pids))

    def __exit__(self, *exc):
        os.close(self.fd)


class Hosts:
    """What a test needs to know of the hosts (all module constants, for convenience)."""

    NETNS, VETH_HOST = NETNS, VETH_HOST
    HOST_V4, HOST_V6 = HOST_V4, HOST_V6
    ALLOWED, DENIED = ALLOWED, DENIED
    ALLOWED_V4, DENIED_V4, ALLOWED_V6, DENIED_V6 = ALLOWED_V4, DENIED_V4, ALLOWED_V6, DENIED_V6
    SUBNET_V4, SUBNET_V6 = SUBNET_V4, SUBNET_V6

    @staticmethod
    def fetch(addr, path="/", timeout=5.0):
        """GET http://addr/path from the root netns; returns the body (proves reachability)."""
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect((addr, 80))
            s.sendall(f"GET {path} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
            data = b""
            while chunk := s.recv(4096):
                data += chunk
        return data.split(b"\r\n\r\n", 1)[1].decode()


def acquire():
    """Joins the users of the hosts (building them if this is the first); returns Hosts."""
    with _Users() as u:
        me = os.getpid()
        if not u.pids:
            _remove_all()  # a killed session's leftovers
            try:
                _build()
            except BaseException:
                _remove_all()
                u.pids = []
                u.save()
                raise
        if me not in u.pids:
            u.pids.append(me)
        u.save()
    return Hosts()


def release():
    """Leaves the users; the last one removes everything."""
    with _Users() as u:
        u.pids = [p for p in u.pids if p != os.getpid()]
        u.save()
        if not u.pids:
            _remove_all()


@pytest.fixture(scope="module")
def runner_hosts():
    hosts = acquire()
    try:
        yield hosts
    finally:
        release()


# ---------------------------------------------------------------------------------------
# The servers (run as `runner_hosts.py --serve` inside cr-up)


def _serve():
    import socketserver
    import struct
    import threading

    names = {ALLOWED_V4: ALLOWED, ALLOWED_V6: ALLOWED, DENIED_V4: DENIED, DENIED_V6: DENIED}

    def local_name(sock):
        addr = sock.getsockname()[0]
        if addr.startswith("::ffff:"):
            addr = addr[len("::ffff:"):]
        return names.get(addr, "unknown")

    def dns_answer(query):
        """A minimal authoritative answer: A → ALLOWED_V4, AAAA → ALLOWED_V6, else none."""
        if len(query) < 12:
            return None
        qd = struct.unpack("!H", query[4:6])[0]
        if qd != 1:
            return None
        i = 12
        while i < len(query) and query[i] != 0:
            i += 1 + query[i]
        end = i + 5
        if end > len(query):
            return None
        qtype = struct.unpack("!H", query[i + 1:i + 3])[0]
        question = query[12:end]
        rdata = {1: socket.inet_pton(socket.AF_INET, ALLOWED_V4),
                 28: socket.inet_pton(socket.AF_INET6, ALLOWED_V6)}.get(qtype)
        flags = 0x8400 | (query[2] & 0x01) << 8  # QR, AA, copy RD
        head = query[:2] + struct.pack("!HHHHH", flags, 1, 1 if rdata else 0, 0, 0)
        answer = b""
        if rdata:
            answer = struct.pack("!HHHIH", 0xC00C, qtype, 1, 60, len(rdata)) + rdata
        return head + question + answer

    class Dual:
        address_family = socket.AF_INET6
        allow_reuse_address = True
        daemon_threads = True

        def server_bind(self):
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            super().server_bind()

        def handle_error(self, request, client_address):
            pass

    class TCP(Dual, socketserver.ThreadingTCPServer):
        pass

    class UDP(Dual, socketserver.ThreadingUDPServer):
        pass

    class Http(socketserver.StreamRequestHandler):
        def handle(self):
            self.connection.settimeout(10)
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass
            body = (local_name(self.connection) + "\n").encode()
            self.wfile.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n"
                             b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
                             + body)

    class DnsTcp(socketserver.StreamRequestHandler):
        def handle(self):
            self.connection.settimeout(10)
            n = self.rfile.read(2)
            if len(n) != 2:
                return
            reply = dns_answer(self.rfile.read(struct.unpack("!H", n)[0]))
            if reply:
                self.wfile.write(struct.pack("!H", len(reply)) + reply)

    class DnsUdp(socketserver.BaseRequestHandler):
        def handle(self):
            data, sock = self.request
            reply = dns_answer(data)
            if reply:
                sock.sendto(reply, self.client_address)

    class Banner(socketserver.BaseRequestHandler):
        def handle(self):
            self.request.sendall(b"dot-853\n")

    servers = [TCP(("::", 80), Http), TCP(("::", 53), DnsTcp), UDP(("::", 53), DnsUdp),
               TCP(("::", 853), Banner)]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    print("ready", flush=True)
    signal.pause()
    while True:
        signal.pause()


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    _serve()
