"""The fixtures on their own, without sam-box: if these fail, every other failure is noise."""

import hashlib
import socket
import ssl
import subprocess

import boxlib


def test_box_resolves_names_from_its_hosts_file(topo):
    out = subprocess.run(
        ["ip", "netns", "exec", topo.box, "getent", "ahosts", "dual.example.com"],
        capture_output=True, text=True, timeout=10).stdout
    assert "198.18.0.2" in out and "2001:db8::2" in out, out
    r = subprocess.run(["ip", "netns", "exec", topo.box, "getent", "hosts",
                        "nowhere.example.com"], capture_output=True, text=True, timeout=10)
    assert r.returncode != 0, "an unknown name must not resolve inside BOX"
    # The root namespace's /etc/hosts is untouched.
    assert "api.example.com" not in open("/etc/hosts").read()


def test_upstream_http_both_families(topo):
    for family, addr, peer in ((socket.AF_INET, ("198.18.0.2", 80), "::ffff:198.18.0.1"),
                               (socket.AF_INET6, ("2001:db8::2", 8080), "2001:db8::1")):
        c = boxlib.Conn(boxlib.netns_connect(topo.box, addr, family=family))
        resp, body = boxlib.http_get(c, "/peer", "x")
        assert resp.status == 200 and body.decode().strip() == peer
        c.close()
    c = boxlib.Conn(boxlib.netns_connect(topo.box, ("198.18.0.2", 80)))
    resp, body = boxlib.http_get(c, "/big.bin", "x")
    assert hashlib.sha256(body).hexdigest() == topo.big_sha256


def test_upstream_tls(topo):
    ctx = ssl.create_default_context(cafile=topo.ca)
    s = boxlib.netns_connect(topo.box, ("198.18.0.2", 443))
    t = ctx.wrap_socket(s, server_hostname="api.example.com")
    c = boxlib.Conn(t)
    resp, body = boxlib.http_get(c, "/small.txt", "api.example.com")
    assert body == b"hello from upstream\n"
    c.close()


def test_upstream_udp_echo(topo):
    for family, addr in ((socket.AF_INET, ("198.18.0.2", 5353)),
                         (socket.AF_INET6, ("2001:db8::2", 5353))):
        s = boxlib.netns_socket(topo.box, family, socket.SOCK_DGRAM)
        s.settimeout(3)
        s.sendto(b"ping", addr)
        assert s.recvfrom(100)[0] == b"ping"
        s.close()


def test_sidecar_echo(topo, sidecar):
    s = socket.socket(socket.AF_UNIX)
    s.connect(sidecar.path)
    c = boxlib.Conn(s)
    c.send(b"GET /a HTTP/1.1\r\nHost: x\r\nX-Sam-Agent: me\r\n\r\n"
           b"POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
    for path in ("/a", "/b"):
        resp, body = c.read_http_response()
        import json
        rec = json.loads(body)
        assert rec["path"] == path
    c.close()


def test_black_hole_drops_silently(topo):
    s = boxlib.netns_socket(topo.box)
    s.settimeout(1.0)
    try:
        s.connect(("198.18.1.1", 80))
        raise AssertionError("connect to the black hole succeeded")
    except socket.timeout:
        pass
    finally:
        s.close()
