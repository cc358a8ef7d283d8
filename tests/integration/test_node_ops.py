"""sam-node's relayed operations and its MCP aggregation, talking to the node's Unix socket
directly with X-Sam-Agent set as sam-box would (issue 6; docs/sam-node.md).

- secret-use: against a python HTTP server on loopback that echoes the Authorization it got;
  the agent sees "[redacted]", the server saw the real secret; another destination or an agent
  without the grant is refused.
- MCP: two python Streamable-HTTP MCP stand-ins (one answers JSON, one answers SSE and keeps
  the stream open, and pages its tools/list); two agents with different roles see different
  tools; a tool not granted gives isError; an expired upstream session is re-initialized.
- spawn: `runner:` is a script that prints compass-runner's "agent <id> running" line; a
  template not granted is refused; a runner that fails answers 502 with its last line; the
  runner is stopped when sam-node stops. (A real compass-runner spawn needs the podman image;
  it is not exercised here.)

Everything is on loopback or Unix sockets.
"""

import http.server
import json
import os
import pathlib
import secrets
import shutil
import tempfile
import threading

import pytest

from boxlib import wait_for
from nodelib import SamNode

READER = "reader.test.example"      # role readers: alpha/read, alpha/shared, beta/*; secret
WRITER = "w1.writers.example"       # role writers (*.writers.example): alpha/* only
STRANGER = "nobody.test.example"    # no role
SECRET = "tok-" + secrets.token_hex(12)


# ---------------------------------------------------------------------------------------
# Loopback servers


def serve(handler_cls):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler_cls)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


