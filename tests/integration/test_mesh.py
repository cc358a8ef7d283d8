"""The mesh entrypoint: CONNECT mesh.sam.alt:80, then plain HTTP/1.1 forwarded to the node
API socket (--sidecar-socket) with X-Sam-Agent set by the boundary and every copy the sandbox
sent removed."""

import hashlib
import json
import os
import pathlib
import time

import pytest

from boxlib import AGENT_ID, STD_ALLOW, SamBox, bundle_yaml, wait_for


def agent_headers(rec):
    return [v for k, v in rec["headers"] if k.lower() == "x-sam-agent"]


def open_mesh(box, authority="mesh.sam.alt:80"):
    resp, c = box.tunnel(authority)
    assert resp.status == 200, f"CONNECT {authority}: {resp}"
    return c


def request(method, path, headers=(), body=b""):
    lines = [f"{method} {path} HTTP/1.1", "Host: mesh.sam.alt"]
    lines += list(headers)
    if body or method in ("POST", "PUT"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def read_echo(c):
    resp, body = c.read_http_response()
    assert resp.status == 200, resp
    return json.loads(body)


SPOOFS = {
    "none": [],
    "canonical": ["X-Sam-Agent: evil.prod.acme.example"],
    "lower": ["x-sam-agent: evil.prod.acme.example"],
    "upper": ["X-SAM-AGENT: evil.prod.acme.example"],
    "mixed": ["x-SaM-aGeNt: evil.prod.acme.example"],
    "twice": ["X-Sam-Agent: evil-1", "x-sam-agent: evil-2"],
    "list": [f"X-Sam-Agent: {AGENT_ID}, evil.prod.acme.example"],
    "own-id": [f"X-Sam-Agent: {AGENT_ID}"],
    "empty": ["X-Sam-Agent:"],
    "padded": ["X-Sam-Agent: \t evil \t"],
    "among-others": ["Accept: */*", "X-Sam-Agent: evil", "User-Agent: test",
                     "X-Sam-Agent-Extra: kept"],
}


@pytest.mark.parametrize("spoof", list(SPOOFS), ids=list(SPOOFS))
def test_x_sam_agent_is_set_by_the_boundary(box, sidecar, spoof):
    c = open_mesh(box)
    c.send(request("GET", f"/v1/models?case={spoof}", SPOOFS[spoof]))
    rec = read_echo(c)
    c.close()
    assert rec["path"] == f"/v1/models?case={spoof}"
    assert agent_headers(rec) == [AGENT_ID], rec["headers"]
    if spoof == "among-others":
        names = [k.lower() for k, _ in rec["headers"]]
        assert "x-sam-agent-extra" in names and "user-agent" in names, rec["headers"]


def test_pipelined_keep_alive_requests_and_post_body(box, sidecar):
    body = os.urandom(100_000)
    c = open_mesh(box)
    c.send(request("GET", "/one", ["X-Sam-Agent: evil"])
           + request("POST", "/two", ["x-sam-agent: evil", "Content-Type: application/json"],
                     body)
           + request("GET", "/three", ["X-SAM-AGENT: evil", "X-Sam-Agent: evil2"]))
    one, two, three = read_echo(c), read_echo(c), read_echo(c)
    assert [one["path"], two["path"], three["path"]] == ["/one", "/two", "/three"]
    for rec in (one, two, three):
        assert agent_headers(rec) == [AGENT_ID], rec["headers"]
    assert two["method"] == "POST"
    assert two["body_len"] == len(body)
    assert two["body_sha256"] == hashlib.sha256(body).hexdigest()
    # The same tunnel keeps working for a later, non-pipelined request.
    c.send(request("GET", "/four", ["X-Sam-Agent: late"]))
    four = read_echo(c)
    assert four["path"] == "/four" and agent_headers(four) == [AGENT_ID]
    c.close()


def test_request_split_across_writes(box, sidecar):
    c = open_mesh(box)
    raw = request("POST", "/split", ["X-Sam-Agent: evil"], b"0123456789")
    for i in range(0, len(raw), 7):
        c.send(raw[i:i + 7])
    rec = read_echo(c)
    c.close()
    assert rec["path"] == "/split" and agent_headers(rec) == [AGENT_ID]
    assert rec["body_len"] == 10


@pytest.mark.parametrize("authority", ["MESH.SAM.ALT:80", "mesh.sam.alt.:80"])
def test_mesh_name_is_normalized(box, sidecar, authority):
    c = open_mesh(box, authority)
    c.send(request("GET", "/n"))
    assert agent_headers(read_echo(c)) == [AGENT_ID]
    c.close()


def test_mesh_entrypoint_is_logged(box, sidecar):
    mark = box.mark()
    c = open_mesh(box)
    c.send(request("GET", "/logged"))
    read_echo(c)
    c.close()
    log = box.wait_flow_log(since=mark, route="mesh-entrypoint", outcome="allowed")
    assert log["agent"] == AGENT_ID and log["port"] == 80, log


def test_mesh_on_another_port_is_refused(box):
    resp = box.refused("mesh.sam.alt:443")
    assert resp.status == 403 and resp.reason, resp


def test_malformed_request_inside_the_mesh_tunnel_never_reaches_the_node(box, sidecar):
    n = len(sidecar.records)
    c = open_mesh(box)
    c.send(b"GARBAGE \x00\x01 NOT HTTP\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n")
    data = c.read_until_eof()
    c.close()
    assert len(sidecar.records) == n, sidecar.records[n:]
    assert data == b"" or data.startswith(b"HTTP/1.1 4"), data


@pytest.fixture
def metered_box(topo, sidecar):
    """The standard box with --metrics-addr."""
    b = SamBox(topo, bundle=bundle_yaml(allow=STD_ALLOW), metrics=True,
               args=["--insecure-unverified-bundle", "--sidecar-socket", sidecar.path])
    b.start()
    yield b
    b.kill()


@pytest.mark.parametrize("case", ["oversized", "malformed"])
def test_a_refused_first_request_is_answered_and_never_reaches_the_node(metered_box, sidecar,
                                                                        case):
    # Nothing of the tunnel reached the node, so the boundary can answer in its place.
    box = metered_box
    if case == "oversized":
        payload = request("GET", "/big", [f"X-Pad: {'a' * 9000}", "Connection: close"])
        status, reason = 431, "header-too-large"
    else:
        payload = b"GET /odd HTTP/1.1\r\nHost: mesh.sam.alt\r\nBad Name: x\r\n\r\n"
        status, reason = 400, "malformed-request"
    before = box.metrics().get("sam_box_refusals_total", reason=reason)
    n = len(sidecar.records)
    c = open_mesh(box)
    c.send(payload)
    resp, _ = c.read_http_response()
    assert c.is_closed(), "the tunnel stays open after the refusal"
    c.close()
    assert (resp.status, resp.header("boundary-reason")) == (status, reason), resp
    assert len(sidecar.records) == n, sidecar.records[n:]
    assert box.metrics().get("sam_box_refusals_total", reason=reason) == before + 1


def test_egress_only_box_asserts_no_identity(sam_box, sidecar):
    b = sam_box(args=["--egress-allow", "api.example.com", "--sidecar-socket", sidecar.path])
    n = len(sidecar.records)
    mark = b.mark()
    resp = b.refused("mesh.sam.alt:80")
    assert resp.status == 403 and resp.reason == "no-agent-identity", resp
    assert len(sidecar.records) == n
    log = b.wait_flow_log(since=mark, reason="no-agent-identity")
    assert log["outcome"] == "denied", log
    resp, c = b.tunnel("api.example.com:80")
    assert resp.status == 200, resp
    c.close()


def test_sidecar_down_is_502_node_unavailable(sam_box, topo):
    missing = str(pathlib.Path(topo.tmp) / "no-node.sock")
    b = sam_box(bundle=bundle_yaml(allow=STD_ALLOW),
                args=["--insecure-unverified-bundle", "--sidecar-socket", missing])
    resp, c = b.tunnel("mesh.sam.alt:80")
    if resp.status == 200:
        # The boundary may accept the tunnel first and fail the request.
        c.send(request("GET", "/v1/models"))
        resp = c.read_head()
    c.close()
    assert resp.status == 502 and resp.reason == "node-unavailable", resp


def test_sidecar_sees_requests_from_many_tunnels(box, sidecar):
    n = len(sidecar.records)
    for i in range(10):
        c = open_mesh(box)
        c.send(request("GET", f"/many/{i}", [f"X-Sam-Agent: spoof-{i}"]))
        assert agent_headers(read_echo(c)) == [AGENT_ID]
        c.close()
    wait_for(lambda: len(sidecar.records) >= n + 10, what="sidecar records")
    assert all(agent_headers(r) == [AGENT_ID] for r in sidecar.records[n:])



def test_streamed_response_is_not_buffered(box, sidecar):
    sidecar.server.stream_gate.clear()
    c = open_mesh(box)
    try:
        c.send(request("GET", "/stream", ["Accept: text/event-stream"]))
        resp = c.read_head()
        assert resp.status == 200, resp
        assert (resp.header("Transfer-Encoding") or "").lower() == "chunked", resp
        # The first event must arrive while the node is still holding the response open.
        c.sock.settimeout(5)  # the node holds the rest for 10 s: a buffering box times out
        while b"data: first" not in c.buf:
            assert c._fill(), f"closed before the first event: {c.buf!r}"
        assert not sidecar.server.stream_gate.is_set()
        sidecar.server.stream_gate.set()
        while not c.buf.endswith(b"0\r\n\r\n"):
            assert c._fill(), f"closed mid-stream: {c.buf!r}"
        assert b"data: second" in c.buf
    finally:
        sidecar.server.stream_gate.set()
        c.close()


def test_chunked_request_body_is_forwarded(box, sidecar):
    body = os.urandom(50_000)
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 7000]), body[i:i + 7000])
                      for i in range(0, len(body), 7000)) + b"0\r\n\r\n"
    c = open_mesh(box)
    c.send(b"POST /chunked HTTP/1.1\r\nHost: mesh.sam.alt\r\nX-Sam-Agent: evil\r\n"
           b"Transfer-Encoding: chunked\r\n\r\n" + chunks
           + request("GET", "/after-chunked", ["x-sam-agent: evil"]))
    rec = read_echo(c)
    assert rec["path"] == "/chunked" and agent_headers(rec) == [AGENT_ID]
    assert rec["body_sha256"] == hashlib.sha256(body).hexdigest()
    after = read_echo(c)
    assert after["path"] == "/after-chunked" and agent_headers(after) == [AGENT_ID]
    c.close()


