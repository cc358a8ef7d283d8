"""Helpers for the sam-box integration tests: network namespaces from Python threads, the
SamBox process wrapper, tunnel clients (CONNECT and connect-udp), capsules, metrics.

Nothing here sends traffic anywhere but loopback, Unix sockets, or the namespaces that
conftest.py creates.
"""

import contextlib
import ctypes
import ctypes.util
import datetime
import hashlib
import http.server
import ipaddress
import json
import os
import pathlib
import re
import select
import signal
import socket
import socketserver
import subprocess
import threading
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
SAM_BOX = pathlib.Path(os.environ.get("SAM_BOX", REPO / "build/src/sam-box/sam-box"))
if not SAM_BOX.is_absolute():
    SAM_BOX = REPO / SAM_BOX
SAM_BOX_RUN = None  # the session's snapshot of SAM_BOX (conftest.py sets it)

AGENT_ID = "researcher-1.prod.acme.example"
EXTERNAL_ID = "system:serviceaccount:agents:researcher"

# The allowlist of the standard box (the brief's rules plus names for the other tests).
STD_ALLOW = [
    "api.example.com", "*.pypi.org", "dual.example.com:80", "v6only.example.com",
    "loopback.example.com", "loopback6.example.com", "metadata.example.com",
    "mapped.example.com", "linklocal6.example.com", "multicast.example.com",
    "unspecified.example.com", "nowhere.example.com", "blackhole.example.com",
    "self.example.com", "self6.example.com", "nat64.example.com",
]

# Every host name the tests use; none of them may ever appear in the metrics text.
TEST_HOST_NAMES = [
    "api.example.com", "files.pypi.org", "a.b.pypi.org", "pypi.org", "evilpypi.org",
    "dual.example.com", "v6only.example.com", "loopback.example.com", "loopback6.example.com",
    "metadata.example.com", "mapped.example.com", "linklocal6.example.com",
    "multicast.example.com", "unspecified.example.com", "nowhere.example.com",
    "self.example.com", "self6.example.com", "nat64.example.com",
    "blackhole.example.com", "example.com", "198.18.", "2001:db8",
]

# ---------------------------------------------------------------------------------------
# Polling (never sleep as an assertion)


def wait_for(predicate, timeout=10.0, interval=0.02, what="condition"):
    """Polls predicate() until it returns a truthy value; returns that value or raises."""
    deadline = time.monotonic() + timeout
    last_exc = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 (polled predicates may fail transiently)
            last_exc = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}"
                                 + (f" (last error: {last_exc!r})" if last_exc else ""))
        time.sleep(interval)


# ---------------------------------------------------------------------------------------
# Network namespaces from a Python thread. setns(CLONE_NEWNET) changes only the calling
# thread's namespace, and a socket keeps the namespace it was created in, so a socket made
# in a short-lived thread can be used from any thread afterwards.

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
CLONE_NEWNET = 0x40000000


