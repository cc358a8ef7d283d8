"""The world around a sam-node under attack (test_node_hostile.py): loopback stand-ins for the
model, MCP, a2a and secret-use servers that record every request reaching them and can be
turned hostile; the node configuration that points at them; and a raw client for the node's
Unix socket that sends what nodelib.unix_http will not (repeated fields, odd spellings, raw
bytes).

    world = World()                      # the upstreams
    node = world.make_node()             # a nodelib.SamNode configured against them
    r = call(node.socket_path, "GET", "/v1/models", READER)
    world.close()                        # every node, upstream and temporary directory

Everything listens on 127.0.0.1 or a Unix socket, or inside a test network namespace.
"""

import http.client
import http.server
import json
import pathlib
import secrets
import shutil
import socket
import socketserver
import tempfile
import threading

from boxlib import netns_socket, wait_for
from nodelib import SamNode, UnixHTTPConnection

READER = "reader.test.example"    # role readers: chat, tools/read, bar, secret tok, spawn ok
WRITER = "w1.writers.example"     # role writers (*.writers.example): chat2, tools/*, hidden
STRANGER = "nobody.test.example"  # no role
SECRET = "tok-" + secrets.token_hex(12)
OTHER_SECRET = "oth-" + secrets.token_hex(12)
TLS_SECRET = "tls-" + secrets.token_hex(12)  # secret "tls-only": no allow_http
API_KEY = "key-" + secrets.token_hex(12)


# ---------------------------------------------------------------------------------------
# A raw client for the node's Unix socket


class Reply:
    def __init__(self, status, headers, body):
        self.status, self.headers, self.body = status, headers, body

    def json(self):
        return json.loads(self.body)

    def header(self, name):
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)


def call(sock, method, target, agent=None, headers=(), body=None, timeout=30.0):
    """One request; `headers` is a list of (name, value) pairs sent as given (duplicates kept)."""
    conn = UnixHTTPConnection(sock, timeout)
    try:
        conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", "mesh.sam.alt")
        if agent is not None:
            conn.putheader("X-Sam-Agent", agent)
        for name, value in headers:
            conn.putheader(name, value)
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        conn.putheader("Content-Length", str(len(data or b"")))
        conn.endheaders(data)
        r = conn.getresponse()
        return Reply(r.status, r.getheaders(), r.read())
    finally:
        conn.close()


def raw(sock, data, timeout=30.0):
    """Sends raw bytes, reads until the node closes; returns every byte it answered."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(sock)
        s.sendall(data)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except ConnectionResetError:  # answered and closed before reading all we sent
            pass
        return out


def try_raw(sock, data):
    """raw(), with a refused or full listener (EAGAIN) read as no answer: for polling."""
    try:
        return raw(sock, data)
    except OSError:
        return b""


def mcp(sock, agent, message, headers=()):
    body = message if isinstance(message, bytes) else json.dumps(message).encode()
    return call(sock, "POST", "/mcp", agent,
                [("Content-Type", "application/json"),
                 ("Accept", "application/json, text/event-stream"), *headers], body)


def tool_call(sock, agent, name, arguments=None):
    return mcp(sock, agent, {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                             "params": {"name": name, "arguments": arguments or {}}})


def deep(depth):
    return b"[" * depth + b"]" * depth


def alive(node):
    """The node's process runs and its socket accepts a connection."""
    if node.proc.poll() is not None:
        return False
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(node.socket_path)
        return True
    except OSError:
        return False


# ---------------------------------------------------------------------------------------
# Loopback upstreams that record what reached them


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class _DualStackServer(_Server):
    address_family = socket.AF_INET6

    def server_bind(self):
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