def test_body_that_looks_like_a_request_is_not_rewritten(box, sidecar):
    body = (b"\r\n\r\nGET /inner HTTP/1.1\r\nHost: mesh.sam.alt\r\n"
            b"X-Sam-Agent: evil.prod.acme.example\r\n\r\n")
    c = open_mesh(box)
    c.send(request("POST", "/outer", ["X-Sam-Agent: evil"], body))
    rec = read_echo(c)
    c.close()
    assert rec["path"] == "/outer" and agent_headers(rec) == [AGENT_ID]
    assert rec["body_len"] == len(body)
    assert rec["body_sha256"] == hashlib.sha256(body).hexdigest()


@pytest.mark.parametrize("line", [b"X-Sam-Agent : evil", b"X-Sam-Agent\t: evil",
                                  b" X-Sam-Agent: evil", b"X-Sam-Agent\x00: evil"],
                         ids=["space-before-colon", "tab-before-colon", "leading-space",
                              "nul-in-name"])
def test_malformed_agent_header_never_reaches_the_node_as_an_agent(box, sidecar, line):
    n = len(sidecar.records)
    c = open_mesh(box)
    c.send(b"GET /odd HTTP/1.1\r\nHost: mesh.sam.alt\r\nConnection: close\r\n" + line
           + b"\r\n\r\n")
    c.sock.settimeout(5)
    try:
        c.read_until_eof()  # a 400 and a close, or the node's answer: either is fine
    except OSError:
        pass
    c.close()
    # What matters: no header the node saw that reads as X-Sam-Agent carried the spoof.
    for rec in sidecar.records[n:]:
        for k, v in rec["headers"]:
            if k.strip().strip("\x00").lower().startswith("x-sam-agent"):
                assert v == AGENT_ID, (line, rec["headers"])


