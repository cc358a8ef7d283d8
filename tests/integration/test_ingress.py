"""Ingress: an HTTP request to --ingress-listen reaches the agent's contracted port through
--agent-ingress-socket. sam-box dials that socket, sends
`CONNECT 127.0.0.1:<serves.port>` and relays raw bytes once it gets a 200. A Python stand-in
plays nano-init's side of the socket here."""

import concurrent.futures
import hashlib
import http.server
import json
import os
import pathlib
import secrets
import socket
import socketserver
import subprocess
import threading

import pytest

from boxlib import Conn, bundle_yaml, netns_connect, netns_free_port, wait_for


class AgentHandler(http.server.BaseHTTPRequestHandler):
    """The agent inside the sandbox: answers with what it received."""
    protocol_version = "HTTP/1.1"

    def _handle(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        out = json.dumps({"agent": "code-reviewer", "method": self.command, "path": self.path,
                          "body_sha256": hashlib.sha256(body).hexdigest(),
                          "body_len": len(body)}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = _handle

    def log_message(self, *a):
        pass


def _pump(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class IngressStandIn:
    """nano-init's --ingress-socket side: accept, read the CONNECT head, answer 200, connect
    to 127.0.0.1:<port from the head>, relay."""

    def __init__(self, path, answer=b"HTTP/1.1 200 Connection Established\r\n\r\n"):
        self.path = str(path)
        self.heads = []
        outer = self

        class H(socketserver.BaseRequestHandler):
            def handle(self):
                conn = self.request
                buf = b""
                while b"\r\n\r\n" not in buf:
                    chunk = conn.recv(4096)
                    if not chunk:
                        return
                    buf += chunk
                head, rest = buf.split(b"\r\n\r\n", 1)
                outer.heads.append(head + b"\r\n\r\n")
                if not answer.startswith(b"HTTP/1.1 200"):
                    conn.sendall(answer)
                    return
                target = head.split(b"\r\n")[0].split(b" ")[1].decode()
                host, port = target.rsplit(":", 1)
                up = socket.create_connection((host, int(port)), timeout=5)
                up.settimeout(None)
                conn.sendall(answer)
                if rest:
                    up.sendall(rest)
                t = threading.Thread(target=_pump, args=(up, conn), daemon=True)
                t.start()
                _pump(conn, up)
                t.join(timeout=10)
                up.close()

        class S(socketserver.ThreadingUnixStreamServer):
            daemon_threads = True
            request_queue_size = 128  # like a Go listener; socketserver's default is 5

        self.server = S(self.path, H)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
        if os.path.exists(self.path):
            os.unlink(self.path)


@pytest.fixture
def agent_server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), AgentHandler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def serving_box(sam_box, topo, port, ingress_socket):
    listen_port = netns_free_port(topo.box)
    b = sam_box(bundle=bundle_yaml(allow=["api.example.com"], serves=("code-reviewer", port)),
                args=["--insecure-unverified-bundle", "--agent-ingress-socket", ingress_socket,
                      "--ingress-listen", f"127.0.0.1:{listen_port}"])
    b.ingress_port = listen_port
    # No probe connection here: the listener must be up once --socket accepts, and a probe
    # would make sam-box dial the agent socket, which the round-trip test counts.
    return b


def ingress_request(topo, b, raw):
    c = Conn(netns_connect(topo.box, ("127.0.0.1", b.ingress_port)))
    c.send(raw)
    return c


def test_ingress_round_trip(sam_box, topo, agent_server):
    port = agent_server.server_address[1]
    path = pathlib.Path(topo.tmp) / f"ingress-{secrets.token_hex(3)}.sock"
    stand_in = IngressStandIn(path)
    try:
        b = serving_box(sam_box, topo, port, str(path))
        host = f"127.0.0.1:{b.ingress_port}"
        n = len(stand_in.heads)
        assert n == 0, stand_in.heads
        c = ingress_request(topo, b, (f"GET /.well-known/agent.json HTTP/1.1\r\nHost: {host}\r\n"
                                      "Connection: close\r\n\r\n").encode())
        resp, body = c.read_http_response()
        c.close()
        assert resp.status == 200, resp
        rec = json.loads(body)
        assert rec["agent"] == "code-reviewer" and rec["path"] == "/.well-known/agent.json"
        want = f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
        assert len(stand_in.heads) == n + 1 and stand_in.heads[-1] == want, stand_in.heads

        # A POST with a body, byte-exact.
        payload = os.urandom(300_000)
        c = ingress_request(topo, b, (f"POST /tasks HTTP/1.1\r\nHost: {host}\r\n"
                                      f"Content-Length: {len(payload)}\r\nConnection: close"
                                      "\r\n\r\n").encode() + payload)
        resp, body = c.read_http_response()
        c.close()
        rec = json.loads(body)
        assert rec["method"] == "POST" and rec["body_len"] == len(payload)
        assert rec["body_sha256"] == hashlib.sha256(payload).hexdigest()
        assert len(stand_in.heads) == n + 2 and stand_in.heads[-1] == want, stand_in.heads
    finally:
        stand_in.stop()


def test_ingress_with_nothing_on_the_agent_socket_fails_fast(sam_box, topo):
    path = pathlib.Path(topo.tmp) / f"absent-{secrets.token_hex(3)}.sock"
    b = serving_box(sam_box, topo, 8080, str(path))
    c = ingress_request(topo, b, (f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{b.ingress_port}\r\n"
                                  "Connection: close\r\n\r\n").encode())
    try:
        resp = c.read_head()
        assert 500 <= resp.status < 600, resp
    except EOFError:
        pass  # a close without a response is also an answer, not a hang
    finally:
        c.close()
    assert b.alive


def test_no_ingress_listener_without_serves(sam_box, topo):
    port = netns_free_port(topo.box)
    b = sam_box(args=["--egress-allow", "api.example.com", "--ingress-listen",
                      f"127.0.0.1:{port}"], start=False)
    b.spawn()
    # Either it refuses the flag without serves, or it starts and does not listen there.
    wait_for(lambda: b.proc.poll() is not None or os.path.exists(b.socket_path), timeout=10,
             what="start or exit")
    if b.proc.poll() is None:
        wait_for(lambda: b.connect(timeout=1).close() or True, what="ready")
        with pytest.raises(OSError):
            netns_connect(topo.box, ("127.0.0.1", port), timeout=1)


def test_ingress_refused_inside_the_sandbox_is_not_a_200(sam_box, topo):
    path = pathlib.Path(topo.tmp) / f"refusing-{secrets.token_hex(3)}.sock"
    stand_in = IngressStandIn(path, answer=b"HTTP/1.1 502 Bad Gateway\r\n"
                                           b"Content-Length: 0\r\n\r\n")
    try:
        b = serving_box(sam_box, topo, 8080, str(path))
        c = ingress_request(topo, b, (f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{b.ingress_port}"
                                      "\r\nConnection: close\r\n\r\n").encode())
        try:
            resp = c.read_head()
            assert 500 <= resp.status < 600, resp
        except EOFError:
            pass
        finally:
            c.close()
        assert stand_in.heads, "sam-box never dialled the agent ingress socket"
    finally:
        stand_in.stop()


def test_concurrent_ingress_requests(sam_box, topo, agent_server):
    port = agent_server.server_address[1]
    path = pathlib.Path(topo.tmp) / f"ingress-{secrets.token_hex(3)}.sock"
    stand_in = IngressStandIn(path)
    try:
        b = serving_box(sam_box, topo, port, str(path))

        def one(i):
            c = ingress_request(topo, b, (f"GET /task/{i} HTTP/1.1\r\nHost: x\r\n"
                                          "Connection: close\r\n\r\n").encode())
            try:
                resp, body = c.read_http_response()
                return json.loads(body)["path"]
            finally:
                c.close()

        with concurrent.futures.ThreadPoolExecutor(max_workers=20) as pool:
            paths = list(pool.map(one, range(20)))
        assert paths == [f"/task/{i}" for i in range(20)]
    finally:
        stand_in.stop()


def test_ingress_beyond_its_cap_is_refused_at_once_and_the_agents_egress_goes_on(sam_box, topo):
    """Callers can hold at most 1,024 ingress connections (each holds two of the box's
    descriptors); the next gets 503 too-many-flows at once, and the agent's own tunnels are
    still served. Before the cap, 10,000 held connections took every descriptor the box had."""
    path = pathlib.Path(topo.tmp) / f"mute-{secrets.token_hex(3)}.sock"
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # connects queue, nothing answers
    mute.bind(str(path))
    mute.listen(4096)
    held = []
    try:
        b = serving_box(sam_box, topo, 8080, str(path))
        for _ in range(1024):
            held.append(netns_connect(topo.box, ("127.0.0.1", b.ingress_port)))
        # Each held connection waits (up to 10 s) for the agent's answer, holding its place.
        wait_for(lambda: _queued(mute) >= 1024,
                 timeout=20, what="1,024 ingress connections dialled into the sandbox")
        c = ingress_request(topo, b, (f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{b.ingress_port}\r\n"
                                      "Connection: close\r\n\r\n").encode())
        resp = c.read_head()
        c.close()
        assert resp.status == 503, resp
        assert resp.reason == "too-many-flows", resp.headers
        m = b.metrics()
        assert m.get("sam_box_limit_hits_total", limit="max-ingress-connections") == 1
        assert m.get("sam_box_ingress_requests_total", outcome="too-many-flows") == 1
        # The agent's own egress is untouched by what callers hold.
        a = b.connect()
        a.send(b"CONNECT api.example.com:80 HTTP/1.1\r\nHost: api.example.com:80\r\n\r\n")
        assert a.read_head().status == 200
        a.close()
    finally:
        for s in held:
            s.close()
        mute.close()


def _queued(listener):
    """Connections waiting in a listening Unix socket's backlog (ss's Recv-Q)."""
    out = subprocess.run(["ss", "-xlnH", "src", listener.getsockname()], capture_output=True,
                         text=True).stdout.split()
    return int(out[2]) if len(out) > 2 else 0