class EchoHandler(http.server.BaseHTTPRequestHandler):
    """Answers with what it was sent; keeps every Authorization it saw."""
    seen = []

    def log_message(self, *args):
        pass

    def _answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode()
        auth = self.headers.get("Authorization", "")
        EchoHandler.seen.append(auth)
        out = json.dumps({"method": self.command, "path": self.path, "authorization": auth,
                          "x_custom": self.headers.get("X-Custom", ""), "body": body}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Echo-Auth", auth)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = _answer


class McpStandIn:
    """A Streamable-HTTP MCP server in the small: initialize (with a session id), tools/list,
    tools/call. `sse`: answer POSTs with text/event-stream, a notification first, and keep the
    stream open after the response (the node must not wait for the close). `page`: tools/list
    in pages of one tool via nextCursor."""

    def __init__(self, name, tools, sse=False, page=False):
        self.name, self.tools, self.sse, self.page = name, tools, sse, page
        self.sessions = set()
        self.initializes = 0
        self.calls = []
        self.stop = threading.Event()
        stand_in = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                self.send_response(405)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self):
                stand_in.handle(self)

        self.server = serve(Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/mcp"

    def result(self, msg):
        method, params = msg["method"], msg.get("params") or {}
        if method == "initialize":
            self.initializes += 1
            return {"protocolVersion": params["protocolVersion"], "capabilities": {"tools": {}},
                    "serverInfo": {"name": self.name}}
        if method == "tools/list":
            tools = [{"name": t, "description": f"{t} of {self.name}",
                      "inputSchema": {"type": "object"}} for t in self.tools]
            if not self.page:
                return {"tools": tools}
            i = int(params.get("cursor", "0"))
            out = {"tools": tools[i:i + 1]}
            if i + 1 < len(tools):
                out["nextCursor"] = str(i + 1)
            return out
        if method == "tools/call":
            self.calls.append(params["name"])
            text = f"{self.name}:{params['name']}:{json.dumps(params.get('arguments'))}"
            return {"content": [{"type": "text", "text": text}]}
        return None

    def handle(self, h):
        msg = json.loads(h.rfile.read(int(h.headers["Content-Length"])))
        sid = h.headers.get("Mcp-Session-Id")
        if msg.get("method") != "initialize" and sid not in self.sessions:
            h.send_response(404 if sid else 400)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        if "id" not in msg:  # a notification
            h.send_response(202)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        result = self.result(msg)
        reply = ({"jsonrpc": "2.0", "id": msg["id"], "result": result} if result is not None else
                 {"jsonrpc": "2.0", "id": msg["id"],
                  "error": {"code": -32601, "message": "no such method"}})
        h.send_response(200)
        if msg["method"] == "initialize":
            new = secrets.token_hex(8)
            self.sessions.add(new)
            h.send_header("Mcp-Session-Id", new)
        if not self.sse:
            data = json.dumps(reply).encode()
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            h.wfile.write(data)
            return
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Connection", "close")
        h.end_headers()
        note = {"jsonrpc": "2.0", "method": "notifications/message",
                "params": {"level": "info", "data": "working"}}
        h.wfile.write(b": hello\n\nevent: message\ndata: " + json.dumps(note).encode() + b"\n\n")
        text = json.dumps(reply, indent=1).encode().replace(b"\n", b"\ndata: ")
        h.wfile.write(b"id: 1\r\ndata: " + text + b"\r\n\r\n")
        h.wfile.flush()
        # Keep the stream open until the node hangs up or the test ends.
        try:
            while not self.stop.wait(0.1):
                h.wfile.write(b": keep-alive\n\n")
                h.wfile.flush()
        except OSError:
            pass


# ---------------------------------------------------------------------------------------
# sam-node


class Env:
    """The node under test (nodelib.SamNode) and what stands around it: its files in tmp, the
    echo servers' ports, the MCP stand-ins. Requests default to READER."""

    def __init__(self, tmp, node, echo_port, other_port, alpha, beta):
        self.tmp, self.node = tmp, node
        self.echo_port, self.other_port = echo_port, other_port
        self.alpha, self.beta = alpha, beta

    def request(self, method, path, body=None, agent=READER, headers=None):
        return self.node.request(method, path, agent=agent, headers=headers, body=body,
                                 timeout=30)

    def post_json(self, path, body, agent=READER):
        status, headers, data = self.request("POST", path, body, agent=agent)
        return status, headers, json.loads(data) if data else None

    def logs(self):
        return self.node.stderr_text()

    def stop(self):
        return self.node.stop(timeout=30)


RUNNER = """#!/bin/sh
last=""
for a in "$@"; do last="$a"; done
echo "$@" > "{tmp}/runner-args"
if [ "$last" = fail ]; then
  echo "compass-runner: checking bundle" >&2
  echo "compass-runner: cannot start agent: bundle refused" >&2
  exit 3
fi
echo "$$" > "{tmp}/runner-pid"
echo "compass-runner: agent a0123456789 running (tier host, egress unenforced, pid $$)" >&2
exec sleep 600
"""


@pytest.fixture(scope="module")
def env():
    tmp = tempfile.mkdtemp(prefix="node-ops-")
    echo = serve(EchoHandler)
    other = serve(EchoHandler)
    alpha = McpStandIn("alpha", ["read", "write", "shared"])
    beta = McpStandIn("beta", ["search", "shared", "index"], sse=True, page=True)
    (pathlib.Path(tmp) / "api-token").write_text(SECRET + "\n")
    (pathlib.Path(tmp) / "bundle.yaml").write_text("version: v1\n")
    runner = pathlib.Path(tmp) / "fake-runner"
    runner.write_text(RUNNER.format(tmp=tmp))
    runner.chmod(0o755)
    echo_port, other_port = echo.server_address[1], other.server_address[1]
    config = {
        "version": "v1",
        "services": [{"name": "alpha", "type": "mcp", "target_url": alpha.url},
                     {"name": "beta", "type": "mcp", "target_url": beta.url}],
        # The echo server speaks plain http: api-token allows it; tls-token (the default)
        # goes to https:// destinations only.
        "secrets": [{"name": "api-token", "ref": f"file://{tmp}/api-token", "allow_http": True},
                    {"name": "tls-token", "ref": f"file://{tmp}/api-token"}],
        "spawn": [{"name": "worker", "bundle": f"{tmp}/bundle.yaml", "backend": "host",
                   "command": ["sleep", "600"]},
                  {"name": "broken", "bundle": f"{tmp}/bundle.yaml", "backend": "host",
                   "command": ["fail"]}],
        "runner": str(runner),
        # The destinations are python servers on loopback, which secret-use refuses
        # (forbidden-address) unless the operator allows it.
        "allow_destinations": ["127.0.0.0/8", "::1/128"],
        "roles": [{"name": "readers", "allowed_agents": [READER], "services": ["alpha", "beta"],
                   "tools": ["alpha/read", "alpha/shared", "beta/*"],
                   "spawn": ["worker", "broken"],
                   "secrets": [{"name": "api-token",
                                "destinations": [f"localhost:{echo_port}"]},
                               {"name": "tls-token",
                                "destinations": [f"localhost:{echo_port}"]}]},
                  {"name": "writers", "allowed_agents": ["*.writers.example"],
                   "services": ["alpha"], "tools": ["alpha/*"]}]}
    node = None
    try:
        node = SamNode(config, metrics=False)
        yield Env(pathlib.Path(tmp), node.start(), echo_port, other_port, alpha, beta)
    finally:
        alpha.stop.set()
        beta.stop.set()
        if node is not None:
            node.close(grace=30)  # SIGTERM first: sam-node stops the runners it started
        for srv in (echo, other, alpha.server, beta.server):
            srv.shutdown()
            srv.server_close()
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------------
# secret-use


def secret_use(env, agent=READER, port=None, headers=None, secret="api-token"):
    return env.post_json("/ops/secret-use", {
        "secret": secret,
        "request": {"method": "POST",
                    "url": f"http://localhost:{port or env.echo_port}/api?q=1",
                    "headers": headers or {"X-Custom": "yes"}, "body": "hello"}}, agent=agent)


def test_secret_use_attaches_the_secret_and_redacts_it(env):
    EchoHandler.seen.clear()
    status, _, reply = secret_use(env)
    assert status == 200, reply
    assert reply["status"] == 200
    echoed = json.loads(reply["body"])
    assert echoed["authorization"] == "Bearer [redacted]"
    assert echoed["x_custom"] == "yes" and echoed["body"] == "hello"
    assert echoed["path"] == "/api?q=1" and echoed["method"] == "POST"
    assert reply["headers"]["x-echo-auth"] == "Bearer [redacted]"
    assert SECRET not in json.dumps(reply)
    assert EchoHandler.seen == [f"Bearer {SECRET}"]  # the destination got the real one
    assert SECRET not in env.logs()


def test_secret_use_refusals(env):
    EchoHandler.seen.clear()
    status, headers, reply = secret_use(env, port=env.other_port)
    assert status == 403 and headers["Sam-Node-Reason"] == "secret-not-granted", reply
    status, headers, reply = secret_use(env, agent=WRITER)
    assert status == 403 and headers["Sam-Node-Reason"] == "secret-not-granted", reply
    status, _, reply = secret_use(env, secret="no-such-secret")
    assert status == 403, reply
    # The agent may not set the field the secret goes in, nor Host (domain fronting).
    status, _, reply = secret_use(env, headers={"authorization": "Bearer mine"})
    assert status == 400 and "authorization" in reply["error"]["message"], reply
    status, _, reply = secret_use(env, headers={"Host": "elsewhere.example"})
    assert status == 400 and "Host" in reply["error"]["message"], reply
    status, _, reply = env.post_json("/ops/secret-use", {
        "secret": "api-token", "request": {"url": f"http://127.0.0.1:{env.echo_port}/"}})
    assert status == 400 and "request.url" in reply["error"]["message"], reply
    status, _, reply = env.post_json("/ops/secret-use", {
        "secret": "api-token", "request": {"url": "ftp://localhost/"}})
    assert status == 400 and "request.url" in reply["error"]["message"], reply
    status, _, reply = env.post_json("/ops/secret-use", {"secret": "api-token"})
    assert status == 400 and "request" in reply["error"]["message"], reply
    status, _, _ = env.request("POST", "/ops/secret-use", "{not json")
    assert status == 400
    status, headers, _ = env.request("POST", "/ops/secret-use", "{}", agent=None)
    assert status == 401
    assert EchoHandler.seen == []  # nothing refused reached the destination


def test_secret_use_is_https_only_unless_the_secret_allows_http(env):
    EchoHandler.seen.clear()
    status, headers, reply = secret_use(env, secret="tls-token")
    assert status == 403 and headers["Sam-Node-Reason"] == "secret-requires-https", reply
    assert "https://" in reply["error"]["message"]
    # The same grant over https: sent, and refused by the (plain http) echo server's end of
    # the TLS handshake before any request went out.
    status, headers, reply = env.post_json("/ops/secret-use", {
        "secret": "tls-token",
        "request": {"url": f"https://localhost:{env.echo_port}/api"}})
    assert status == 502 and headers["Sam-Node-Reason"] == "destination-failed", reply
    assert SECRET not in json.dumps(reply)
    assert EchoHandler.seen == []


def test_secret_use_to_loopback_needs_allow_destinations(env):
    """"localhost" is a name, and a role may grant it; but it resolves to loopback, where the
    node's own host serves things the secret must never reach. Without `allow_destinations`
    the node refuses it (403 forbidden-address) before any byte goes out; the module's node,
    configured with 127.0.0.0/8 and ::1/128, reached the same server above."""
    config = json.loads(env.node.config_path.read_text())
    del config["allow_destinations"]
    strict = SamNode(config)
    try:
        strict.start()
        EchoHandler.seen.clear()
        status, headers, _ = strict.request("POST", "/ops/secret-use", agent=READER, body={
            "secret": "api-token",
            "request": {"url": f"http://localhost:{env.echo_port}/api"}})
        assert status == 403 and headers["Sam-Node-Reason"] == "forbidden-address"
        assert EchoHandler.seen == []
        assert strict.metric('sam_node_refusals_total{reason="forbidden-address"}') == 1
        assert strict.metric(
            'sam_node_operations_total{operation="secret-use",outcome="denied"}') == 1
        refused = [line for line in strict.logs() if line.get("msg") == "secret-use refused"]
        assert refused and refused[0]["reason"] == "forbidden-address"
        assert refused[0]["address"] in ("127.0.0.1", "::1")
        assert SECRET not in strict.stderr_text()
    finally:
        strict.close()


# ---------------------------------------------------------------------------------------
# MCP


def rpc(env, method, params=None, agent=READER, rid=1):
    msg = {"jsonrpc": "2.0", "id": rid, "method": method}
    if params is not None:
        msg["params"] = params
    status, headers, body = env.request(
        "POST", "/mcp", json.dumps(msg), agent=agent,
        headers={"Accept": "application/json, text/event-stream"})
    return status, headers, json.loads(body) if body else None


def tool_names(env, agent):
    status, _, reply = rpc(env, "tools/list", {}, agent=agent)
    assert status == 200, reply
    return [t["name"] for t in reply["result"]["tools"]]


def test_mcp_initialize_and_transport(env):
    status, headers, reply = rpc(env, "initialize", {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}})
    assert status == 200
    assert headers.get("Mcp-Session-Id")
    assert reply["result"]["protocolVersion"] == "2025-06-18"
    assert reply["result"]["capabilities"] == {"tools": {"listChanged": False}}
    assert reply["result"]["serverInfo"]["name"] == "sam-node"
    _, _, reply = rpc(env, "initialize", {"protocolVersion": "1999-01-01", "capabilities": {}})
    assert reply["result"]["protocolVersion"] == "2025-11-25"
    status, _, _ = env.request("POST", "/mcp", json.dumps(
        {"jsonrpc": "2.0", "method": "notifications/initialized"}))
    assert status == 202
    assert rpc(env, "ping")[2]["result"] == {}
    assert rpc(env, "resources/list")[2]["error"]["code"] == -32601
    status, _, body = env.request("POST", "/mcp", "{oops")
    assert status == 400 and json.loads(body)["error"]["code"] == -32700
    status, headers, body = env.request("POST", "/mcp", json.dumps(
        [{"jsonrpc": "2.0", "id": 1, "method": "ping"}]))
    assert status == 400 and headers["Sam-Node-Reason"] == "bad-mcp-message"
    assert json.loads(body)["error"]["code"] == -32600
    assert "batch" in json.loads(body)["error"]["message"]
    status, headers, body = env.request("GET", "/mcp")
    assert (status, headers["Sam-Node-Reason"], headers["Allow"]) == (405, "method-not-allowed",
                                                                      "POST, DELETE")
    assert env.request("DELETE", "/mcp")[0] == 200


