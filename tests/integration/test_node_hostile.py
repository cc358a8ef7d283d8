"""sam-node against a hostile agent and hostile upstreams (issue 6; docs/sam-node.md).

The agent is assumed compromised. It reaches the node only through sam-box, which sets
X-Sam-Agent; everything else in the request is the attacker's: path, headers, body, JSON-RPC,
a2a names, secret-use and spawn requests. Upstreams (model, MCP and a2a servers) may be hostile
too. These tests talk to the node's Unix socket directly, setting X-Sam-Agent as sam-box would,
and check two things for every attack: the node refuses it (or answers harmlessly), and the
upstream that must not be reached saw nothing. The upstream stand-ins, the node's config and
the raw client are in hostile_upstreams.py; the node is nodelib's SamNode.

Tests whose docstring starts with "HOLE" failed before the node was fixed; each names the file
and function that had the hole.

Everything runs on loopback and Unix sockets; the forbidden-address tests run the node in the
test network namespace BOX (conftest.py), with that namespace's own /etc/hosts.
"""

import http.client
import json
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import types

import pytest

from boxlib import wait_for
from hostile_upstreams import (API_KEY, READER, SECRET, STRANGER, TLS_SECRET, WRITER, Upstream,
                               World, alive, call, calls_seen, deep, echo_respond, mcp,
                               mcp_respond, raw, raw_tools_list, secret_use_config, tool_call,
                               try_raw)
from nodelib import SamNode, sam_node  # noqa: F401 (a fixture)

MAX_CONNECTIONS = 256  # kMaxConnections in src/sam-node/http.h
PER_PEER = 64  # kMaxConnectionsPerPeer


@pytest.fixture(scope="module")
def world():
    w = World()
    try:
        w.node = w.make_node()
        yield w
    finally:
        w.close()


@pytest.fixture
def sock(world):
    assert alive(world.node), "an earlier test killed the shared node:\n" + \
        world.node.stderr_text()
    return world.node.socket_path


@pytest.fixture
def fresh_node(world, sam_node):  # noqa: F811 (the fixture imported above)
    """A node of its own, for attacks that may kill or saturate it."""
    node = world.make_node(sam_node)
    yield node
    node.close(grace=20)  # SIGTERM first: the node stops the runners it started


# ---------------------------------------------------------------------------------------
# Identity


def test_identity_missing_or_under_another_spelling_is_refused(sock, world):
    for headers in ([], [("X_Sam_Agent", READER)], [("X-Sam-Agents", READER)],
                    [("X-Sam-Agent", "")]):
        r = call(sock, "GET", "/v1/models", None, headers)
        assert r.status == 401 and r.header("Sam-Node-Reason") == "missing-agent-identity"


@pytest.mark.parametrize("agent", ["*.writers.example", "writers.example", "w1.writers.example.x",
                                   "reader.test.example.evil", "reader", "READER.TEST.EXAMPLE.."])
def test_identity_that_only_resembles_a_grant_gets_nothing(sock, agent):
    assert call(sock, "GET", "/v1/models", agent).json()["data"] == []
    assert call(sock, "GET", "/a2a", agent).json()["agents"] == []
    r = tool_call(sock, agent, "read")
    assert r.json()["result"]["isError"] is True


def test_duplicate_x_sam_agent_is_refused(sock):
    """HOLE (hardening): two X-Sam-Agent fields are ambiguous; the node takes the first
    (http_server.cc finishRequest/findHeader). It should refuse (400) rather than guess."""
    r = call(sock, "GET", "/v1/models", STRANGER, [("X-Sam-Agent", READER)])
    assert r.status == 400, r.body
    r = call(sock, "GET", "/v1/models", READER, [("X-Sam-Agent", STRANGER)])
    assert r.status == 400, r.body


def test_an_empty_x_sam_agent_beside_a_real_one_is_ambiguous_not_missing(sock):
    """Two fields are ambiguous whatever they hold: an empty one first made the node answer
    401 missing-agent-identity (router.cc checked the first value before counting fields)."""
    r = call(sock, "GET", "/v1/models", "", [("X-Sam-Agent", READER)])
    assert r.status == 400, r.body
    assert r.header("Sam-Node-Reason") == "ambiguous-agent-identity"


def test_pipelined_requests_each_answer_for_their_own_agent(sock):
    def get(agent, last=False):
        return (f"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Sam-Agent: {agent}\r\n"
                + ("Connection: close\r\n" if last else "") + "\r\n").encode()
    out = raw(sock, get(READER) + get(STRANGER) + get(WRITER, last=True))
    bodies = [json.loads(part.split(b"\r\n\r\n", 1)[1].split(b"HTTP/1.1")[0])
              for part in out.split(b"HTTP/1.1 200")[1:]]
    assert [[m["id"] for m in b["data"]] for b in bodies] == [["chat"], [], ["chat2"]]


# ---------------------------------------------------------------------------------------
# HTTP framing


