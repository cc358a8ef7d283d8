"""CONNECT tunnels through sam-box: allowed and refused names, name normalization, IP
literals, ports, address families, forbidden addresses, upstream failures, malformed
requests, logs, metrics and concurrency."""

import concurrent.futures
import functools
import hashlib
import http.server
import json
import os
import socket
import ssl
import threading
import time

import pytest

import boxlib
from boxlib import AGENT_ID, STD_ALLOW, SamBox, bundle_yaml, delta, http_get, wait_for

FLOW_KEYS = {"agent", "name", "port", "route", "outcome", "reason", "bytes_up", "bytes_down",
             "duration_ms"}


def assert_established(resp, what):
    assert resp.status == 200, f"{what}: want 200, got {resp}"
    assert resp.phrase == "Connection Established", f"{what}: {resp}"


def get_through(box, authority, path="/small.txt", host=None):
    resp, c = box.tunnel(authority)
    try:
        assert_established(resp, f"CONNECT {authority}")
        return http_get(c, path, host or authority)
    finally:
        c.close()


# ---------------------------------------------------------------------------------------
# Allowed names


def test_allowed_name_http_is_byte_exact(box, topo):
    mark = box.mark()
    resp, c = box.tunnel("api.example.com:80")
    assert_established(resp, "CONNECT api.example.com:80")
    r, body = http_get(c, "/big.bin", "api.example.com")
    c.close()
    assert r.status == 200
    assert len(body) == topo.big_len
    assert hashlib.sha256(body).hexdigest() == topo.big_sha256

    log = box.wait_flow_log(since=mark, name="api.example.com", outcome="allowed")
    assert FLOW_KEYS <= set(log), f"flow log lacks {FLOW_KEYS - set(log)}: {log}"
    assert log["agent"] == AGENT_ID
    assert log["port"] == 80
    assert log["route"] == "external"
    assert log["reason"] in ("", None), log
    assert log["bytes_down"] >= topo.big_len, log
    assert log["bytes_up"] > 0, log
    assert isinstance(log["duration_ms"], (int, float)) and log["duration_ms"] >= 0, log


def test_head_split_across_reads_with_early_data_after_it(box, topo):
    # The head's first part is read at once, the rest by a read that waits, and that read also
    # brings the agent's first bytes for the upstream: they must arrive whole and in order.
    for split in (10, 40):
        head = b"CONNECT api.example.com:80 HTTP/1.1\r\nHost: api.example.com:80\r\n\r\n"
        early = b"GET /small.txt HTTP/1.1\r\nHost: api.example.com\r\nConnection: close\r\n\r\n"
        c = box.connect(10.0)
        try:
            c.send(head[:split])
            time.sleep(0.05)  # not readiness: lets sam-box read the first part on its own
            c.send(head[split:] + early)
            resp = c.read_head()
            assert_established(resp, f"split at {split}")
            r, body = c.read_http_response()
            assert r.status == 200 and body == b"hello from upstream\n", (split, r, body)
        finally:
            c.close()


def test_allowed_name_tls(box, topo):
    resp, c = box.tunnel("api.example.com:443")
    assert_established(resp, "CONNECT api.example.com:443")
    assert c.buf == b"", f"bytes after the 200 head before the client spoke: {c.buf!r}"
    ctx = ssl.create_default_context(cafile=topo.ca)
    tls = ctx.wrap_socket(c.sock, server_hostname="api.example.com")
    assert tls.version() is not None
    cert = tls.getpeercert()
    assert ("DNS", "api.example.com") in cert["subjectAltName"]
    t = boxlib.Conn(tls)
    r, body = http_get(t, "/big.bin", "api.example.com")
    t.close()
    assert r.status == 200
    assert hashlib.sha256(body).hexdigest() == topo.big_sha256


@pytest.mark.parametrize("authority", ["files.pypi.org:80", "a.b.pypi.org:80",
                                       "a.b.pypi.org:8080"])
def test_wildcard_matches_subdomains_at_any_depth(box, authority):
    r, body = get_through(box, authority)
    assert r.status == 200 and body == b"hello from upstream\n"


@pytest.mark.parametrize("authority", ["pypi.org:80", "evilpypi.org:80", "pypi.org.:443",
                                       "other.example.com:80", "example.com:80",
                                       "api.example.com.evil.org:80"])
