"""Helpers for the sam-node integration tests: the sam-node process, its config, HTTP over its
Unix socket, and the scripted OpenAI-compatible model server (model_server.py) as a process.

    from nodelib import SamNode, ModelServer, ReadyProc, unix_http, node_yaml

Each process may run in a network namespace (`netns=`, e.g. conftest.py's BOX), where it
reaches that namespace's loopback; the helpers talk to it there.

Fixtures (import them into a test module to use them): `model_server` (module scope, on the
host's loopback) and `sam_node` (a factory: sam_node(config, env={...}, netns=...) starts a
node, killed and its directory removed after the test).

Nothing here sends traffic anywhere but loopback and Unix sockets.
"""

import http.client
import json
import os
import pathlib
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading

import pytest

from boxlib import netns_connect, netns_free_port, wait_for

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
SAM_NODE = pathlib.Path(os.environ.get("SAM_NODE", REPO / "build/src/sam-node/sam-node"))
if not SAM_NODE.is_absolute():
    SAM_NODE = REPO / SAM_NODE
MODEL_SERVER = HERE / "model_server.py"


def free_port(netns=None):
    """A TCP port on 127.0.0.1 that nothing listens on now (in `netns` when given)."""
    if netns is not None:
        return netns_free_port(netns)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def tcp_request(netns, port, method, target, timeout=10.0):
    """One request without a body to http://127.0.0.1:port<target>, from `netns` when given;
    returns (status, bytes)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        if netns is not None:
            c.sock = netns_connect(netns, ("127.0.0.1", port), timeout=timeout)
        c.request(method, target)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def node_yaml(config):
    """sam-node's config file text for `config` (a dict shaped as docs/sam-node.md says).

    JSON is YAML (1.2 flow style), so the dict is written as indented JSON: no quoting rules
    to get wrong in the tests."""
    return json.dumps(config, indent=2) + "\n"


# ---------------------------------------------------------------------------------------
# HTTP over a Unix socket


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client on a Unix stream socket; Host is mesh.sam.alt, as sam-box forwards it."""

    def __init__(self, path, timeout=10.0):
        super().__init__("mesh.sam.alt", timeout=timeout)
        self.unix_path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self.unix_path)
        self.sock = s


def unix_http(path, method, target, headers=None, body=None, timeout=10.0):
    """One request on a fresh connection to the Unix socket `path`.

    body: bytes or str as is, dict or list as JSON; any body is sent as application/json
    unless headers say otherwise. Returns (status, headers, bytes); headers is the
    response's http.client.HTTPMessage (names case-insensitive, get_all() for repeats)."""
    c = UnixHTTPConnection(path, timeout)
    try:
        headers = dict(headers or {})
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        if body is not None and not any(k.lower() == "content-type" for k in headers):
            headers["Content-Type"] = "application/json"
        c.request(method, target, body=body, headers=headers)
        r = c.getresponse()
        data = r.read()
        return r.status, r.msg, data
    finally:
        c.close()


# ---------------------------------------------------------------------------------------
# The sam-node process