@pytest.mark.parametrize("request_bytes,status", [
    (b"POST /v1/x HTTP/1.1\r\nX-Sam-Agent: r\r\nContent-Length: 3\r\n"
     b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    (b"POST /v1/x HTTP/1.1\r\nX-Sam-Agent: r\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
     400),
    (b"GET /v1/models HTTP/1.1\r\nX-Sam-Agent: r\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n", 431),
    (b"POST /v1/x HTTP/1.1\r\nX-Sam-Agent: r\r\nContent-Length: 99999999999\r\n\r\n", 413),
    (b"GET /v1/models HTTP/1.1\r\nX-Sam-Agent: r\nBad\x00: x\r\n\r\n", 400),
    # A space before the colon makes the name no token (RFC 9112 §5.1): not a missing identity.
    (b"GET /v1/models HTTP/1.1\r\nX-Sam-Agent : r\r\nConnection: close\r\n\r\n", 400),
])
def test_malformed_or_oversized_requests_are_refused(sock, request_bytes, status):
    answer = raw(sock, request_bytes)
    assert answer.startswith(f"HTTP/1.1 {status} ".encode())
    # The same refusal shape as every other (docs/sam-node.md): the reason in Sam-Node-Reason
    # and as the body's code.
    head, _, body = answer.partition(b"\r\n\r\n")
    reason = [line.split(b":", 1)[1].strip().decode() for line in head.split(b"\r\n")[1:]
              if line.lower().startswith(b"sam-node-reason:")]
    assert len(reason) == 1, answer[:400]
    error = json.loads(body)["error"]
    assert error["type"] == "sam_node_refusal" and error["code"] == reason[0], error


def test_chunked_body_over_the_cap_is_refused_and_the_node_lives(sock, world):
    chunk = b"%x\r\n" % (1 << 20) + b"a" * (1 << 20) + b"\r\n"
    head = b"POST /v1/chat HTTP/1.1\r\nX-Sam-Agent: r\r\nTransfer-Encoding: chunked\r\n\r\n"
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(30)
        s.connect(sock)
        s.sendall(head)
        try:
            for _ in range(17):
                s.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert s.recv(4096).startswith(b"HTTP/1.1 413 ")
    assert alive(world.node)


# A process that connects N times to the node's socket, sends PAYLOAD on each, prints how many
# connections the node refused at once (503), then holds the rest until its stdin closes:
# another peer process, as another agent's sam-box is.
HOLDER = r"""
import socket, sys, time
path, n, payload = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode()
socks, held, refused = [], [], 0
for _ in range(n):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    try:
        if payload:
            s.sendall(payload)
        socks.append(s)
    except OSError:
        refused += 1
time.sleep(0.5)
for s in socks:
    s.setblocking(False)
    try:
        s.recv(64)  # a 503 and the close, or the close alone
        refused += 1
        s.close()
    except BlockingIOError:
        held.append(s)
    except OSError:
        refused += 1
print(len(held), refused, flush=True)
sys.stdin.read()
"""


class Holders:
    """Peer processes holding connections to the node; close() lets them all go."""

    def __init__(self, path):
        self.path, self.procs = path, []

    def hold(self, n, payload=b""):
        """Returns (held, refused) of one new holder process of n connections."""
        p = subprocess.Popen([sys.executable, "-c", HOLDER, self.path, str(n), payload.decode()],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.procs.append(p)
        held, refused = map(int, p.stdout.readline().split())
        return held, refused

    def close(self):
        for p in self.procs:
            p.stdin.close()
            p.wait(timeout=30)


@pytest.fixture
def holders(fresh_node):
    h = Holders(fresh_node.socket_path)
    try:
        yield h
    finally:
        h.close()


def _assert_cap_held(held, node):
    """The holders got exactly the cap, except that a machine slow enough to take over 5 s
    (kSlowRequest) to start them may already have seen the node close an early one of theirs
    (logged slow-request-evicted, counted as held by a holder that checked before) to admit a
    later one: at most one more held per eviction, never more than that."""
    evicted = sum(1 for line in node.logs() if line.get("reason") == "slow-request-evicted")
    assert MAX_CONNECTIONS <= held <= MAX_CONNECTIONS + evicted, (held, evicted)


def test_connection_cap_answers_503_then_closes_the_slowest_request(fresh_node, holders):
    """Every slot held by requests in progress (heads not complete, from five peers of
    PER_PEER each): while they are younger than 5 s (kSlowRequest) the next connection is
    answered 503; past that, the one arriving longest is closed (408) to let it in. (Five
    colluding agents trickling requests locked every agent out for as long as they liked.)"""
    sock_path = fresh_node.socket_path
    held = sum(holders.hold(PER_PEER, b"GET /v1/models HTTP/1.1\r\n")[0] for _ in range(5))
    # The fifth peer's 64 were refused (503): no slot was idle and none yet slow. (A probe
    # made after this may already find one past 5 s on a loaded machine: that 503 is proven
    # by unit_sam_node HttpServerTest.AFullServerRefusesWhenNoConnectionMayBeClosed.)
    _assert_cap_held(held, fresh_node)
    wait_for(lambda: call(sock_path, "GET", "/v1/models", READER).status == 200, timeout=20,
             what="the node to close a slow request to make room")
    assert any(line.get("reason") == "slow-request-evicted" for line in fresh_node.logs())


def test_one_peer_cannot_take_every_connection(fresh_node, holders):
    """HOLE (DoS, any agent, no grant needed): one sam-box opened 256 tunnels to
    mesh.sam.alt and sent nothing; the node held each for its 5-minute idle limit and answered
    every other agent 503 (http_server.cc, serve(): one cap for all peers). A peer process now
    holds PER_PEER connections at most."""
    assert holders.hold(MAX_CONNECTIONS) == (PER_PEER, MAX_CONNECTIONS - PER_PEER)
    assert call(fresh_node.socket_path, "GET", "/v1/models", READER).status == 200
    assert any(line.get("counted") == "connections from one peer process"
               for line in fresh_node.logs())


def test_idle_connections_make_room_at_the_cap(fresh_node, holders):
    """Every slot held by idle connections (five peers): a new connection closes the one idle
    longest instead of being refused, as a keep-alive connection may be closed between
    requests (RFC 9112 §9.5)."""
    held = sum(holders.hold(PER_PEER)[0] for _ in range(5))
    assert held == 5 * PER_PEER  # the last 64 made room by closing idle ones
    assert call(fresh_node.socket_path, "GET", "/v1/models", READER).status == 200
    evicted = [line for line in fresh_node.logs() if line.get("reason") == "idle-evicted"]
    assert len(evicted) >= 5 * PER_PEER - MAX_CONNECTIONS + 1, len(evicted)


def test_a_head_that_never_completes_does_not_hold_a_slot_forever(fresh_node, holders):
    """HOLE (DoS): serveConnection() (http_server.cc) blocks in recv() with no deadline, so one
    agent that opens kMaxConnections connections and never finishes a head locks every other
    agent of the host out (503) for as long as it likes. The node should close a connection
    whose head is not complete within a bound (e.g. 30 s; and idle keep-alive likewise)."""
    sock_path = fresh_node.socket_path
    partial = b"GET /v1/models HTTP/1.1\r\nX-Sam-Agent: " + READER.encode()
    held = sum(holders.hold(PER_PEER, partial)[0] for _ in range(5))
    _assert_cap_held(held, fresh_node)
    wait_for(lambda: try_raw(sock_path, b"GET /v1/models HTTP/1.1\r\nX-Sam-Agent: "
                             + READER.encode() + b"\r\nConnection: close\r\n\r\n")
             .startswith(b"HTTP/1.1 200 "), timeout=90,
             what="the node to drop connections stuck in a head")


def test_deeply_nested_json_does_not_kill_the_node(fresh_node):
    """HOLE (crash, any agent, no grant needed): mcp::classify() (mcp_wire.cc) copies "params"
    (`m.params = *params`), and nlohmann::json's copy and dump() recurse once per nesting
    level; 1 MB of '[' overflows the connection thread's stack and SIGSEGVs the whole node.
    Fix: bound nesting depth before using a parsed value (a parser callback counting depth,
    refuse > e.g. 64 with 400 / kInvalidRequest), for every JSON the node parses from an agent
    (mcp.cc serve, ops.cc serve, openai.cc chooseService) or an upstream (mcp.cc exchange,
    a2a.cc card)."""
    body = b'{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"x":' + deep(500000) + b"}}"
    try:
        r = mcp(fresh_node.socket_path, READER, body)
        assert r.status in (200, 400)
    except (ConnectionError, http.client.HTTPException):
        pass
    assert alive(fresh_node), "sam-node died:\n" + fresh_node.stderr_text()[-2000:]
    for route, payload in (("/ops/spawn", b'{"template":' + deep(500000) + b"}"),
                           ("/v1/chat/completions", b'{"model":' + deep(500000) + b"}")):
        call(fresh_node.socket_path, "POST", route, READER, body=payload)
        assert alive(fresh_node), route


def test_deeply_nested_tool_schema_from_an_upstream_does_not_kill_the_node(world, fresh_node):
    """HOLE (crash from a hostile MCP server): the node copies each tool of a tools/list
    (mcp.cc listTools, tools.push_back(tool)) and dumps it to the agent; a schema nested 500k
    deep SIGSEGVs the node. Same fix as above, in UpstreamClient::exchange."""
    tool = '{"name": "read", "inputSchema": %s}' % deep(500000).decode()
    world.mcp.respond = raw_tools_list(tool, world.mcp.respond)
    try:
        try:
            mcp(fresh_node.socket_path, READER, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        except (ConnectionError, http.client.HTTPException):
            pass
        assert alive(fresh_node), "sam-node died:\n" + fresh_node.stderr_text()[-2000:]
    finally:
        world.mcp.respond = mcp_respond(lambda: world.tools)



def big_tool_answers(world, calls, text_bytes):
    """An MCP respond() whose tools/call answers carry `text_bytes` of text. Each answer is
    held back until `calls` tools/calls have arrived, and its last bytes until every one of
    them has sent the rest or found its connection closed: all are in the node at once."""
    arrived = threading.Barrier(calls, timeout=60)
    sent = threading.Barrier(calls, timeout=60)
    fallback = mcp_respond(lambda: world.tools)

    def respond(h, method, body):
        msg = json.loads(body) if body else {}
        if msg.get("method") != "tools/call":
            return fallback(h, method, body)
        head = ('{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"'
                % json.dumps(msg["id"])).encode()
        tail = b'"}]}}'
        arrived.wait()
        try:
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(head) + text_bytes + len(tail)))
            h.end_headers()
            h.wfile.write(head + b"x" * (text_bytes - 1))
            h.wfile.flush()
        except OSError:
            pass  # the node gave up on this answer
        finally:
            sent.wait()
        try:
            h.wfile.write(b"x" + tail)
        except OSError:
            pass
    return respond


def test_tool_answers_past_the_nodes_budget_get_an_error_result(world, fresh_node):
    """HOLE (unbounded memory, review of 2026-12-02): upstream MCP answers were buffered (up
    to 16 MiB each, then parsed and serialized again) outside any budget, so 20 concurrent
    calls of a granted tool with a 15 MB result took the node from 58 to 794 MiB. mcp.cc now
    counts every answer against 256 MiB (3x its size); a call past it gets an isError result
    naming node-busy, counted as a refusal, and the budget comes back when calls end."""
    calls, size = 8, 14 * 1024 * 1024  # 8 x 14 MiB x 3 = 336 MiB: 6 fit, the rest do not
    world.mcp.respond = big_tool_answers(world, calls, size)
    try:
        results = [None] * calls

        def one(i):
            results[i] = tool_call(fresh_node.socket_path, READER, "read")

        threads = [threading.Thread(target=one, args=(i,)) for i in range(calls)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        assert all(r is not None and r.status == 200 for r in results), results
        answers = [r.json()["result"] for r in results]
        busy = [a for a in answers if a.get("isError")]
        whole = [a for a in answers if not a.get("isError")]
        assert busy and all("node-busy" in a["content"][0]["text"] for a in busy), busy
        assert whole and all(len(a["content"][0]["text"]) == size for a in whole)
        assert fresh_node.metric('sam_node_refusals_total{reason="node-busy"}') == len(busy)
        # Everything held was given back: a call that fits alone is answered whole again.
        world.mcp.respond = big_tool_answers(world, 1, size)
        again = tool_call(fresh_node.socket_path, READER, "read").json()["result"]
        assert not again.get("isError") and len(again["content"][0]["text"]) == size
    finally:
        world.mcp.respond = mcp_respond(lambda: world.tools)


def test_an_event_stream_longer_than_the_budget_is_answered_when_little_is_held(world, fresh_node):
    """Review of 2026-12-03: SSE bytes were counted as they streamed and given back only when
    the call ended, so a tool that streamed 300 MB of progress events (never more than one
    event held) got node-busy, and held every other agent's calls out while it ran. Events
    judged and dropped are given back at once."""
    fallback = mcp_respond(lambda: world.tools)
    event = ("data: " + json.dumps({"jsonrpc": "2.0", "method": "notifications/progress",
                                    "params": {"progressToken": 1, "progress": 1,
                                               "message": "x" * 60000}}) + "\n\n").encode()

    def respond(h, method, body):
        msg = json.loads(body) if body else {}
        if msg.get("method") != "tools/call":
            return fallback(h, method, body)
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.end_headers()
        for _ in range(300 * 1024 * 1024 // 3 // len(event) + 1):  # > 256 MiB at 3x
            h.wfile.write(event)
        result = {"jsonrpc": "2.0", "id": msg["id"],
                  "result": {"content": [{"type": "text", "text": "done"}]}}
        h.wfile.write(("data: " + json.dumps(result) + "\n\n").encode())
        h.wfile.flush()

    world.mcp.respond = respond
    try:
        r = tool_call(fresh_node.socket_path, READER, "read")
        assert r.status == 200, r.body
        result = r.json()["result"]
        assert not result.get("isError"), result
        assert result["content"][0]["text"] == "done"
        assert fresh_node.metric('sam_node_refusals_total{reason="node-busy"}') == 0
    finally:
        world.mcp.respond = fallback


# ---------------------------------------------------------------------------------------
# Models (/v1)


def test_model_tricks_never_reach_an_ungranted_model_service(sock, world):
    before = len(world.model2.seen)
    for body in ({"model": "chat2"}, {"model": "CHAT2"}, {"model": ["chat2"]},
                 b'{"model": "chat2", "model": "chat"}', b'{"model": "chat", "model": "chat2"}',
                 b'{"model": "chat2\\u0000"}', b"\xff{", deep(1000)):
        r = call(sock, "POST", "/v1/chat/completions", READER,
                 [("Content-Type", "application/json")], body)
        assert r.status == 200
    assert len(world.model2.seen) == before
    r = call(sock, "POST", "/v1/chat/completions", STRANGER, body={"model": "chat"})
    assert r.status == 403 and r.header("Sam-Node-Reason") == "not-granted"


def test_agent_credentials_and_boundary_fields_are_not_forwarded(sock, world):
    call(sock, "POST", "/v1/chat/completions", READER,
         [("Authorization", "Bearer unused"), ("X-Sam-Caller", "admin"), ("x-sam-agent-2", "a"),
          ("Proxy-Authorization", "Basic eA=="), ("Host", "evil.example")], {"model": "chat"})
    _, _, headers, _ = world.model.seen[-1]
    names = [k.lower() for k, _ in headers]
    assert dict((k.lower(), v) for k, v in headers)["authorization"] == "Bearer " + API_KEY
    assert names.count("authorization") == 1 and names.count("host") == 1
    assert not [n for n in names if n.startswith("x-sam") or n == "proxy-authorization"]
    assert dict((k.lower(), v) for k, v in headers)["host"].startswith("127.0.0.1:")


@pytest.mark.parametrize("target", ["/v1/../admin", "/v1/x/../../admin", "/v1/%2e%2e/admin",
                                    "/v1/.%2E/admin", "/v1/..%2fadmin", "/v1/./../admin"])
def test_model_path_stays_under_the_service_base(sock, world, target):
    """HOLE: serveOpenai (openai.cc) appends the raw path to target_url; libcurl resolves "..",
    so /v1/../admin reaches <model host>/admin *with the operator's api_key attached* (and an
    upstream that decodes %2e%2e / %2f before resolving does the same). The node should refuse
    (400) a path with a dot segment or an encoded '.' or '/' in it, in /v1 and /a2a alike."""
    before = len(world.model.seen)
    r = call(sock, "GET", target, READER)
    escaped = [p for p in world.model.paths()[before:] if not _under(p, "/v1/")]
    assert not escaped, f"{target} reached {escaped} (status {r.status})"


def _under(path, base):
    from urllib.parse import unquote
    parts = []
    for seg in unquote(unquote(path.split("?")[0])).split("/"):
        if seg == "..":
            parts = parts[:-1]
        elif seg != ".":
            parts.append(seg)
    return "/".join(parts).startswith(base.rstrip("/"))


def test_hostile_upstream_header_cannot_inject_fields(sock, world, sam_node):  # noqa: F811
    """HOLE: upstream.cc onHeader() keeps a field value with a bare CR, a name with a space and
    an obs-fold line as they came, and ConnWriter::begin (http_server.cc) writes them out:
    "X-Evil: a\\rInjected: b" reaches sam-box and the agent (response splitting for any parser
    that ends a line at CR). The node should drop (or refuse as 502) fields whose name is not a
    token or whose value holds CR, LF or NUL, and unfold or refuse obs-fold (RFC 9112 §5.2)."""
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(4)

    def serve():
        c, _ = lst.accept()
        c.recv(65536)
        c.sendall(b"HTTP/1.1 200 OK\r\nX-Evil: a\rInjected: b\r\nBad Name: v\r\n"
                  b" folded: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        c.close()
    threading.Thread(target=serve, daemon=True).start()
    old, world.model.port = world.model.port, lst.getsockname()[1]
    node = world.make_node(sam_node)
    world.model.port = old
    out = raw(node.socket_path, b"GET /v1/models/x HTTP/1.1\r\nX-Sam-Agent: " + READER.encode()
              + b"\r\nConnection: close\r\n\r\n")
    lst.close()
    head = out.split(b"\r\n\r\n", 1)[0]
    assert b"\r" not in head.replace(b"\r\n", b""), head
    for line in head.split(b"\r\n")[1:]:
        assert line[:1] not in (b" ", b"\t") and b" " not in line.split(b":", 1)[0], head


# ---------------------------------------------------------------------------------------
# MCP (/mcp)


def test_tools_list_shows_only_granted_tools(sock):
    r = mcp(sock, READER, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert [t["name"] for t in r.json()["result"]["tools"]] == ["read"]
    r = mcp(sock, STRANGER, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert r.json()["result"]["tools"] == []


@pytest.mark.parametrize("name", ["delete", "DELETE", "Read", "read ", " read", "read\u0000",
                                  "re\u0430d", "r\u0435ad", "tools/read", "tools/delete",
                                  "delete\u200b", "../delete", "*"])
def test_tool_name_tricks_get_an_error_result_and_reach_nobody(sock, world, name):
    before = list(calls_seen(world.mcp))
    r = tool_call(sock, READER, name)
    assert r.status == 200 and r.json()["result"]["isError"] is True
    assert calls_seen(world.mcp) == before


def test_jsonrpc_tricks_never_call_an_ungranted_tool(sock, world):
    before = list(calls_seen(world.mcp))
    call_delete = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                   "params": {"name": "delete", "arguments": {}}}
    bodies = [
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read","name":"delete"}}',
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"delete"},'
        b'"params":{"name":"read"}}',
        json.dumps([call_delete]).encode(),
        json.dumps([{**call_delete, "params": {"name": "read"}}, call_delete]).encode(),
        *(json.dumps({**call_delete, "id": i}).encode() for i in (None, 1.5, True, {}, [1])),
        json.dumps({**call_delete, "method": "Tools/Call"}).encode(),
        json.dumps({**call_delete, "params": ["delete"]}).encode(),
        json.dumps({**call_delete, "params": {"name": ["delete"]}}).encode(),
        json.dumps({**call_delete, "jsonrpc": "1.0"}).encode(),
        b'{"jsonrpc":"2.0","id":1e999999,"method":"tools/call","params":{"name":"delete"}}',
        b'{"jsonrpc":"2.0","id":123456789012345678901234567890,"method":"ping"}',
    ]
    for body in bodies:
        r = mcp(sock, READER, body)
        assert r.status in (200, 202, 400), body
        if r.status == 200 and "result" in r.json():
            assert r.json()["result"].get("isError") in (True, None), body
    r = mcp(sock, READER, json.dumps(call_delete).encode(), [("MCP-Protocol-Version", "x")])
    assert r.status == 400
    assert "delete" not in calls_seen(world.mcp)[len(before):]
    assert alive(world.node)


def test_granted_tool_call_is_relayed_with_the_callers_own_id(sock, world):
    r = mcp(sock, READER, {"jsonrpc": "2.0", "id": "mine", "method": "tools/call",
                           "params": {"name": "read", "arguments": {"name": "delete"}}})
    assert r.json()["id"] == "mine"
    assert r.json()["result"]["content"][0]["text"] == "called read"
    assert calls_seen(world.mcp)[-1] == "read"


# ---------------------------------------------------------------------------------------
# Agents that serve (/a2a)


@pytest.mark.parametrize("target", ["/a2a/hidden/x", "/a2a/HIDDEN/x", "/a2a/Bar/x", "/a2a/bar./x",
                                    "/a2a/../a2a/hidden/x", "/a2a/./hidden/x", "/a2a//hidden/x",
                                    "/a2a/hidden%2fx", "/a2a/%68idden/x", "/a2a/nope/x",
                                    "/A2A/hidden/x", "/a2a/hidden?x=/a2a/bar/"])
def test_a2a_name_tricks_reach_no_ungranted_agent(sock, world, target):
    before = len(world.a2a.seen)
    r = call(sock, "GET", target, READER)
    assert r.status in (403, 404), (target, r.status)
    assert not [p for p in world.a2a.paths()[before:]
                if not p.startswith("/bar/") and not p.endswith("/agent-card.json")]


@pytest.mark.parametrize("target", ["/a2a/bar/../hidden/x", "/a2a/bar/%2e%2e/hidden/x",
                                    "/a2a/bar/..%2Fhidden/x"])
def test_a2a_path_stays_under_the_agents_base(sock, world, target):
    """HOLE: A2aDirectory::serve (a2a.cc) appends the raw rest of the path to target_url; libcurl
    resolves "..", so an agent granted "bar" (http://host/bar) reaches "hidden" (http://host/hidden)
    on the same host. Refuse dot segments and encoded '.' or '/' (400), as for /v1."""
    before = len(world.a2a.seen)
    call(sock, "GET", target, READER)
    escaped = [p for p in world.a2a.paths()[before:]
               if not _under(p, "/bar/") and not p.endswith("/agent-card.json")]
    assert not escaped, f"{target} reached {escaped}"


def test_a2a_listing_and_card_point_through_the_node(sock):
    assert [a["name"] for a in call(sock, "GET", "/a2a", READER).json()["agents"]] == ["bar"]
    card = call(sock, "GET", "/a2a/bar/.well-known/agent-card.json", READER).json()
    assert card["url"].startswith("http://mesh.sam.alt/a2a/bar")


@pytest.mark.parametrize("target", ["/a2a/bar//.well-known/agent-card.json",
                                    "/a2a/bar/.well-known//agent-card.json",
                                    "/a2a/bar/%2Ewell-known/agent-card.json",
                                    "/a2a/bar/.well-known/agent%2Dcard.json",
                                    "/a2a/bar/.well-known/agent.json",
                                    "/a2a/bar/.well-known/agent-card.json#x",
                                    "/a2a/bar/.well-known;x/agent-card.json",
                                    "/a2a/bar/.well-known/agent-card.json;v=1",
                                    "/a2a/bar/.Well-Known/AGENT-CARD.JSON"])
def test_every_spelling_of_the_card_is_rewritten(sock, target):
    """HOLE (info leak): only GET of exactly .well-known/agent-card.json was rewritten
    (a2a.cc); '//', '%2E' and the legacy agent.json returned the card with the served agent's
    own addresses."""
    r = call(sock, "GET", target, READER)
    if r.status == 200:
        assert "127.0.0.1" not in r.body.decode(), (target, r.body)
        # (the stand-in serves its card at the current name only; at agent.json it answers
        # {"ok": true}, which goes through the card's checks too)
        assert r.json().get("url", "http://mesh.sam.alt/a2a/bar").startswith(
            "http://mesh.sam.alt/a2a/bar"), r.body
    else:
        assert r.status in (400, 404), (target, r.status)


def test_the_card_is_only_read(sock):
    r = call(sock, "POST", "/a2a/bar/.well-known/agent-card.json", READER, body={})
    assert (r.status, r.header("Sam-Node-Reason")) == (405, "method-not-allowed"), r.body


def last_request(upstream, path):
    """The last request to `path`: the card probes of every running node reach the same a2a
    stand-in at any time, so the last request of all may be one of those."""
    return [r for r in upstream.seen if r[1] == path][-1]


def test_served_agent_sees_only_the_true_caller(sock, world):
    call(sock, "POST", "/a2a/bar/rpc", READER,
         [("X-Sam-Caller", "admin.test.example"), ("x-sam-caller", "admin")],
         {"jsonrpc": "2.0"})
    _, _, headers, _ = last_request(world.a2a, "/bar/rpc")
    assert [v for k, v in headers if k.lower() == "x-sam-caller"] == [READER]
    assert not [k for k, _ in headers if k.lower() == "x-sam-agent"]


def test_served_agent_gets_no_underscore_spelling_of_the_caller_field(sock, world):
    """HOLE: forwardableHeaders (proxy.cc) drops names starting with "x-sam-" only. "X_Sam_Caller:
    admin" reaches the served agent, and CGI/WSGI-style servers (HTTP_X_SAM_CALLER) read it
    as X-Sam-Caller. proto/request_rewriter.h already treats '_' as '-' for X-Sam-Agent; the
    node should too: drop every field whose name, '_' read as '-', starts with "x-sam-"."""
    call(sock, "POST", "/a2a/bar/rpc", READER, [("X_Sam_Caller", "admin.test.example")], {})
    _, _, headers, _ = last_request(world.a2a, "/bar/rpc")
    assert [k for k, _ in headers if k.lower().replace("_", "-") == "x-sam-caller"] \
        == ["X-Sam-Caller"]


# ---------------------------------------------------------------------------------------
# secret-use


def use(sock, agent, url, secret="tok", **request):
    return call(sock, "POST", "/ops/secret-use", agent,
                body={"secret": secret, "request": {"url": url, **request}})


def test_secret_comes_back_redacted_from_body_headers_and_status_line(sock, world):
    url = f"http://localhost:{world.echo.port}"
    for path in ("/echo", "/reason"):
        r = use(sock, READER, url + path)
        assert r.status == 200
        assert SECRET not in r.body.decode()
        assert path == "/reason" or "[redacted]" in r.body.decode()
    assert world.echo.seen[-1][2] and dict(world.echo.seen[-1][2])["Authorization"] \
        == "Bearer " + SECRET


def test_secret_use_does_not_follow_redirects(sock, world):
    before = len(world.echo2.seen)
    r = use(sock, READER, f"http://localhost:{world.echo.port}/redirect")
    assert r.json()["status"] == 302
    assert len(world.echo2.seen) == before


def test_secret_use_url_tricks_are_refused_and_send_nothing(sock, world):
    p, p2 = world.echo.port, world.echo2.port
    urls = [f"http://user:pw@localhost:{p}/", f"http://localhost:{p}@localhost:{p2}/",
            f"http://127.0.0.1:{p}/", f"http://[::1]:{p}/", f"http://[::ffff:127.0.0.1]:{p}/",
            f"http://2130706433:{p}/", f"http://0x7f.1:{p}/", f"http://127.1:{p}/",
            f"http://localhost:{p2}/", f"http://localhost/", f"ftp://localhost:{p}/",
            f"file:///etc/passwd", f"gopher://localhost:{p}/", f"http://localhost:{p}\r\nX: y/",
            f"http://localhost.evil:{p}/", f"http://evil/localhost:{p}/", f"//localhost:{p}/",
            f"http://localhost:{p + 65536}/", f"http://loc%61lhost:{p2}/", "http://:{p}/"]
    before = (len(world.echo.seen), len(world.echo2.seen))
    for url in urls:
        r = use(sock, READER, url)
        assert r.status in (400, 403), (url, r.status, r.body)
        assert SECRET not in r.body.decode()
    assert (len(world.echo.seen), len(world.echo2.seen)) == before


def test_secret_use_request_tricks_are_refused(sock, world):
    url = f"http://localhost:{world.echo.port}/echo"
    bad = [{"headers": {"Host": "evil"}}, {"headers": {"host": "evil"}},
           {"headers": {"Authorization": "x"}}, {"headers": {"AUTHORIZATION": "x"}},
           {"headers": {"X-A": "a\r\nHost: evil"}}, {"headers": {"X-A": "a\nb"}},
           {"headers": {"X-A": "a\u0000"}}, {"headers": {"X A": "a"}}, {"headers": {"X:A": "a"}},
           {"headers": {"Transfer-Encoding": "chunked"}}, {"headers": {"Content-Length": "0"}},
           {"headers": {"X-A": 1}}, {"headers": ["X-A", "b"]}, {"method": "GET /x HTTP/1.1\r\n"},
           {"method": "G T"}, {"method": 1}, {"body": {"a": 1}}]
    before = len(world.echo.seen)
    for extra in bad:
        r = use(sock, READER, url, **extra)
        assert r.status == 400 and r.header("Sam-Node-Reason") == "bad-operation-request", extra
    assert len(world.echo.seen) == before


def test_secret_grants_do_not_mix(sock, world):
    before = (len(world.echo.seen), len(world.echo2.seen))
    for agent, secret, port in ((READER, "other", world.echo2.port),
                                (WRITER, "tok", world.echo.port),
                                (WRITER, "other", world.echo.port),
                                (STRANGER, "tok", world.echo.port),
                                (READER, "TOK", world.echo.port),
                                (READER, "nope", world.echo.port)):
        r = use(sock, agent, f"http://localhost:{port}/echo", secret)
        assert r.status == 403 and r.header("Sam-Node-Reason") == "secret-not-granted"
    assert (len(world.echo.seen), len(world.echo2.seen)) == before


def test_secret_use_does_not_reveal_which_secrets_exist(sock, world):
    """HOLE (information): secretUse (ops.cc) checks request.headers against the *declared*
    secret's header before the grant check, so an agent without the grant learns that "tok"
    exists and which header carries it (400 "the field the node fills with the secret"), while an
    undeclared name gets 403. Check the grant first (as a2a.cc does for names): both 403."""
    url = f"http://localhost:{world.echo.port}/echo"
    declared = use(sock, STRANGER, url, "tok", headers={"Authorization": "x"})
    undeclared = use(sock, STRANGER, url, "nope", headers={"Authorization": "x"})
    assert (declared.status, declared.header("Sam-Node-Reason")) == \
        (undeclared.status, undeclared.header("Sam-Node-Reason"))
    # Nor whether a secret allows http: the https rule is checked after the grant.
    plain = use(sock, STRANGER, url, "tls-only")
    assert (plain.status, plain.header("Sam-Node-Reason")) == (403, "secret-not-granted")


def test_secret_goes_over_http_only_when_its_declaration_allows_it(sock, world):
    """A secret without `allow_http: true` is sent to https:// destinations only: over http it
    would cross the network in clear text. "tls-only" is granted to the echo server, which
    speaks plain http: over http the node refuses, over https the TLS handshake fails before
    any request (and so the secret) is sent."""
    before = len(world.echo.seen)
    r = use(sock, READER, f"http://localhost:{world.echo.port}/echo", "tls-only")
    assert (r.status, r.header("Sam-Node-Reason")) == (403, "secret-requires-https"), r.body
    assert "allow_http" in r.json()["error"]["message"]
    r = use(sock, READER, f"https://localhost:{world.echo.port}/echo", "tls-only")
    assert (r.status, r.header("Sam-Node-Reason")) == (502, "destination-failed"), r.body
    assert TLS_SECRET not in r.body.decode()
    assert len(world.echo.seen) == before
    assert TLS_SECRET not in world.node.stderr_text()


# ---------------------------------------------------------------------------------------
# secret-use: where a granted name leads. The nodes run in the test namespace BOX, whose own
# /etc/hosts (conftest.py HOSTS, through `ip netns exec`) points names under example.com at
# loopback, the metadata address, the namespace's own interface and so on; the role grants
# "*.example.com:<port>", a wildcard on a domain whose names lead anywhere. A recorder listens
# on that port on every address of BOX, so whatever a refused request would have reached
# is there to see that nothing came.

FORBIDDEN = {  # name -> the address it resolves to in BOX (conftest.py HOSTS)
    "loopback.example.com": "127.0.0.1",
    "loopback6.example.com": "::1",
    "mapped.example.com": "::ffff:127.0.0.1",  # IPv4-mapped: judged as 127.0.0.1
    "nat64.example.com": "64:ff9b::7f00:1",    # NAT64 (RFC 6052): judged as 127.0.0.1
    "metadata.example.com": "169.254.169.254",
    "linklocal6.example.com": "fe80::1",
    "multicast.example.com": "224.0.0.1",
    "unspecified.example.com": "0.0.0.0",
    "self.example.com": "198.18.0.1",          # BOX's own interface: the node's host
    "self6.example.com": "2001:db8::1",
}


@pytest.fixture(scope="module")
def boxed(topo):
    """The recorder in BOX and two nodes in BOX: `strict` (no allow_destinations) and `loose`
    (allow_destinations 127.0.0.0/8 and ::1/128)."""
    rec = Upstream(echo_respond, netns=topo.box)
    files = pathlib.Path(tempfile.mkdtemp(prefix="sam-node-files-"))
    (files / "tok").write_text(SECRET)
    (files / "tok").chmod(0o600)
    nodes = []
    try:
        for allow in (None, ["127.0.0.0/8", "::1/128"]):
            nodes.append(SamNode(secret_use_config(files, rec.port, allow), netns=topo.box))
            nodes[-1].start()
        yield types.SimpleNamespace(rec=rec, strict=nodes[0], loose=nodes[1])
    finally:
        for node in nodes:
            node.close()
        rec.stop()
        shutil.rmtree(files, ignore_errors=True)


def boxed_use(node, name, port):
    return use(node.socket_path, READER, f"http://{name}:{port}/echo")


def refusal_logs(node):
    return {line["destination"].rsplit(":", 1)[0]: line for line in node.logs()
            if line.get("msg") == "secret-use refused" and line.get("reason") == "forbidden-address"}


def test_granted_name_resolving_into_forbidden_space_gets_no_secret(boxed):
    """HOLE (issue 6): secretUse (ops.cc) checked the grant by name and let libcurl resolve it,
    so a granted name (or any name under a granted wildcard) that resolves to loopback, the
    metadata address or the node's own host received the secret. The node now resolves the
    name itself and refuses such an address (403 forbidden-address), as sam-box does."""
    rec, node = boxed.rec, boxed.strict
    rec.seen.clear()
    metric = 'sam_node_refusals_total{reason="forbidden-address"}'
    before = node.metric(metric)
    for name in FORBIDDEN:
        r = boxed_use(node, name, rec.port)
        assert (r.status, r.header("Sam-Node-Reason")) == (403, "forbidden-address"), \
            (name, r.status, r.body)
        assert SECRET not in r.body.decode()
    assert rec.seen == []
    assert node.metric(metric) - before == len(FORBIDDEN)
    logged = refusal_logs(node)
    for name, address in FORBIDDEN.items():
        assert logged[name]["address"] == address and logged[name]["caller"] == READER
    assert SECRET not in node.stderr_text()


def test_allow_destinations_lifts_the_refusal_for_its_prefixes_only(boxed):
    """With allow_destinations [127.0.0.0/8, ::1/128] the same grant reaches loopback, also
    through an IPv4-mapped address, with the secret; every other forbidden address is still
    refused, the node's own interface included."""
    rec, node = boxed.rec, boxed.loose
    for name in ("loopback.example.com", "loopback6.example.com", "mapped.example.com"):
        rec.seen.clear()
        r = boxed_use(node, name, rec.port)
        assert r.status == 200 and r.json()["status"] == 200, (name, r.body)
        assert SECRET not in r.body.decode()
        assert len(rec.seen) == 1
        headers = dict(rec.seen[0][2])
        assert headers["Authorization"] == "Bearer " + SECRET
        assert headers["Host"] == f"{name}:{rec.port}"
    rec.seen.clear()
    for name in ("metadata.example.com", "linklocal6.example.com", "multicast.example.com",
                 "unspecified.example.com", "self.example.com", "self6.example.com"):
        r = boxed_use(node, name, rec.port)
        assert (r.status, r.header("Sam-Node-Reason")) == (403, "forbidden-address"), \
            (name, r.status, r.body)
    assert rec.seen == []


def test_granted_name_that_does_not_resolve_fails_and_sends_nothing(boxed):
    """A name under the wildcard that resolves nowhere (BOX's resolver is a closed port on
    its own loopback): 502 destination-failed, saying so."""
    rec, node = boxed.rec, boxed.strict
    rec.seen.clear()
    r = boxed_use(node, "nowhere.example.com", rec.port)
    assert (r.status, r.header("Sam-Node-Reason")) == (502, "destination-failed"), r.body
    assert "cannot resolve nowhere.example.com" in r.json()["error"]["message"]
    assert rec.seen == []


# ---------------------------------------------------------------------------------------
# spawn


def test_spawn_runs_only_granted_templates_as_configured(sock, world):
    files = world.node.files
    r = call(sock, "POST", "/ops/spawn", READER,
             body={"template": "ok", "bundle": "/etc/shadow", "command": ["sh", "-c", "id"],
                   "backend": "host", "args": ["--privileged"]})
    assert r.status == 200, r.body
    argv = wait_for(lambda: [f.read_text().split("\n") for f in files.glob("argv.*")],
                    timeout=10, what="argv")
    assert argv[0][:7] == ["run", "--backend", "podman", "--bundle", "/nonexistent/ok.yaml",
                           "--", "echo"]
    for agent, body in ((READER, {"template": "forbidden"}), (READER, {"template": "OK"}),
                        (READER, {"template": "ok\u0000"}), (WRITER, {"template": "ok"}),
                        (STRANGER, {"template": "ok"})):
        r = call(sock, "POST", "/ops/spawn", agent, body=body)
        assert r.status == 403 and r.header("Sam-Node-Reason") == "spawn-not-granted"
    for body in ({"template": ["ok"]}, {}, [], b"{", b'{"template":"ok"}x'):
        assert call(sock, "POST", "/ops/spawn", READER, body=body).status == 400
    assert call(sock, "GET", "/ops/spawn", READER).status == 405
    assert len(list(files.glob("argv.*"))) == 1


def test_pending_spawns_are_capped_per_agent_and_per_node(fresh_node):
    """A spawn holds a connection thread until the runner reports its agent running (up to
    60 s): at most 2 per agent and 4 per node wait at once (kMaxPendingSpawnsPerAgent,
    kMaxPendingSpawns in spawn_child.h); more get 429 spawn-busy and start no runner."""
    files, sock_path = fresh_node.files, fresh_node.socket_path
    replies = {}

    def spawn(agent, key):
        replies[key] = call(sock_path, "POST", "/ops/spawn", agent, body={"template": "slow"},
                            timeout=60)

    agents = [READER, READER, WRITER, WRITER]
    threads = [threading.Thread(target=spawn, args=(a, i)) for i, a in enumerate(agents)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(list(files.glob("argv.*"))) == 4, timeout=20,
                 what="four runners waiting for the release file")
        mine = call(sock_path, "POST", "/ops/spawn", READER, body={"template": "slow"})
        assert (mine.status, mine.header("Sam-Node-Reason")) == (429, "spawn-busy"), mine.body
        assert "already has 2 spawns" in mine.json()["error"]["message"]
        node_wide = call(sock_path, "POST", "/ops/spawn", "w2.writers.example",
                         body={"template": "slow"})
        assert (node_wide.status, node_wide.header("Sam-Node-Reason")) == (429, "spawn-busy")
        assert "the node already has 4" in node_wide.json()["error"]["message"]
        assert len(list(files.glob("argv.*"))) == 4  # the refused ones started nothing
        assert fresh_node.metric('sam_node_refusals_total{reason="spawn-busy"}') == 2
    finally:
        (files / "release").touch()
        for t in threads:
            t.join(60)
    assert [replies[i].status for i in range(4)] == [200] * 4
    # Answered spawns give their slots back.
    assert call(sock_path, "POST", "/ops/spawn", READER, body={"template": "slow"}).status == 200