# --- hostile streams found in review: none may make the node see another agent ---

SPOOF = "ceo-assistant.prod.acme.example"


def _node_never_sees_spoof(box, sidecar, payload):
    n = len(sidecar.records)
    c = open_mesh(box)
    c.send(payload)
    c.read_until_eof()
    c.close()
    # Let any smuggled request reach the node before looking.
    time.sleep(0.3)
    for rec in sidecar.records[n:]:
        agents = [v for k, v in rec["headers"] if k.lower().replace("_", "-") == "x-sam-agent"]
        assert agents == [AGENT_ID], rec


def test_space_before_colon_cannot_smuggle_an_identity(box, sidecar):
    smuggled = (f"GET /smuggled HTTP/1.1\r\nHost: mesh.sam.alt\r\nX-Sam-Agent: {SPOOF}\r\n"
                "Content-Length: 0\r\n\r\n").encode()
    payload = (b"POST /first HTTP/1.1\r\nHost: mesh.sam.alt\r\nX-Pad : x\r\n"
               b"Content-Length: %d\r\n\r\n" % len(smuggled)) + smuggled
    _node_never_sees_spoof(box, sidecar, payload)


def test_declined_upgrade_cannot_switch_off_rewriting(box, sidecar):
    for upgrade in (b"Connection: Upgrade\r\nUpgrade: websocket\r\n", b"Upgrade: h2c\r\n"):
        payload = (b"GET /first HTTP/1.1\r\nHost: mesh.sam.alt\r\n" + upgrade + b"\r\n" +
                   f"GET /smuggled HTTP/1.1\r\nHost: mesh.sam.alt\r\nX-Sam-Agent: {SPOOF}\r\n\r\n"
                   .encode())
        _node_never_sees_spoof(box, sidecar, payload)


def test_connect_inside_the_mesh_tunnel_is_refused(box, sidecar):
    payload = (b"CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example\r\n\r\n" +
               f"GET /smuggled HTTP/1.1\r\nX-Sam-Agent: {SPOOF}\r\n\r\n".encode())
    n = len(sidecar.records)
    _node_never_sees_spoof(box, sidecar, payload)
    assert len(sidecar.records) == n


def test_underscore_and_trailer_spellings_are_not_forwarded(box, sidecar):
    _node_never_sees_spoof(
        box, sidecar, request("GET", "/u", [f"X_Sam_Agent: {SPOOF}", "Connection: close"]))
    _node_never_sees_spoof(
        box, sidecar,
        b"POST /t HTTP/1.1\r\nHost: mesh.sam.alt\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3\r\nabc\r\n0\r\n" + f"X-Sam-Agent: {SPOOF}\r\n\r\n".encode())
