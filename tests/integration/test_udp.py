"""connect-udp (RFC 9298 over HTTP/1.1, capsules per RFC 9297) through sam-box: the same
allow/deny rules as CONNECT, datagrams both ways."""

import pytest

from boxlib import datagram_capsule, delta, read_datagram, varint, wait_for


def open_udp(box, host, port):
    resp, c = box.udp_tunnel(host, port)
    assert resp.status == 101, f"connect-udp {host}:{port}: want 101, got {resp}"
    assert (resp.header("Upgrade") or "").lower() == "connect-udp", resp
    assert resp.header("Capsule-Protocol") == "?1", resp
    return c


def echo(c, payload):
    c.send(datagram_capsule(payload))
    ctx, got = read_datagram(c)
    assert ctx == 0
    return got


def test_udp_echo_through_an_allowed_name(box):
    mark = box.mark()
    before = box.metrics()
    c = open_udp(box, "api.example.com", 5353)
    assert echo(c, b"hello") == b"hello"
    big = bytes(range(256)) * 5  # 1280 bytes: a payload length needing a 2-byte varint
    assert echo(c, big) == big
    # Several capsules in one write come back as several datagrams, in order.
    c.send(b"".join(datagram_capsule(f"d{i}".encode()) for i in range(5)))
    got = [read_datagram(c)[1] for _ in range(5)]
    assert got == [f"d{i}".encode() for i in range(5)]
    c.close()
    log = box.wait_flow_log(since=mark, name="api.example.com", port=5353, outcome="allowed")
    assert log["route"] == "external", log
    after = wait_for(lambda: (lambda m: m if delta(before, m, "sam_box_flows_total",
                                                   outcome="allowed", route="external") >= 1
                              else None)(box.metrics()), what="UDP flow counted")
    assert delta(before, after, "sam_box_bytes_total", direction="upstream",
                 route="external") >= 5 + len(big) + 10


def test_udp_reaches_the_v6_upstream(box):
    c = open_udp(box, "v6only.example.com", 5353)
    assert echo(c, b"whoami") == b"2001:db8::1"
    c.close()


def test_unknown_capsules_and_contexts_are_dropped(box):
    c = open_udp(box, "files.pypi.org", 5353)
    unknown = varint(0x2B) + varint(3) + b"xyz"          # unknown capsule type: skipped
    other_ctx = datagram_capsule(b"not-for-udp", context_id=2)  # unknown context: dropped
    c.send(unknown + other_ctx + datagram_capsule(b"after"))
    assert read_datagram(c) == (0, b"after")
    c.close()


@pytest.mark.parametrize("host,port,status,reason", [
    ("pypi.org", 5353, 403, "not-allowlisted"),
    ("evilpypi.org", 5353, 403, "not-allowlisted"),
    ("dual.example.com", 5353, 403, "not-allowlisted"),   # entry is dual.example.com:80
    ("198.18.0.2", 5353, 403, "unresolved-address"),
    ("2001%3Adb8%3A%3A2", 5353, 403, "unresolved-address"),  # RFC 9298 §2: colons encoded
    ("3323068418", 5353, 403, "unresolved-address"),
    ("loopback.example.com", 5353, 403, "forbidden-address"),
    ("metadata.example.com", 5353, 403, "forbidden-address"),
    ("mesh.sam.alt", 80, 403, "mesh-udp-unsupported"),
    ("nowhere.example.com", 5353, 502, "resolve-failed"),
])
def test_udp_refusals(box, host, port, status, reason):
    mark = box.mark()
    resp, c = box.udp_tunnel(host, port)
    assert (resp.status, resp.reason) == (status, reason), resp
    assert c.is_closed()
    c.close()
    log = box.wait_flow_log(since=mark, reason=reason)
    assert log["outcome"] in ("denied", "error"), log


def test_udp_allowed_with_uppercase_and_trailing_dot(box):
    c = open_udp(box, "A.B.PyPI.org.", 5353)
    assert echo(c, b"x") == b"x"
    c.close()


def test_oversized_capsule_closes_the_flow_not_the_box(box):
    c = open_udp(box, "api.example.com", 5353)
    c.send(varint(0x00) + varint(1 << 20) + b"\x00" + b"x" * 70000)
    assert c.is_closed(timeout=5), "a 1 MiB capsule was accepted"
    c.close()
    c = open_udp(box, "api.example.com", 5353)
    assert echo(c, b"still-here") == b"still-here"
    c.close()


def test_many_datagrams_round_trip(box):
    c = open_udp(box, "api.example.com", 5353)
    want = [f"n{i}".encode() for i in range(200)]
    for i in range(0, 200, 20):  # 20 in flight at a time: a loss-free veth keeps them all
        c.send(b"".join(datagram_capsule(p) for p in want[i:i + 20]))
        got = [read_datagram(c)[1] for _ in range(20)]
        assert sorted(got) == sorted(want[i:i + 20])
    c.close()