def test_names_not_in_the_allowlist_are_refused(box, authority):
    mark = box.mark()
    resp = box.refused(authority)
    assert resp.status == 403, resp
    assert resp.phrase == "Forbidden", resp
    assert resp.reason == "not-allowlisted", resp
    log = box.wait_flow_log(since=mark, outcome="denied")
    assert log["reason"] == "not-allowlisted", log
    assert log["route"] == "external", log


@pytest.mark.parametrize("authority", ["Api.Example.COM:80", "api.example.com.:80",
                                       "API.EXAMPLE.COM.:80", "FILES.PyPI.org.:80"])
def test_names_are_lower_cased_and_one_trailing_dot_dropped(box, authority):
    mark = box.mark()
    r, body = get_through(box, authority, host="api.example.com")
    assert r.status == 200 and body == b"hello from upstream\n"
    want = authority.rsplit(":", 1)[0].lower().rstrip(".")
    box.wait_flow_log(since=mark, name=want, outcome="allowed")


@pytest.mark.parametrize("authority", ["api.example.com..:80", "bad_name.example.com:80",
                                       "-lead.example.com:80", "a..b.example.com:80",
                                       "*.pypi.org:80", ("a" * 64) + ".example.com:80",
                                       ".".join(["abcdefgh"] * 29) + ".com:80"])
def test_invalid_names_are_refused(box, authority):
    resp = box.refused(authority)
    assert resp.status == 403 and resp.reason == "invalid-name", resp