class SamNode:
    """One sam-node process on a socket in its own temporary directory (its --data-dir too).

    config: a dict, written with node_yaml(). env: extra environment (e.g. an api_key's
    variable). netns: run it in that namespace (`ip netns exec`). metrics: give it
    --metrics-addr on a free loopback port (self.metrics_port). args: more flags.
    Its stderr goes to node.log in its directory: stderr_text() and logs() read it whole.
    close() kills it and removes the directory.
    """

    def __init__(self, config, env=None, netns=None, metrics=True, args=()):
        if not SAM_NODE.exists():
            raise AssertionError(f"sam-node binary not found at {SAM_NODE} (build it with "
                                 "`cmake --build build --target sam-node`, or set SAM_NODE)")
        self.netns = netns
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="sam-node-"))
        self.socket_path = str(self.dir / "node.sock")
        self.config_path = self.dir / "node.yaml"
        self.config_path.write_text(node_yaml(config))
        self.log_path = self.dir / "node.log"
        self.metrics_port = free_port(netns) if metrics else None
        self.args = ["run", "--socket-path", self.socket_path, "--config", str(self.config_path),
                     "--data-dir", str(self.dir)]
        if metrics:
            self.args += ["--metrics-addr", f"127.0.0.1:{self.metrics_port}"]
        self.args += [str(a) for a in args]
        self.env = {**os.environ, **(env or {})}
        self.proc = None

    def spawn(self):
        prefix = ["ip", "netns", "exec", self.netns] if self.netns else []
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(prefix + [str(SAM_NODE)] + self.args, env=self.env,
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=log)
        return self

    def start(self, timeout=20.0):
        """Spawns and waits until the socket accepts connections. On failure the process and
        its directory are gone (close()) and the AssertionError carries its stderr."""
        self.spawn()

        def accepting():
            if self.proc.poll() is not None:
                raise _Exited(f"sam-node exited with {self.proc.returncode}")
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(self.socket_path)
                return True
            except OSError:
                return False
            finally:
                s.close()

        try:
            wait_for(accepting, timeout=timeout, what="sam-node's socket")
        except (_Exited, AssertionError) as e:
            text = self.stderr_text()
            self.close()
            raise AssertionError(f"{e}:\n{text}") from None
        return self

    def wait_exit(self, timeout=10.0):
        return self.proc.wait(timeout=timeout)

    def stop(self, timeout=10.0, sig=signal.SIGTERM):
        """`sig` (SIGTERM); returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.wait_exit(timeout)

    def close(self, grace=0.0):
        """Ends the process if it still runs (SIGTERM and `grace` seconds to exit first, when
        given; then SIGKILL), and removes its directory."""
        if self.proc is not None and self.proc.poll() is None and grace > 0:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)
        shutil.rmtree(self.dir, ignore_errors=True)

    def stderr_text(self):
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def logs(self):
        """The JSON log lines as dicts (other lines skipped)."""
        out = []
        for line in self.stderr_text().splitlines():
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                out.append(obj)
        return out

    def request(self, method, target, agent=None, headers=None, body=None, timeout=10.0):
        """A request straight to the node's socket, with X-Sam-Agent set as sam-box would;
        see unix_http()."""
        headers = dict(headers or {})
        if agent is not None:
            headers["X-Sam-Agent"] = agent
        return unix_http(self.socket_path, method, target, headers, body, timeout)

    def metrics_text(self):
        status, body = tcp_request(self.netns, self.metrics_port, "GET", "/metrics", timeout=5)
        assert status == 200, status
        return body.decode()

    def metric(self, series, absent=0):
        """The value of one series, e.g. 'sam_node_refusals_total{reason="not-granted"}';
        `absent` when there is no such line."""
        for line in self.metrics_text().splitlines():
            if line.startswith(series + " "):
                return float(line.split()[-1])
        return absent


class _Exited(BaseException):
    """Not an Exception: boxlib.wait_for retries on those, and an exited node will not come
    up, so this ends the wait at once."""


@pytest.fixture
def sam_node():
    """A factory: sam_node(config, env=..., netns=..., start=True) -> SamNode, closed after
    the test."""
    nodes = []

    def make(config, start=True, **kw):
        n = SamNode(config, **kw)
        nodes.append(n)
        return n.start() if start else n

    yield make
    # SIGTERM first: a node that stops cleanly also stops the runners it spawned (their own
    # sessions would outlive a SIGKILLed node).
    for n in nodes:
        n.close(grace=5)


# ---------------------------------------------------------------------------------------
# Servers that print `ready <port>`


class ReadyProc:
    """A server process that prints `ready <port>` on stdout once it listens on 127.0.0.1
    (model_server.py, tests/js/mcp_server.mjs), in `netns` when given. Later stdout lines are
    kept (lines()), stderr too (stderr_text(), for failure messages)."""

    def __init__(self, argv, netns=None, env=None):
        self.argv, self.netns = [str(a) for a in argv], netns
        self.env = {**os.environ, **(env or {})}
        self.proc, self.port = None, None
        self._out, self._err = [], []

    def start(self, timeout=20.0):
        prefix = ["ip", "netns", "exec", self.netns] if self.netns else []
        self.proc = subprocess.Popen(prefix + self.argv, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=self.env)
        r, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline().decode() if r else ""
        if not line.startswith("ready "):
            self.stop()
            raise AssertionError(f"{self.argv[:2]} did not start: {line!r} "
                                 f"{self.proc.stderr.read().decode(errors='replace')}")
        self.port = int(line.split()[1])
        for stream, sink in ((self.proc.stdout, self._out), (self.proc.stderr, self._err)):
            threading.Thread(target=_drain, args=(stream, sink), daemon=True).start()
        return self

    def lines(self):
        return list(self._out)

    def stderr_text(self):
        return "\n".join(self._err)

    def call(self, method, target):
        """One request without a body; returns the JSON answer, asserting a 200."""
        status, body = tcp_request(self.netns, self.port, method, target)
        assert status == 200, (method, target, status, body)
        return json.loads(body)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


def _drain(stream, sink):
    for raw in stream:
        sink.append(raw.decode("utf-8", "replace").rstrip("\n"))


class ModelServer(ReadyProc):
    """model_server.py (see its docstring) as a process: the one OpenAI stand-in of the tests
    and the bench. script: its --script (a dict); api_key: the key it requires, if any."""

    def __init__(self, script=None, api_key=None, netns=None):
        argv = [sys.executable, MODEL_SERVER, "--script", json.dumps(script or {})]
        if api_key is not None:
            argv += ["--api-key", api_key]
        super().__init__(argv, netns=netns)

    def base(self, prefix=""):
        """The target_url of a service on this server: http://127.0.0.1:PORT<prefix>/v1."""
        return f"http://127.0.0.1:{self.port}{prefix}/v1"

    def records(self):
        """Every chat request so far: path, headers ([name, value] pairs), body, done."""
        return self.call("GET", "/_records")

    def hold(self):
        """Streamed answers send their first event, then wait for release()."""
        self.call("POST", "/_hold")

    def release(self):
        self.call("POST", "/_release")


@pytest.fixture(scope="module")
def model_server():
    m = ModelServer().start()
    yield m
    m.stop()


def header_values(record, name):
    """Every value of header `name` (case-insensitive) in a ModelServer record."""
    return [v for k, v in record["headers"] if k.lower() == name.lower()]