def run_in_netns(ns, fn, *args, **kwargs):
    out = {}

    def target():
        try:
            fd = os.open(f"/var/run/netns/{ns}", os.O_RDONLY)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns({ns}): {os.strerror(err)}")
            finally:
                os.close(fd)
            out["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 (re-raised in the caller)
            out["error"] = exc

    t = threading.Thread(target=target, name=f"netns-{ns}")
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def netns_socket(ns, family=socket.AF_INET, type_=socket.SOCK_STREAM):
    return run_in_netns(ns, socket.socket, family, type_)


def netns_connect(ns, addr, family=socket.AF_INET, timeout=5.0):
    s = netns_socket(ns, family)
    s.settimeout(timeout)
    s.connect(addr)
    return s


def netns_free_port(ns, host="127.0.0.1"):
    s = netns_socket(ns)
    s.bind((host, 0))
    port = s.getsockname()[1]
    s.close()
    return port


# ---------------------------------------------------------------------------------------
# Byte-stream helpers


class Conn:
    """A stream socket with a read buffer: read an HTTP head, then exact byte counts."""

    def __init__(self, sock, timeout=10.0):
        self.sock = sock
        self.sock.settimeout(timeout)
        self.buf = b""

    def send(self, data):
        self.sock.sendall(data)

    def _fill(self):
        chunk = self.sock.recv(65536)
        if not chunk:
            return False
        self.buf += chunk
        return True

    def read_head(self, limit=65536):
        """Reads up to and including CRLFCRLF; returns a Response. Raises EOFError on a close
        before a complete head."""
        while b"\r\n\r\n" not in self.buf:
            if len(self.buf) > limit:
                raise AssertionError(f"no end of head in {limit} bytes: {self.buf[:200]!r}")
            if not self._fill():
                raise EOFError(f"closed before a complete head; got {self.buf!r}")
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        return Response.parse(head)

    def read_exact(self, n):
        while len(self.buf) < n:
            if not self._fill():
                raise EOFError(f"closed after {len(self.buf)} of {n} bytes")
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def read_until_eof(self, limit=64 << 20):
        while len(self.buf) < limit and self._fill():
            pass
        data, self.buf = self.buf, b""
        return data

    def read_http_response(self):
        """Reads one HTTP/1.x response with a Content-Length body; returns (Response, body)."""
        resp = self.read_head()
        n = resp.header("content-length")
        if n is None:
            body = self.read_until_eof()
        else:
            body = self.read_exact(int(n))
        return resp, body

    def is_closed(self, timeout=5.0):
        """True if the peer closes (EOF or reset) within timeout with no further data."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r, _, _ = select.select([self.sock], [], [], max(0.0, deadline - time.monotonic()))
            if not r:
                return False
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                return True
            if not chunk:
                return True
            self.buf += chunk
        return False

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


class Response:
    def __init__(self, version, status, phrase, headers, raw):
        self.version, self.status, self.phrase = version, status, phrase
        self.headers = headers  # list of (name, value) in order
        self.raw = raw

    @classmethod
    def parse(cls, head):
        lines = head.decode("latin-1").split("\r\n")
        m = re.match(r"^(HTTP/\d\.\d) (\d{3})(?: (.*))?$", lines[0])
        if not m:
            raise AssertionError(f"bad status line {lines[0]!r} in {head!r}")
        headers = []
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise AssertionError(f"bad header line {line!r} in {head!r}")
            headers.append((name.strip(), value.strip()))
        return cls(m.group(1), int(m.group(2)), m.group(3) or "", headers, head)

    def header(self, name):
        for k, v in self.headers:
            if k.lower() == name.lower():
                return v
        return None

    @property
    def reason(self):
        return self.header("Boundary-Reason")

    def __repr__(self):
        return f"Response({self.raw.decode('latin-1')!r})"


def http_get(conn, path, host, extra=b""):
    """Sends one GET over an open tunnel and returns (Response, body)."""
    conn.send(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n".encode()
              + extra + b"\r\n")
    return conn.read_http_response()


# ---------------------------------------------------------------------------------------
# QUIC variable-length integers and HTTP Datagram capsules (RFC 9000 §16, RFC 9297 §3)


def varint(n):
    if n < 1 << 6:
        return bytes([n])
    if n < 1 << 14:
        return (n | 0x4000).to_bytes(2, "big")
    if n < 1 << 30:
        return (n | 0x80000000).to_bytes(4, "big")
    return (n | 0xC000000000000000).to_bytes(8, "big")


def datagram_capsule(payload, context_id=0):
    value = varint(context_id) + payload
    return varint(0x00) + varint(len(value)) + value


def read_varint(conn):
    first = conn.read_exact(1)[0]
    length = 1 << (first >> 6)
    rest = conn.read_exact(length - 1)
    n = first & 0x3F
    for b in rest:
        n = (n << 8) | b
    return n


def read_capsule(conn):
    """Returns (type, value bytes)."""
    ctype = read_varint(conn)
    n = read_varint(conn)
    return ctype, conn.read_exact(n)


def read_datagram(conn):
    """Reads capsules until a DATAGRAM one; returns (context id, payload)."""
    while True:
        ctype, value = read_capsule(conn)
        if ctype != 0x00:
            continue  # unknown capsule types are skipped (RFC 9297 §3.2)
        c = Conn.__new__(Conn)
        c.sock, c.buf = None, value
        ctx = read_varint(c)
        return ctx, c.buf


# ---------------------------------------------------------------------------------------
# Metrics (Prometheus text exposition)

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


class Metrics:
    def __init__(self, text):
        self.text = text
        self.samples = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            m = _SAMPLE.match(line)
            if not m:
                raise AssertionError(f"unparseable metrics line {line!r}")
            labels = tuple(sorted(_LABEL.findall(m.group(2) or "")))
            self.samples[(m.group(1), labels)] = float(m.group(3))

    def get(self, name, **labels):
        """The sample with exactly these labels, or 0 if absent."""
        return self.samples.get((name, tuple(sorted(labels.items()))), 0.0)

    def sum(self, name, **labels):
        """Sum over all samples of `name` whose labels include `labels`."""
        total = 0.0
        for (n, ls), v in self.samples.items():
            d = dict(ls)
            if n == name and all(d.get(k) == val for k, val in labels.items()):
                total += v
        return total

    def names(self):
        return {n for n, _ in self.samples}


def delta(before, after, name, **labels):
    return after.get(name, **labels) - before.get(name, **labels)


# ---------------------------------------------------------------------------------------
# Bundles


def bundle_yaml(agent_id=AGENT_ID, external_id=EXTERNAL_ID, allow=(), serves=None,
                version="v1", extra=""):
    lines = [f"version: {version}", "agent:", f"  id: {agent_id}"]
    if external_id is not None:
        lines.append(f"  external_id: {external_id}")
    if allow:
        lines += ["egress:", "  allow:"]
        for entry in allow:
            lines.append(f'    - "{entry}"' if entry.startswith("*") else f"    - {entry}")
    if serves:
        lines += ["serves:", f"  name: {serves[0]}", f"  port: {serves[1]}"]
    return "\n".join(lines) + "\n" + extra


# ---------------------------------------------------------------------------------------
# The sam-box process

_live = []  # every SamBox started, so the session finalizer can kill leftovers
_counter = [0]


def require_binary():
    if SAM_BOX_RUN is None and not SAM_BOX.exists():
        raise AssertionError(
            f"sam-box binary not found at {SAM_BOX} (build it with "
            "`cmake --build build --target sam-box`, or set SAM_BOX)")


class SamBox:
    """One sam-box process, run inside the BOX namespace with `ip netns exec`.

    args: extra command-line arguments after `run --socket PATH`.
    bundle: YAML text written to a file and passed as --bundle, or None.
    metrics: give it a --metrics-addr inside BOX (self.metrics_port).
    """

    def __init__(self, topo, args=(), bundle=None, metrics=True, socket_path=None,
                 netns=True):
        require_binary()
        _counter[0] += 1
        self.topo = topo
        self.n = _counter[0]
        self.dir = pathlib.Path(topo.tmp) / f"box{self.n}"
        self.dir.mkdir()
        self.socket_path = socket_path or str(self.dir / "agent.sock")
        self.args = ["run", "--socket", self.socket_path]
        if bundle is not None:
            self.bundle_path = self.dir / "bundle.yaml"
            self.bundle_path.write_text(bundle)
            self.args += ["--bundle", str(self.bundle_path)]
        self.metrics_port = None
        if metrics:
            self.metrics_port = netns_free_port(topo.box) if netns else None
            self.args += ["--metrics-addr", f"127.0.0.1:{self.metrics_port}"]
        self.args += [str(a) for a in args]
        self.netns = netns
        self.proc = None
        self.lines = []
        self._reader = None
        self._lock = threading.Lock()

    # --- process ---

    def command(self):
        cmd = [str(SAM_BOX_RUN or SAM_BOX)] + self.args
        if self.netns:
            cmd = ["ip", "netns", "exec", self.topo.box] + cmd
        return cmd

    def spawn(self):
        self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _live.append(self)
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()
        return self

    def _read_stderr(self):
        for raw in self.proc.stderr:
            with self._lock:
                self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))

    def start(self, timeout=10.0):
        """Spawns and waits until --socket accepts connections."""
        self.spawn()
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                self._reader.join(timeout=2)
                raise AssertionError(
                    f"sam-box exited with {self.proc.returncode} before it was ready:\n"
                    f"cmd: {' '.join(self.command())}\n{self.stderr_text()}")
            if os.path.exists(self.socket_path):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    s.connect(self.socket_path)
                    s.close()
                    return self
                except OSError:
                    s.close()
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"sam-box not ready after {timeout}s:\n"
                                     f"{self.stderr_text()}")
            time.sleep(0.01)

    def wait_exit(self, timeout=10.0):
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"sam-box still running after {timeout}s:\n"
                                 f"{self.stderr_text()}")
        self._reader.join(timeout=2)
        return rc

    def stop(self, timeout=10.0):
        """SIGTERM; returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait_exit(timeout)

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    @property
    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    # --- stderr ---

    def stderr_text(self):
        with self._lock:
            return "\n".join(self.lines)

    def logs(self):
        """stderr lines parsed as JSON (lines that are not JSON are skipped)."""
        return self.logs_since(0)

    def mark(self):
        """A position in stderr; flow_logs(since=mark) sees only later lines."""
        with self._lock:
            return len(self.lines)

    def logs_since(self, since=0):
        with self._lock:
            lines = self.lines[since:]
        out = []
        for line in lines:
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                out.append(obj)
        return out

    def flow_logs(self, since=0, **match):
        return [e for e in self.logs_since(since) if e.get("msg") == "flow"
                and all(e.get(k) == v for k, v in match.items())]

    def wait_flow_log(self, since=0, timeout=5.0, **match):
        """Waits for a flow log line matching `match` after `since`; returns the first."""
        return wait_for(lambda: self.flow_logs(since, **match), timeout=timeout,
                        what=f"flow log {match}; stderr:\n{self.stderr_text()[-3000:]}")[0]

    # --- clients ---

    def connect(self, timeout=10.0):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        s.connect(self.socket_path)
        return Conn(s, timeout)

    def raw(self, data, timeout=10.0):
        """Sends bytes on a fresh connection; returns the Conn (nothing read yet)."""
        c = self.connect(timeout)
        c.send(data)
        return c

    def tunnel(self, authority, host=None, extra=b"", timeout=10.0):
        """CONNECT authority; returns (Response, Conn)."""
        host = authority if host is None else host
        c = self.connect(timeout)
        c.send(f"CONNECT {authority} HTTP/1.1\r\nHost: {host}\r\n".encode() + extra + b"\r\n")
        return c.read_head(), c

    def refused(self, authority, **kw):
        """CONNECT that must be refused: returns the Response after checking the close."""
        resp, c = self.tunnel(authority, **kw)
        closed = c.is_closed(timeout=5)
        c.close()
        assert closed, f"CONNECT {authority}: {resp.status} but the connection stayed open"
        return resp

    def udp_tunnel(self, host, port, timeout=10.0, extra=b""):
        """connect-udp (RFC 9298) over HTTP/1.1; returns (Response, Conn)."""
        c = self.connect(timeout)
        hp = f"[{host}]" if ":" in host else host
        c.send((f"GET /.well-known/masque/udp/{host}/{port}/ HTTP/1.1\r\n"
                f"Host: {hp}:{port}\r\nConnection: Upgrade\r\nUpgrade: connect-udp\r\n"
                f"Capsule-Protocol: ?1\r\n").encode() + extra + b"\r\n")
        return c.read_head(), c

    # --- metrics ---

    def metrics_text(self, timeout=5.0):
        assert self.metrics_port, "this box has no --metrics-addr"
        s = netns_connect(self.topo.box, ("127.0.0.1", self.metrics_port), timeout=timeout)
        c = Conn(s, timeout)
        c.send(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        resp, body = c.read_http_response()
        c.close()
        assert resp.status == 200, f"/metrics answered {resp}"
        return body.decode()

    def metrics(self):
        return Metrics(self.metrics_text())


def expect_refusal_to_start(topo, args=(), bundle=None, timeout=15.0, metrics=False):
    """Runs sam-box with a configuration it must refuse. Returns (returncode, stderr text).
    Fails if it becomes ready instead, or dies from a signal."""
    box = SamBox(topo, args=args, bundle=bundle, metrics=metrics).spawn()
    deadline = time.monotonic() + timeout
    while box.proc.poll() is None:
        if time.monotonic() > deadline:
            box.kill()
            raise AssertionError(f"sam-box did not exit within {timeout}s:\n{box.stderr_text()}")
        if os.path.exists(box.socket_path):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(box.socket_path)
                s.close()
                box.kill()
                raise AssertionError("sam-box started (socket accepts) but should have refused"
                                     f":\nargs: {box.args}\n{box.stderr_text()}")
            except OSError:
                s.close()
        time.sleep(0.01)
    rc = box.wait_exit()
    text = box.stderr_text()
    assert rc > 0, f"sam-box exit code {rc} (want a non-zero exit, not a signal):\n{text}"
    return rc, text


# ---------------------------------------------------------------------------------------
# Test PKI for the upstream TLS server


def make_tls_material(directory, names):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory = pathlib.Path(directory)
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sam-box test upstream CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                       False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                         critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    sans = [x509.DNSName(n) for n in names]
    sans += [x509.IPAddress(ipaddress.ip_address("198.18.0.2")),
             x509.IPAddress(ipaddress.ip_address("2001:db8::2"))]
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    (directory / "ca.pem").write_bytes(ca.public_bytes(pem))
    (directory / "server.pem").write_bytes(cert.public_bytes(pem))
    (directory / "server-key.pem").write_bytes(key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return (str(directory / "ca.pem"), str(directory / "server.pem"),
            str(directory / "server-key.pem"))


# ---------------------------------------------------------------------------------------
# A stand-in for the node API socket: an HTTP/1.1 server on a Unix socket that answers every
# request with a JSON echo of what it received (method, path, headers in order, body hash).


class _EchoHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _read_body(self):
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return body
                body += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _stream(self):
        # A streamed (SSE-like) answer: the first event, then the rest only once the test
        # sets stream_gate, so a boundary that buffers whole responses is caught.
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for event, wait in ((b"data: first\n\n", True), (b"data: second\n\n", False)):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            self.wfile.flush()
            if wait:
                self.server.stream_gate.wait(10)
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _handle(self):
        body = self._read_body()
        if self.path == "/stream":
            self._stream()
            return
        rec = {"method": self.command, "path": self.path,
               "headers": [[k, v] for k, v in self.headers.items()],
               "body_len": len(body), "body_sha256": hashlib.sha256(body).hexdigest()}
        self.server.records.append(rec)
        out = json.dumps(rec).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = do_PUT = do_DELETE = _handle

    def setup(self):
        super().setup()
        self.server.connections += 1

    def address_string(self):
        return "unix"

    def log_message(self, fmt, *args):
        pass


class _UnixHTTPServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    request_queue_size = 256

    def handle_error(self, request, client_address):
        pass


class SidecarEcho:
    """Serves the echo handler on a Unix socket path until stop()."""

    def __init__(self, path):
        self.path = str(path)
        self.server = _UnixHTTPServer(self.path, _EchoHandler)
        self.server.records = []
        self.server.connections = 0
        self.server.stream_gate = threading.Event()
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def records(self):
        return self.server.records

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


@contextlib.contextmanager
def credentialed_runner_flags(tmp_path, issuer, sub, issuer_url=None):
    """For compass-runner tests of seed 003 "Identity": a bundle (agent.id
    verified.test.example, external_id sa:agents:verified), a token for `sub` minted by
    `issuer` (oidc_issuer.TestIssuer, started) with audience "sam", and an echo server in
    sam-node's place. Yields (the runner's flags, the echo server); the server stops on exit.
    `issuer_url` replaces the issuer's own URL in --credential-issuer."""
    bundle = pathlib.Path(tmp_path) / "bundle.yaml"
    bundle.write_text("version: v1\nagent:\n  id: verified.test.example\n"
                      "  external_id: sa:agents:verified\n")
    token = pathlib.Path(tmp_path) / "token"
    token.write_text(issuer.mint(sub=sub, aud="sam"))
    node = SidecarEcho(pathlib.Path(tmp_path) / "node.sock")
    try:
        yield ["--bundle", str(bundle), "--sidecar-socket", node.path,
               "--credential-issuer", issuer_url or issuer.issuer_url,
               "--credential-audience", "sam", "--credential-path", str(token),
               "--credential-ca", issuer.ca_path], node
    finally:
        node.stop()


def error_text(stderr):
    """The lines of a refusal that carry the reason: JSON lines at level warn or above, and
    any line that is not JSON. Lower-cased, joined. Falls back to all of stderr."""
    picked = []
    for line in stderr.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            picked.append(line)
            continue
        if not isinstance(obj, dict) or str(obj.get("level", "")).lower() in (
                "warn", "warning", "error", "fatal", "critical"):
            picked.append(line)
    return ("\n".join(picked) if picked else stderr).lower()