def test_mcp_tools_list_depends_on_who_asks(env):
    # beta pages its list (nextCursor) and answers over SSE; "shared" goes to alpha (first).
    assert tool_names(env, READER) == ["read", "shared", "search", "index"]
    assert tool_names(env, WRITER) == ["read", "write", "shared"]
    assert tool_names(env, STRANGER) == []


def test_mcp_tools_call(env):
    _, _, reply = rpc(env, "tools/call", {"name": "search", "arguments": {"q": "x"}})
    assert reply["id"] == 1
    assert reply["result"]["content"][0]["text"] == 'beta:search:{"q": "x"}'
    _, _, reply = rpc(env, "tools/call", {"name": "shared", "arguments": {}}, rid="s")
    assert reply["id"] == "s"
    assert reply["result"]["content"][0]["text"].startswith("alpha:shared:")
    _, _, reply = rpc(env, "tools/call", {"name": "write", "arguments": {}}, agent=WRITER)
    assert reply["result"]["content"][0]["text"].startswith("alpha:write:")


def test_mcp_tool_not_granted_is_a_result_the_model_reads(env):
    calls = list(env.alpha.calls)
    status, _, reply = rpc(env, "tools/call", {"name": "write", "arguments": {}})
    assert status == 200 and "error" not in reply, reply
    assert reply["result"]["isError"] is True
    assert "not granted" in reply["result"]["content"][0]["text"]
    _, _, reply = rpc(env, "tools/call", {"name": "nope", "arguments": {}})
    assert reply["result"]["isError"] is True
    assert "unknown tool" in reply["result"]["content"][0]["text"]
    _, _, reply = rpc(env, "tools/call", {"name": "search", "arguments": {}}, agent=WRITER)
    assert reply["result"]["isError"] is True
    assert env.alpha.calls == calls  # nothing refused reached the upstream
    _, _, reply = rpc(env, "tools/call", {"arguments": {}})
    assert reply["error"]["code"] == -32602