def test_non_ascii_name_is_refused(box):
    c = box.raw("CONNECT bücher.example.com:80 HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    resp = c.read_head()
    assert (resp.status, resp.reason) in ((403, "invalid-name"), (400, "malformed-request")), \
        resp
    assert c.is_closed()


# ---------------------------------------------------------------------------------------
# IP literals: never matched by a name rule, whatever their spelling

IP_LITERALS = ["198.18.0.2:80", "[2001:db8::2]:80", "3323068418:80", "0xc6120002:80",
               "0306.022.0.2:80", "198.18.2:80", "[::ffff:198.18.0.2]:80", "0xC6.0x12.0.2:80",
               "127.0.0.1:80", "[::1]:80"]


def test_ip_literals_in_every_spelling_are_unresolved(box):
    before = box.metrics()
    for authority in IP_LITERALS:
        resp = box.refused(authority)
        assert resp.status == 403 and resp.reason == "unresolved-address", \
            f"CONNECT {authority}: {resp}"
    after = wait_for(lambda: _settled(box, before, len(IP_LITERALS)), what="metrics")
    assert delta(before, after, "sam_box_flows_total", outcome="denied",
                 route="unresolved") == len(IP_LITERALS)
    assert delta(before, after, "sam_box_refusals_total",
                 reason="unresolved-address") == len(IP_LITERALS)
    assert delta(before, after, "sam_box_flows_total", outcome="allowed",
                 route="external") == 0


def _settled(box, before, n):
    m = box.metrics()
    if delta(before, m, "sam_box_flows_total", outcome="denied", route="unresolved") >= n:
        return m
    return None


def test_ip_literal_as_an_allow_entry_never_matches(topo):
    """--egress-allow 198.18.0.2 either refuses to start or never lets the literal through."""
    b = SamBox(topo, args=["--egress-allow", "198.18.0.2"])
    b.spawn()
    wait_for(lambda: (b.proc.poll() is not None) or _accepts(b.socket_path),
             timeout=10, what="start or exit")
    try:
        if b.proc.poll() is not None:
            assert b.proc.returncode != 0
            assert "egress" in b.stderr_text().lower(), b.stderr_text()
            return
        resp = b.refused("198.18.0.2:80")
        assert resp.status == 403 and resp.reason == "unresolved-address", resp
    finally:
        b.kill()


def _accepts(path):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


# ---------------------------------------------------------------------------------------
# Ports and address families


def test_host_port_entry_restricts_the_port(box):
    r, body = get_through(box, "dual.example.com:80", path="/port")
    assert r.status == 200 and body.strip() == b"80"
    resp = box.refused("dual.example.com:8080")
    assert resp.status == 403 and resp.reason == "not-allowlisted", resp
    resp = box.refused("dual.example.com:443")
    assert resp.status == 403 and resp.reason == "not-allowlisted", resp


def test_bare_host_allows_any_port(box):
    for port in (80, 8080):
        r, body = get_through(box, f"api.example.com:{port}", path="/port")
        assert r.status == 200 and body.strip() == str(port).encode()


@pytest.mark.parametrize("authority", ["dual.example.com:80", "v6only.example.com:8080"])
def test_names_with_aaaa_reach_the_v6_upstream(box, authority):
    r, body = get_through(box, authority, path="/peer")
    assert r.status == 200
    assert body.strip() == b"2001:db8::1", f"upstream saw peer {body!r}, want IPv6"


# ---------------------------------------------------------------------------------------
# Forbidden addresses: an allowed name must not become a way into the host's own services

FORBIDDEN = ["loopback.example.com", "loopback6.example.com", "metadata.example.com",
             "mapped.example.com", "linklocal6.example.com", "multicast.example.com",
             "unspecified.example.com",
             # the boundary host's own interface addresses (v4 and v6), and loopback
             # embedded in the NAT64 well-known prefix
             "self.example.com", "self6.example.com", "nat64.example.com"]


@pytest.mark.parametrize("name", FORBIDDEN)
def test_allowed_name_resolving_to_forbidden_space_is_refused(box, name):
    # Twice: the second flow gets the name's answer from sam-box's resolve cache, and every
    # address of it is judged again.
    for attempt in range(2):
        mark = box.mark()
        resp = box.refused(f"{name}:80")
        assert resp.status == 403 and resp.reason == "forbidden-address", (attempt, resp)
        log = box.wait_flow_log(since=mark, outcome="denied")
        assert log["reason"] == "forbidden-address", (attempt, log)


@pytest.fixture
def flip_name(topo):
    """A name whose hosts-file line the test may rewrite (in place: the file is bind-mounted
    into BOX's namespace). Restored afterwards."""
    hosts = topo.etc / "hosts"
    original = hosts.read_text()

    def point_to(address):
        with open(hosts, "r+") as f:
            f.write(original + f"{address} flip.example.com\n")
            f.truncate()

    point_to("198.18.0.2")
    yield point_to
    with open(hosts, "r+") as f:
        f.write(original)
        f.truncate()


@pytest.mark.parametrize("ttl", ["0", "5"])
def test_resolve_cache_reuses_an_answer_for_its_ttl_only(sam_box, flip_name, ttl):
    # The name moves into forbidden space. With the cache off the next flow is refused at
    # once; with it on, flows keep the answer they had for up to the TTL, then see the move.
    b = sam_box(args=["--egress-allow", "flip.example.com", "--resolve-cache-ttl", ttl])
    r, body = get_through(b, "flip.example.com:80")
    assert r.status == 200
    flip_name("127.0.0.1")
    if ttl == "5":
        r, body = get_through(b, "flip.example.com:80")
        assert r.status == 200, "the answer of the first flow is reused within the TTL"
        time.sleep(5.2)
    resp = b.refused("flip.example.com:80")
    assert resp.status == 403 and resp.reason == "forbidden-address", resp


@pytest.mark.parametrize("allow", [[], ["--allow-destination", "127.0.0.0/8"]])
def test_6to4_form_of_loopback_is_refused(sam_box, flip_name, allow):
    # 2002:7f00:1:: is 6to4 for 127.0.0.1 (RFC 3056): judged by the IPv4 address inside it,
    # and an allowed IPv4 prefix does not reach into its 6to4 form.
    flip_name("2002:7f00:1::")
    b = sam_box(args=["--egress-allow", "flip.example.com", *allow])
    mark = b.mark()
    resp = b.refused("flip.example.com:80")
    assert resp.status == 403 and resp.reason == "forbidden-address", resp
    log = b.wait_flow_log(since=mark, outcome="denied")
    assert log["reason"] == "forbidden-address" and log["address"] == "2002:7f00:1::", log


class _MarkerHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def do_GET(self):  # noqa: N802
        body = b"box-loopback-service\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def serve_in_netns(ns, host, handler):
    """An HTTP server on host:0 inside namespace ns; returns (server, port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    cls = type("S", (http.server.ThreadingHTTPServer,), {"address_family": family,
                                                         "daemon_threads": True})
    srv = cls((host, 0), handler, bind_and_activate=False)
    srv.socket.close()
    srv.socket = boxlib.netns_socket(ns, family)
    srv.server_bind()
    srv.server_activate()
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, srv.server_address[1]


def test_allow_destination_permits_a_forbidden_range(sam_box, topo):
    srv, port = serve_in_netns(topo.box, "127.0.0.1", _MarkerHandler)
    try:
        b = sam_box(args=["--egress-allow", "loopback.example.com",
                          "--egress-allow", "metadata.example.com",
                          "--allow-destination", "127.0.0.0/8"])
        r, body = get_through(b, f"loopback.example.com:{port}", path="/")
        assert r.status == 200 and body == b"box-loopback-service\n"
        resp = b.refused("metadata.example.com:80")
        assert resp.status == 403 and resp.reason == "forbidden-address", resp
        # The CIDR permits a resolved address, never an IP literal.
        resp = b.refused(f"127.0.0.1:{port}")
        assert resp.status == 403 and resp.reason == "unresolved-address", resp
    finally:
        srv.shutdown()
        srv.server_close()


# ---------------------------------------------------------------------------------------
# Upstream failures


def test_unresolvable_allowed_name_is_502_resolve_failed(box):
    mark = box.mark()
    resp = box.refused("nowhere.example.com:80")
    assert resp.status == 502 and resp.reason == "resolve-failed", resp
    # The log says why the lookup failed (a name problem, or e.g. "System error: Too many
    # open files", which is not one).
    line = box.wait_flow_log(mark, name="nowhere.example.com", reason="resolve-failed")
    assert line.get("detail"), line


def test_closed_port_is_502_connect_failed(box):
    mark = box.mark()
    resp = box.refused("api.example.com:81")
    assert resp.status == 502 and resp.reason == "connect-failed", resp
    # The line names the address that refused and why.
    line = box.wait_flow_log(mark, name="api.example.com", reason="connect-failed")
    assert line.get("address") == "198.18.0.2" and line.get("detail"), line


def test_black_hole_is_504_connect_timeout(box):
    before = box.metrics()
    resp, c = box.tunnel("blackhole.example.com:80", timeout=30)
    assert resp.status == 504 and resp.reason == "connect-timeout", resp
    assert c.is_closed()
    c.close()
    after = box.metrics()
    assert delta(before, after, "sam_box_limit_hits_total", limit="connect-timeout") == 1


# ---------------------------------------------------------------------------------------
# Malformed, oversized and foreign requests


@pytest.mark.parametrize("data", [
    b"GARBAGE\r\n\r\n",
    b"\x00\x01\x02\xff\xfe\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(32)) + b"\r\n\r\n",
    b"CONNECT api.example.com HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
    b"CONNECT api.example.com:99999 HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
    b"CONNECT api.example.com:0 HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
    b"CONNECT api.example.com:80 HTTP/1.1\r\nHost api.example.com\r\n\r\n",
    b"CONNECT api.example.com:80 HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked"
    b"\r\n\r\n",
], ids=["word", "binary", "tls-hello", "no-port", "port-99999", "port-0", "no-colon",
        "cl-and-te"])
def test_malformed_requests_are_400(box, data):
    mark = box.mark()
    before = box.metrics()
    c = box.raw(data)
    resp = c.read_head()
    assert resp.status == 400 and resp.reason == "malformed-request", resp
    assert c.is_closed()
    c.close()
    box.wait_flow_log(since=mark, reason="malformed-request")
    after = box.metrics()
    assert delta(before, after, "sam_box_refusals_total", reason="malformed-request") == 1


def test_oversized_head_is_431(box):
    mark = box.mark()
    before = box.metrics()
    big = b"X-Pad: " + b"a" * 9000 + b"\r\n"
    resp, c = box.tunnel("api.example.com:80", extra=big)
    assert resp.status == 431 and resp.reason == "header-too-large", resp
    assert c.is_closed()
    box.wait_flow_log(since=mark, reason="header-too-large")
    after = box.metrics()
    assert delta(before, after, "sam_box_limit_hits_total", limit="max-header-bytes") == 1
    assert delta(before, after, "sam_box_refusals_total", reason="header-too-large") == 1


def test_oversized_head_without_end_is_431(box):
    c = box.raw(b"CONNECT api.example.com:80 HTTP/1.1\r\nX-Pad: " + b"a" * 20000)
    resp = c.read_head()
    assert resp.status == 431 and resp.reason == "header-too-large", resp
    assert c.is_closed()


def test_head_just_under_the_cap_is_accepted(box):
    pad = b"X-Pad: " + b"a" * 7000 + b"\r\n"
    resp, c = box.tunnel("api.example.com:80", extra=pad)
    assert_established(resp, "CONNECT with a 7 KiB head")
    r, body = http_get(c, "/small.txt", "api.example.com")
    assert body == b"hello from upstream\n"
    c.close()


@pytest.mark.parametrize("data", [
    b"GET http://api.example.com/ HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
    b"POST http://api.example.com/ HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
    b"DELETE /x HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
    b"GET /.well-known/masque/udp/api.example.com/5353/ HTTP/1.1\r\nHost: api.example.com"
    b"\r\n\r\n",
], ids=["get-absolute", "get-origin", "post", "delete", "masque-without-upgrade"])
def test_other_methods_are_405(box, data):
    mark = box.mark()
    c = box.raw(data)
    resp = c.read_head()
    assert resp.status == 405 and resp.reason == "method-not-allowed", resp
    assert c.is_closed()
    c.close()
    box.wait_flow_log(since=mark, reason="method-not-allowed")


def test_partial_head_times_out_with_408(box):
    before = box.metrics()
    c = box.raw(b"CONNECT api.example.com:80 HTTP/1.1\r\nHost: api.exa", timeout=30)
    resp = c.read_head()  # the boundary's head-read timeout is 10 s
    assert resp.status == 408 and resp.reason == "header-timeout", resp
    assert c.is_closed()
    c.close()
    after = box.metrics()
    assert delta(before, after, "sam_box_limit_hits_total", limit="head-read-timeout") == 1


@pytest.mark.parametrize("authority", [
    "api.example.com@pypi.org:80", "pypi.org:80@api.example.com", "api.example.com%2e:80",
    "api.example.com:80/x", "api.example.com:+80", "api.example.com:80:80",
    "api.example.com:0x50", "[api.example.com]:80", "api.example.com\\@pypi.org:80",
])
def test_authority_tricks_never_open_a_tunnel(box, authority):
    c = box.raw(f"CONNECT {authority} HTTP/1.1\r\nHost: api.example.com:80\r\n\r\n".encode())
    resp = c.read_head()
    c.close()
    assert resp.status in (400, 403), f"CONNECT {authority}: {resp}"


def test_the_request_target_decides_not_the_host_header(box):
    resp = box.refused("pypi.org:80", host="api.example.com:80")
    assert resp.status == 403 and resp.reason == "not-allowlisted", resp


def test_bytes_after_a_refused_request_are_never_parsed(box):
    before = box.metrics()
    c = box.raw(b"CONNECT pypi.org:80 HTTP/1.1\r\nHost: pypi.org:80\r\n\r\n"
                b"CONNECT api.example.com:80 HTTP/1.1\r\nHost: api.example.com:80\r\n\r\n"
                b"GET /small.txt HTTP/1.1\r\nHost: api.example.com\r\n\r\n")
    data = c.read_until_eof()
    c.close()
    assert data.count(b"HTTP/1.1 ") == 1, data
    assert data.startswith(b"HTTP/1.1 403 "), data
    assert b"Boundary-Reason: not-allowlisted" in data, data
    assert b"hello from upstream" not in data
    after = box.metrics()
    assert delta(before, after, "sam_box_flows_total", outcome="allowed", route="external") == 0


def test_bytes_after_the_connect_head_are_tunnel_payload(box):
    c = box.raw(b"CONNECT api.example.com:80 HTTP/1.1\r\nHost: api.example.com:80\r\n\r\n"
                b"GET /small.txt HTTP/1.1\r\nHost: api.example.com\r\nConnection: close\r\n\r\n")
    resp = c.read_head()
    assert_established(resp, "CONNECT with early data")
    r, body = c.read_http_response()
    c.close()
    assert r.status == 200 and body == b"hello from upstream\n"


def test_client_half_close_does_not_cut_the_download(box, topo):
    resp, c = box.tunnel("api.example.com:80")
    assert_established(resp, "CONNECT api.example.com:80")
    c.send(b"GET /big.bin HTTP/1.0\r\nHost: api.example.com\r\n\r\n")
    c.sock.shutdown(socket.SHUT_WR)
    # Read to EOF (no Content-Length parsing): the upstream's close must reach the client.
    data = c.read_until_eof()
    c.close()
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200"), head[:100]
    assert hashlib.sha256(body).hexdigest() == topo.big_sha256, f"got {len(body)} bytes"


@pytest.mark.parametrize("authority", ["api.example.com:80", "v6only.example.com:80"])
def test_upload_is_byte_exact(box, authority):
    payload = os.urandom(6 << 20)
    resp, c = box.tunnel(authority)
    assert_established(resp, f"CONNECT {authority}")
    c.send(f"POST /sha256 HTTP/1.1\r\nHost: x\r\nContent-Length: {len(payload)}\r\n"
           "Connection: close\r\n\r\n".encode() + payload)
    r, body = c.read_http_response()
    c.close()
    assert body.strip().decode() == hashlib.sha256(payload).hexdigest()


def test_flows_in_progress_gauge(sam_box, sidecar):
    b = sam_box(bundle=bundle_yaml(allow=["api.example.com"]),
                args=["--insecure-unverified-bundle", "--sidecar-socket", sidecar.path])
    gauge = functools.partial(lambda route: b.metrics().get("sam_box_flows_in_progress",
                                                            route=route))
    opened = []
    for authority in ("api.example.com:80", "api.example.com:8080", "mesh.sam.alt:80"):
        resp, c = b.tunnel(authority)
        assert_established(resp, authority)
        opened.append(c)
    wait_for(lambda: gauge("external") == 2 and gauge("mesh-entrypoint") == 1,
             what="2 external and 1 mesh flow in progress")
    for c in opened:
        c.close()
    wait_for(lambda: gauge("external") == 0 and gauge("mesh-entrypoint") == 0,
             what="gauges back to 0")


def test_every_stderr_line_is_json(box):
    lines = box.stderr_text().splitlines()
    assert lines, "sam-box wrote nothing on stderr"
    for line in lines:
        obj = json.loads(line)
        assert isinstance(obj, dict) and "msg" in obj, line


# ---------------------------------------------------------------------------------------
# Metrics


def test_metrics_count_the_flows_made(sam_box, topo, sidecar):
    b = sam_box(bundle=bundle_yaml(allow=STD_ALLOW),
                args=["--insecure-unverified-bundle", "--sidecar-socket", sidecar.path])
    before = b.metrics()
    for name in ("api.example.com:80", "files.pypi.org:80", "dual.example.com:80"):
        r, body = get_through(b, name)
        assert body == b"hello from upstream\n"
    for name in ("pypi.org:80", "evilpypi.org:80"):
        assert b.refused(name).reason == "not-allowlisted"
    assert b.refused("198.18.0.2:80").reason == "unresolved-address"
    assert b.refused("loopback.example.com:80").reason == "forbidden-address"
    assert b.refused("nowhere.example.com:80").reason == "resolve-failed"
    resp, c = b.tunnel("mesh.sam.alt:80")
    assert_established(resp, "CONNECT mesh.sam.alt:80")
    r, body = http_get(c, "/v1/models", "mesh.sam.alt")
    assert r.status == 200
    c.close()

    def settled():
        m = b.metrics()
        if (m.get("sam_box_flows_in_progress", route="external") == 0
                and m.get("sam_box_flows_in_progress", route="mesh-entrypoint") == 0
                and delta(before, m, "sam_box_flows_total", outcome="allowed",
                          route="mesh-entrypoint") == 1):
            return m
        return None
    after = wait_for(settled, what="flows to finish in the metrics")

    d = functools.partial(delta, before, after)
    assert d("sam_box_flows_total", outcome="allowed", route="external") == 3
    assert d("sam_box_flows_total", outcome="allowed", route="mesh-entrypoint") == 1
    assert d("sam_box_flows_total", outcome="denied", route="unresolved") == 1
    assert d("sam_box_flows_total", outcome="denied", route="external") == 3
    assert d("sam_box_flows_total", outcome="error", route="external") == 1
    assert d("sam_box_refusals_total", reason="not-allowlisted") == 2
    assert d("sam_box_refusals_total", reason="unresolved-address") == 1
    assert d("sam_box_refusals_total", reason="forbidden-address") == 1
    small = len(b"hello from upstream\n")
    assert d("sam_box_bytes_total", direction="downstream", route="external") >= 3 * small
    assert d("sam_box_bytes_total", direction="upstream", route="external") >= 3 * len(
        b"GET /small.txt HTTP/1.1\r\n")
    assert d("sam_box_bytes_total", direction="downstream", route="mesh-entrypoint") > 0
    assert d("sam_box_bytes_total", direction="upstream", route="mesh-entrypoint") > 0

    text = b.metrics_text()
    for needle in boxlib.TEST_HOST_NAMES:
        assert needle not in text, f"metrics text contains {needle!r}:\n{text}"
    for family in ("sam_box_flows_total", "sam_box_refusals_total", "sam_box_bytes_total",
                   "sam_box_flows_in_progress", "sam_box_limit_hits_total"):
        assert f"# TYPE {family} " in text, f"no TYPE line for {family}:\n{text}"


# ---------------------------------------------------------------------------------------
# Concurrency


def test_flow_ends_at_once_when_a_peer_fails_mid_transfer(box):
    # The agent leaves in the middle of an upload; the upstream answers anyway, and writing
    # that answer to the agent fails (EPIPE). The flow must end then, not when the idle
    # watchdog gives up on it minutes later.
    mark = box.mark()
    resp, c = box.tunnel("api.example.com:80", timeout=30)
    assert_established(resp, "CONNECT api.example.com:80")
    c.send(b"POST /sha256 HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n"
           + os.urandom(1 << 20))
    c.close()
    box.wait_flow_log(since=mark, outcome="allowed", timeout=5)
    wait_for(lambda: box.metrics().get("sam_box_flows_in_progress", route="external") == 0,
             timeout=5, what="flows_in_progress back to 0")


def test_relay_pipes_carry_no_byte_from_one_flow_into_another(box):
    # Relay pipes are reused across flows (relay.h). Uploads that run at once, next to flows
    # whose agent leaves in the middle of an upload (their relay fails with bytes possibly
    # in flight), must each arrive byte for byte; then a second round runs on the pipes the
    # first one left.
    def upload(i):
        payload = os.urandom((2 << 20) + i * 4099)
        resp, c = box.tunnel("api.example.com:80", timeout=30)
        assert_established(resp, f"upload {i}")
        c.send(f"POST /sha256 HTTP/1.1\r\nHost: x\r\nContent-Length: {len(payload)}\r\n"
               "Connection: close\r\n\r\n".encode() + payload)
        r, body = c.read_http_response()
        c.close()
        assert body.strip().decode() == hashlib.sha256(payload).hexdigest(), f"upload {i}"

    def leave_midway(i):
        resp, c = box.tunnel("api.example.com:80", timeout=30)
        assert_established(resp, f"leave {i}")
        c.send(b"POST /sha256 HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n"
               + os.urandom(1 << 20))
        c.close()

    for _ in range(2):
        with concurrent.futures.ThreadPoolExecutor(max_workers=12) as pool:
            jobs = [pool.submit(upload, i) for i in range(8)]
            jobs += [pool.submit(leave_midway, i) for i in range(4)]
            for j in jobs:
                j.result()
    wait_for(lambda: box.metrics().get("sam_box_flows_in_progress", route="external") == 0,
             what="flows_in_progress back to 0")


def test_200_concurrent_allowed_flows(box):
    n = 200
    barrier = threading.Barrier(n, timeout=30)

    def one(i):
        c = None
        try:
            resp, c = box.tunnel("api.example.com:80", timeout=30)
            assert_established(resp, f"flow {i}")
            barrier.wait()  # all n tunnels are open at once
            r, body = http_get(c, "/small.txt", "api.example.com")
            assert r.status == 200 and body == b"hello from upstream\n", (r, body)
        except BaseException:
            barrier.abort()
            raise
        finally:
            if c is not None:
                c.close()
        return i

    with concurrent.futures.ThreadPoolExecutor(max_workers=n) as pool:
        results = list(pool.map(one, range(n)))
    assert sorted(results) == list(range(n))
    wait_for(lambda: box.metrics().get("sam_box_flows_in_progress", route="external") == 0,
             what="flows_in_progress back to 0")