class Upstream:
    """An HTTP server on 127.0.0.1; `respond(handler, method, body)` answers; every request is
    recorded as (method, path, [(name, value)], body).

    netns: listen in that network namespace instead, on every address of it, IPv4 and IPv6
    (its loopback, its own interface addresses): a recorder of whatever reaches the namespace
    on that port."""

    def __init__(self, respond, netns=None):
        upstream = self
        self.seen, self.respond = [], respond

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _any(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                upstream.seen.append((self.command, self.path, list(self.headers.items()), body))
                upstream.respond(self, self.command, body)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _any

        if netns is None:
            self.server = _Server(("127.0.0.1", 0), Handler)
        else:
            self.server = _DualStackServer(("::", 0), Handler, bind_and_activate=False)
            self.server.socket.close()
            self.server.socket = netns_socket(netns, socket.AF_INET6)
            self.server.server_bind()
            self.server.server_activate()
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def paths(self):
        return [p for _, p, _, _ in self.seen]

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def answer(h, status, body, headers=(), reason=None):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    h.send_response(status, reason)
    for k, v in headers:
        h.send_header(k, v)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    if h.command != "HEAD":
        h.wfile.write(data)


def model_respond(h, method, body):
    answer(h, 200, {"object": "chat.completion", "path": h.path})


def a2a_respond(h, method, body):
    if h.path.endswith("/.well-known/agent-card.json"):
        answer(h, 200, {"name": "agent", "url": "http://127.0.0.1:1/direct", "version": "1"})
    else:
        answer(h, 200, {"ok": True})


MCP_TOOLS = [{"name": n, "inputSchema": {"type": "object"}} for n in ("read", "delete")]


def mcp_respond(tools):
    def respond(h, method, body):
        if method != "POST":
            answer(h, 405, {})
            return
        msg = json.loads(body)
        if "id" not in msg:
            h.send_response(202)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        if msg["method"] == "initialize":
            result = {"protocolVersion": msg["params"]["protocolVersion"], "capabilities": {},
                      "serverInfo": {"name": "stand-in", "version": "1"}}
            answer(h, 200, {"jsonrpc": "2.0", "id": msg["id"], "result": result},
                   [("Mcp-Session-Id", "s1")])
        elif msg["method"] == "tools/list":
            answer(h, 200, {"jsonrpc": "2.0", "id": msg["id"], "result": {"tools": tools()}})
        else:
            text = "called " + msg["params"]["name"]
            answer(h, 200, {"jsonrpc": "2.0", "id": msg["id"],
                            "result": {"content": [{"type": "text", "text": text}]}})
    return respond


def raw_tools_list(tool_text, fallback):
    """An MCP respond() that answers tools/list with `tool_text` as the one tool, verbatim
    (e.g. a schema nested too deep for any JSON library to build), and the rest as `fallback`."""
    def respond(h, method, body):
        msg = json.loads(body) if body else {}
        if msg.get("method") != "tools/list":
            return fallback(h, method, body)
        answer(h, 200, ('{"jsonrpc":"2.0","id":%s,"result":{"tools":[%s]}}'
                        % (json.dumps(msg["id"]), tool_text)).encode())
    return respond


def calls_seen(upstream):
    return [json.loads(b)["params"]["name"] for m, _, _, b in upstream.seen
            if m == "POST" and json.loads(b).get("method") == "tools/call"]


def echo_respond(h, method, body):
    """A secret-use destination that gives the secret back every way it can."""
    auth = h.headers.get("Authorization", "")
    if h.path == "/redirect":
        answer(h, 302, {}, [("Location", h.server.redirect_to)])
    elif h.path == "/reason":
        answer(h, 200, {}, reason=auth)
    else:
        answer(h, 200, {"authorization": auth, "headers": dict(h.headers.items())},
               [("X-Echo", auth), ("Set-Cookie", "a=" + auth)])


# ---------------------------------------------------------------------------------------
# The node's configuration and the world around it

# A stand-in for compass-runner: records its argv, waits for the file "release" when the
# template's command is [hold] (a spawn that stays pending), then says its agent runs.
RUNNER = """#!/bin/sh
printf '%s\\n' "$@" > "{dir}/argv.$$"
for a in "$@"; do last="$a"; done
if [ "$last" = hold ]; then
  while [ ! -e "{dir}/release" ]; do sleep 0.05; done
fi
echo "compass-runner: agent spawned-$$.test running" >&2
exec sleep 600
"""


def node_config(files, world):
    """The node's config (a dict for nodelib.node_yaml) against `world`'s upstreams; secrets
    and the runner are files in `files`."""
    def url(port, path):
        return f"http://127.0.0.1:{port}{path}"
    return {
        "version": "v1",
        "services": [
            {"name": "chat", "type": "openai", "target_url": url(world.model.port, "/v1"),
             "api_key": f"file://{files}/api-key"},
            {"name": "chat2", "type": "openai", "target_url": url(world.model2.port, "/v1")},
            {"name": "tools", "type": "mcp", "target_url": url(world.mcp.port, "/mcp")},
            {"name": "bar", "type": "a2a", "target_url": url(world.a2a.port, "/bar")},
            {"name": "hidden", "type": "a2a", "target_url": url(world.a2a.port, "/hidden")}],
        # The echo servers speak plain http on loopback: tok and other allow it.
        "secrets": [
            {"name": "tok", "ref": f"file://{files}/tok", "allow_http": True},
            {"name": "other", "ref": f"file://{files}/other", "header": "X-Api-Key",
             "format": "{}", "allow_http": True},
            {"name": "tls-only", "ref": f"file://{files}/tls-only"}],
        "spawn": [
            {"name": "ok", "bundle": "/nonexistent/ok.yaml", "backend": "podman",
             "command": ["echo", "ok"]},
            {"name": "forbidden", "bundle": "/nonexistent/no.yaml", "backend": "podman",
             "command": ["echo", "no"]},
            {"name": "slow", "bundle": "/nonexistent/slow.yaml", "backend": "podman",
             "command": ["hold"]}],
        "runner": f"{files}/runner",
        "probe_interval_ms": 100,
        # The secret-use destinations are the echo servers on loopback ("localhost"), which the
        # node refuses (forbidden-address) unless allowed here.
        "allow_destinations": ["127.0.0.0/8", "::1/128"],
        "roles": [
            {"name": "readers", "allowed_agents": [READER], "services": ["chat", "tools", "bar"],
             "tools": ["tools/read"], "spawn": ["ok", "slow"],
             "secrets": [{"name": "tok", "destinations": [f"localhost:{world.echo.port}"]},
                         {"name": "tls-only",
                          "destinations": [f"localhost:{world.echo.port}"]}]},
            {"name": "writers", "allowed_agents": ["*.writers.example"],
             "services": ["chat2", "tools", "hidden"], "tools": ["tools/*"],
             "spawn": ["forbidden", "slow"],
             "secrets": [{"name": "other",
                          "destinations": [f"localhost:{world.echo2.port}"]}]}]}


def secret_use_config(files, port, allow_destinations=None):
    """A node that only relays secret-use: READER may use secret "tok" (plain http allowed)
    with any name under example.com on `port`, a wildcard on a domain whose names lead
    anywhere. `allow_destinations`: the node's exceptions to forbidden-address (None: none).
    The secret is the file `files`/tok."""
    config = {
        "version": "v1",
        "secrets": [{"name": "tok", "ref": f"file://{files}/tok", "allow_http": True}],
        "roles": [{"name": "readers", "allowed_agents": [READER],
                   "secrets": [{"name": "tok", "destinations": [f"*.example.com:{port}"]}]}]}
    if allow_destinations is not None:
        config["allow_destinations"] = list(allow_destinations)
    return config


class World:
    """The upstreams; make_node() starts a node on them (more than one may run)."""

    def __init__(self):
        self.model, self.model2 = Upstream(model_respond), Upstream(model_respond)
        self.tools = list(MCP_TOOLS)
        self.mcp = Upstream(mcp_respond(lambda: self.tools))
        self.a2a = Upstream(a2a_respond)
        self.echo, self.echo2 = Upstream(echo_respond), Upstream(echo_respond)
        self.echo.server.redirect_to = f"http://localhost:{self.echo2.port}/stolen"
        self.nodes, self.dirs = [], []

    def make_node(self, factory=None):
        """A started SamNode, once its a2a service "bar" passed a card probe. `factory`:
        nodelib's sam_node fixture (the test then owns the node), else the World does. Its
        secrets and runner are in node.files, removed by close()."""
        files = pathlib.Path(tempfile.mkdtemp(prefix="sam-node-files-"))
        self.dirs.append(files)
        for name, value in (("tok", SECRET), ("other", OTHER_SECRET), ("tls-only", TLS_SECRET),
                            ("api-key", API_KEY)):
            (files / name).write_text(value)
            (files / name).chmod(0o600)
        (files / "runner").write_text(RUNNER.format(dir=files))
        (files / "runner").chmod(0o755)
        config = node_config(files, self)
        if factory is not None:
            node = factory(config)
        else:
            node = SamNode(config)
            self.nodes.append(node)
            node.start()
        node.files = files
        wait_for(lambda: call(node.socket_path, "GET", "/a2a", READER).json()["agents"],
                 timeout=20, what="a2a service bar to pass its card probe")
        return node

    def close(self):
        for node in self.nodes:
            node.close(grace=20)  # SIGTERM first: the node stops the runners it started
        for up in (self.model, self.model2, self.mcp, self.a2a, self.echo, self.echo2):
            up.stop()
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)