def test_mcp_upstream_session_expiry_reinitializes(env):
    rpc(env, "tools/call", {"name": "read", "arguments": {}})
    before = env.alpha.initializes
    env.alpha.sessions.clear()  # the upstream forgets: the node's next request gets 404
    _, _, reply = rpc(env, "tools/call", {"name": "read", "arguments": {"n": 1}})
    assert reply["result"]["content"][0]["text"] == 'alpha:read:{"n": 1}'
    assert env.alpha.initializes == before + 1


# ---------------------------------------------------------------------------------------
# spawn (last: stopping the node is part of it)


def test_spawn(env):
    status, headers, reply = env.post_json("/ops/spawn", {"template": "worker"}, agent=WRITER)
    assert status == 403 and headers["Sam-Node-Reason"] == "spawn-not-granted", reply
    status, _, reply = env.post_json("/ops/spawn", {"template": "unknown"})
    assert status == 403, reply
    status, _, reply = env.post_json("/ops/spawn", {"template": 3})
    assert status == 400 and "template" in reply["error"]["message"], reply

    status, _, reply = env.post_json("/ops/spawn", {"template": "broken"})
    assert status == 502, reply
    assert "cannot start agent: bundle refused" in reply["error"]["message"]

    status, _, reply = env.post_json("/ops/spawn", {"template": "worker"})
    assert status == 200, reply
    assert reply == {"id": "a0123456789", "template": "worker"}
    args = (env.tmp / "runner-args").read_text().split()
    assert args == ["run", "--backend", "host", "--bundle", str(env.tmp / "bundle.yaml"), "--",
                    "sleep", "600"]
    pid = int((env.tmp / "runner-pid").read_text())
    os.kill(pid, 0)  # running

    env.stop()  # ~Operations stops the runners it started

    def gone():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False
    wait_for(gone, timeout=20, what="the spawned runner to be stopped with sam-node")
