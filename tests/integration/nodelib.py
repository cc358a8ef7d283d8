"""Helpers for the sam-node integration tests: the sam-node process, HTTP over its Unix socket,
and a scripted OpenAI-compatible model server on loopback.

    from nodelib import SamNode, ModelServer, unix_http

Fixtures (import them into a test module to use them): `model_server` (module scope) and
`sam_node` (a factory: sam_node(config_yaml, env={...}) starts a node, stopped after the test).

Nothing here sends traffic anywhere but loopback and Unix sockets.
"""

import http.client
import http.server
import json
import os
import pathlib
import signal
import socket
import socketserver
import subprocess
import tempfile
import threading

import pytest

from boxlib import wait_for

REPO = pathlib.Path(__file__).resolve().parents[2]
SAM_NODE = pathlib.Path(os.environ.get("SAM_NODE", REPO / "build/src/sam-node/sam-node"))
if not SAM_NODE.is_absolute():
    SAM_NODE = REPO / SAM_NODE


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


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
    """One request on a fresh connection; returns (status, headers dict lower-cased, bytes)."""
    c = UnixHTTPConnection(path, timeout)
    try:
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            headers = {"Content-Type": "application/json", **(headers or {})}
        c.request(method, target, body=body, headers=headers or {})
        r = c.getresponse()
        data = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data
    finally:
        c.close()


# ---------------------------------------------------------------------------------------
# The sam-node process


class SamNode:
    """One sam-node process on a socket in its own temporary directory.

    config: YAML text (written to a file). env: extra environment (e.g. the api_key's
    variable). metrics: give it --metrics-addr on a free loopback port (self.metrics_port).
    """

    def __init__(self, config, env=None, metrics=True, args=()):
        if not SAM_NODE.exists():
            raise AssertionError(f"sam-node binary not found at {SAM_NODE} (build it with "
                                 "`cmake --build build --target sam-node`, or set SAM_NODE)")
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="sam-node-"))
        self.socket_path = str(self.dir / "node.sock")
        self.config_path = self.dir / "node.yaml"
        self.config_path.write_text(config)
        self.metrics_port = free_port() if metrics else None
        self.args = ["run", "--socket-path", self.socket_path, "--config", str(self.config_path),
                     "--data-dir", str(self.dir)]
        if metrics:
            self.args += ["--metrics-addr", f"127.0.0.1:{self.metrics_port}"]
        self.args += [str(a) for a in args]
        self.env = {**os.environ, **(env or {})}
        self.proc = None
        self.lines = []
        self._lock = threading.Lock()
        self._reader = None

    def spawn(self):
        self.proc = subprocess.Popen([str(SAM_NODE)] + self.args, env=self.env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()
        return self

    def _read_stderr(self):
        for raw in self.proc.stderr:
            with self._lock:
                self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))

    def start(self, timeout=10.0):
        """Spawns and waits until the socket accepts connections."""
        self.spawn()

        def accepting():
            if self.proc.poll() is not None:
                self._reader.join(timeout=2)
                raise _Exited(f"sam-node exited with {self.proc.returncode}:\n"
                              f"{self.stderr_text()}")
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
        except _Exited as e:
            raise AssertionError(str(e)) from None
        return self

    def wait_exit(self, timeout=10.0):
        rc = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=2)
        return rc

    def stop(self, timeout=10.0):
        """SIGTERM; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait_exit(timeout)

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)

    def stderr_text(self):
        with self._lock:
            return "\n".join(self.lines)

    def logs(self):
        out = []
        with self._lock:
            lines = list(self.lines)
        for line in lines:
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                out.append(obj)
        return out

    def request(self, method, target, agent=None, headers=None, body=None, timeout=10.0):
        """A request straight to the node's socket, with X-Sam-Agent set as sam-box would."""
        headers = dict(headers or {})
        if agent is not None:
            headers["X-Sam-Agent"] = agent
        return unix_http(self.socket_path, method, target, headers, body, timeout)

    def metrics_text(self):
        c = http.client.HTTPConnection("127.0.0.1", self.metrics_port, timeout=5)
        try:
            c.request("GET", "/metrics")
            r = c.getresponse()
            assert r.status == 200, r.status
            return r.read().decode()
        finally:
            c.close()

    def metric(self, series):
        """The value of one series, e.g. 'sam_node_refusals_total{reason="not-granted"}';
        0 when absent."""
        for line in self.metrics_text().splitlines():
            if line.startswith(series + " "):
                return float(line.split()[-1])
        return 0


class _Exited(Exception):
    pass


@pytest.fixture
def sam_node():
    """A factory: sam_node(config, env=..., start=True) -> SamNode, stopped after the test."""
    nodes = []

    def make(config, env=None, start=True, **kw):
        n = SamNode(config, env=env, **kw)
        nodes.append(n)
        return n.start() if start else n

    yield make
    for n in nodes:
        n.kill()


# ---------------------------------------------------------------------------------------
# A scripted OpenAI-compatible model server


class _ThreadingServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class ModelServer:
    """OpenAI's shapes on 127.0.0.1 under any path prefix ending in /v1: GET .../models,
    POST .../chat/completions (JSON, or SSE chunks with "stream": true).

    records: every request (method, path, headers as a list of pairs, parsed JSON body).
    hold_stream: when set, a streamed answer sends its first chunk and then waits for
    `release` before the rest, so a test can see the first chunk arrive while the upstream is
    still answering; `streams_finished` counts streams that sent their last byte.
    """

    def __init__(self):
        self.records = []
        self.release = threading.Event()
        self.hold_stream = False
        self.streams_finished = 0
        model = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _record(self, body):
                try:
                    parsed = json.loads(body) if body else None
                except ValueError:
                    parsed = None
                model.records.append({"method": self.command, "path": self.path,
                                      "headers": list(self.headers.items()), "json": parsed})
                return parsed

            def _json(self, status, obj):
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._record(b"")
                if self.path.endswith("/v1/models"):
                    self._json(200, {"object": "list", "data": [{"id": "upstream-model",
                                                                 "object": "model"}]})
                else:
                    self._json(404, {"error": {"message": "no such path"}})

            def do_POST(self):
                n = int(self.headers.get("Content-Length", "0"))
                req = self._record(self.rfile.read(n)) or {}
                if not self.path.endswith("/v1/chat/completions"):
                    self._json(404, {"error": {"message": "no such path"}})
                    return
                text = "hello from " + self.path
                if not req.get("stream"):
                    self._json(200, {"id": "cmpl-1", "object": "chat.completion",
                                     "model": req.get("model"),
                                     "choices": [{"index": 0, "finish_reason": "stop",
                                                  "message": {"role": "assistant",
                                                              "content": text}}]})
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()

                def chunk(payload):
                    data = f"data: {payload}\n\n".encode()
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()

                def delta(content):
                    return json.dumps({"id": "cmpl-1", "object": "chat.completion.chunk",
                                       "choices": [{"index": 0, "delta": {"content": content}}]})

                chunk(delta("first"))
                if model.hold_stream:
                    model.release.wait(timeout=30)
                chunk(delta("second"))
                chunk("[DONE]")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
                model.streams_finished += 1

        self.server = _ThreadingServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def base(self, prefix=""):
        """The target_url of a service on this server: http://127.0.0.1:PORT<prefix>/v1."""
        return f"http://127.0.0.1:{self.port}{prefix}/v1"

    def stop(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def model_server():
    m = ModelServer()
    yield m
    m.stop()


def header_values(record, name):
    """Every value of header `name` (case-insensitive) in a ModelServer record."""
    return [v for k, v in record["headers"] if k.lower() == name.lower()]

