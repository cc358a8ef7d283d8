"""HTTP/2 on sam-box's tunnel socket (h2c with prior knowledge): CONNECT streams, connect-udp
over extended CONNECT, the mesh entrypoint, refusals on one stream while others keep working,
bad prefaces, and HTTP/1.1 on the same socket. The client is python3-h2 over the Unix
socket."""

import collections
import hashlib
import json
import os
import socket

import h2.config
import h2.connection
import h2.events
import h2.settings

from boxlib import AGENT_ID, datagram_capsule, delta, netns_socket, wait_for


class H2Client:
    """One HTTP/2 connection to the box, driven synchronously."""

    def __init__(self, box, timeout=10.0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(box.socket_path)
        # h2 4.1 wants :path on every request, even a plain CONNECT (RFC 9113 §8.5 forbids
        # it there), so outbound checks are off: the box does its own.
        cfg = h2.config.H2Configuration(client_side=True, header_encoding="utf-8",
                                        validate_outbound_headers=False)
        self.conn = h2.connection.H2Connection(cfg)
        self.conn.initiate_connection()
        self.flush()
        self.headers = {}
        self.data = collections.defaultdict(bytearray)
        self.ended = set()
        self.reset = {}
        self.goaway = None
        self.eof = False
        self.remote_settings = {}

    def flush(self):
        out = self.conn.data_to_send()
        if out:
            try:
                self.sock.sendall(out)
            except (BrokenPipeError, ConnectionResetError):
                # The box closed after its GOAWAY while our answer to an earlier frame (a
                # SETTINGS ACK) was on its way: what it sent is still ours to read.
                pass

    def pump(self):
        try:
            raw = self.sock.recv(1 << 16)
        except ConnectionResetError:
            raw = b""
        if not raw:
            self.eof = True
            return
        for ev in self.conn.receive_data(raw):
            if isinstance(ev, h2.events.ResponseReceived):
                self.headers[ev.stream_id] = dict(ev.headers)
            elif isinstance(ev, h2.events.DataReceived):
                self.data[ev.stream_id] += ev.data
                self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2.events.StreamEnded):
                self.ended.add(ev.stream_id)
            elif isinstance(ev, h2.events.StreamReset):
                self.reset[ev.stream_id] = ev.error_code
            elif isinstance(ev, h2.events.ConnectionTerminated):
                self.goaway = ev.error_code
            elif isinstance(ev, h2.events.RemoteSettingsChanged):
                for k, v in ev.changed_settings.items():
                    self.remote_settings[k] = v.new_value
        self.flush()

    def wait(self, pred, what):
        for _ in range(100000):
            if pred():
                return
            if self.eof:
                raise AssertionError(f"connection closed while waiting for {what}")
            self.pump()
        raise AssertionError(f"gave up waiting for {what}")

    def request(self, headers, end=False):
        sid = self.conn.get_next_available_stream_id()
        self.conn.send_headers(sid, headers, end_stream=end)
        self.flush()
        return sid

    def connect(self, authority):
        return self.request([(":method", "CONNECT"), (":authority", authority)])

    def response(self, sid):
        self.wait(lambda: sid in self.headers or sid in self.reset, f"response on {sid}")
        assert sid in self.headers, f"stream {sid} reset ({self.reset.get(sid)}) without status"
        return self.headers[sid]

    def send(self, sid, payload, end=False):
        """Sends DATA within the box's flow-control windows (waits for WINDOW_UPDATEs)."""
        view = memoryview(payload)
        while view:
            window = min(self.conn.local_flow_control_window(sid),
                         self.conn.max_outbound_frame_size)
            if window == 0:
                self.pump()
                continue
            self.conn.send_data(sid, bytes(view[:window]))
            view = view[window:]
            self.flush()
        if end:
            self.conn.end_stream(sid)
            self.flush()

    def read_to_end(self, sid):
        self.wait(lambda: sid in self.ended or sid in self.reset, f"end of stream {sid}")
        assert sid not in self.reset, f"stream {sid} reset: {self.reset[sid]}"
        return bytes(self.data[sid])

    def close(self):
        self.sock.close()


def http_response(raw):
    head, _, body = raw.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0].decode(), body


# ---------------------------------------------------------------------------------------


def test_settings_advertise_extended_connect_and_the_stream_cap(box):
    c = H2Client(box)
    c.wait(lambda: c.remote_settings, "server SETTINGS")
    assert c.remote_settings.get(h2.settings.SettingCodes.ENABLE_CONNECT_PROTOCOL) == 1
    assert c.remote_settings.get(h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS) == 4096
    c.close()


def test_connect_stream_relays_both_ways(box, topo):
    mark = box.mark()
    c = H2Client(box)
    # Upload bigger than the stream window: the box credits it only as the upstream takes it.
    body = os.urandom(1 << 20)
    up = c.connect("api.example.com:80")
    assert c.response(up)[":status"] == "200"
    c.send(up, f"POST /sha256 HTTP/1.0\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    status, answer = http_response(c.read_to_end(up))
    assert " 200 " in status and answer.strip().decode() == hashlib.sha256(body).hexdigest()

    down = c.connect("api.example.com:80")
    assert c.response(down)[":status"] == "200"
    c.send(down, b"GET /big.bin HTTP/1.0\r\nHost: api.example.com\r\n\r\n")
    status, got = http_response(c.read_to_end(down))
    assert " 200 " in status
    assert hashlib.sha256(got).hexdigest() == topo.big_sha256
    c.close()
    log = box.wait_flow_log(since=mark, name="api.example.com", outcome="allowed")
    assert log["route"] == "external" and log["agent"] == AGENT_ID and log["kind"] == "tcp"
    assert log["bytes_up"] > 0 and log["bytes_down"] > 0, log


def test_denied_stream_gets_403_while_another_keeps_working(box):
    mark = box.mark()
    before = box.metrics()
    c = H2Client(box)
    ok = c.connect("api.example.com:80")
    assert c.response(ok)[":status"] == "200"
    denied = c.connect("evilpypi.org:80")
    h = c.response(denied)
    assert h[":status"] == "403" and h["boundary-reason"] == "not-allowlisted", h
    c.wait(lambda: denied in c.ended, "END_STREAM on the refusal")
    literal = c.connect("198.18.0.2:80")
    h = c.response(literal)
    assert h[":status"] == "403" and h["boundary-reason"] == "unresolved-address", h
    c.send(ok, b"GET /small.txt HTTP/1.0\r\n\r\n")
    assert c.read_to_end(ok).endswith(b"hello from upstream\n")
    c.close()
    log = box.wait_flow_log(since=mark, name="evilpypi.org", outcome="denied")
    assert log["reason"] == "not-allowlisted", log
    after = wait_for(lambda: (lambda m: m if delta(before, m, "sam_box_refusals_total",
                                                   reason="not-allowlisted") >= 1
                              else None)(box.metrics()), what="refusal counted")
    assert delta(before, after, "sam_box_refusals_total", reason="unresolved-address") >= 1


def test_malformed_and_other_methods(box):
    c = H2Client(box)
    bad = c.request([(":method", "CONNECT"), (":authority", "api.example.com:80"),
                     (":scheme", "https"), (":path", "/")])
    h = c.response(bad)
    assert h[":status"] == "400" and h["boundary-reason"] == "malformed-request", h
    get = c.request([(":method", "GET"), (":scheme", "http"), (":path", "/"),
                     (":authority", "api.example.com")], end=True)
    h = c.response(get)
    assert h[":status"] == "405" and h["boundary-reason"] == "method-not-allowed", h
    noport = c.connect("api.example.com")
    h = c.response(noport)
    assert h[":status"] == "400", h
    c.close()


def test_many_concurrent_streams(box):
    c = H2Client(box)
    sids = [c.connect("api.example.com:80") for _ in range(16)]
    for sid in sids:
        assert c.response(sid)[":status"] == "200"
    for sid in sids:
        c.send(sid, b"GET /small.txt HTTP/1.0\r\n\r\n")
    for sid in sids:
        assert c.read_to_end(sid).endswith(b"hello from upstream\n")
    c.close()


def read_datagrams(buf):
    """Decodes DATAGRAM capsules (type 0, context 0) from bytes; returns (payloads, rest)."""
    def varint(b, i):
        n = 1 << (b[i] >> 6)
        v = b[i] & 0x3F
        for k in range(1, n):
            v = (v << 8) | b[i + k]
        return v, i + n

    out, i = [], 0
    while i < len(buf):
        try:
            t, j = varint(buf, i)
            ln, j = varint(buf, j)
        except IndexError:
            break
        if j + ln > len(buf):
            break
        value = buf[j:j + ln]
        ctx, k = varint(value, 0)
        if t == 0 and ctx == 0:
            out.append(bytes(value[k:]))
        i = j + ln
    return out, buf[i:]


def test_uploads_an_upstream_never_reads_hold_back_only_their_own_streams(box, topo):
    """70 uploads to an upstream that accepts and never reads: each fills its own stream's
    window (256 KiB) and stops, and a fresh stream on the same connection still gets its
    answer. Before, the stalled streams' bytes also used up the 16 MiB connection window,
    which was credited back only as upstreams took them: 64 such streams froze the sandbox's
    every flow over HTTP/2."""
    sink = netns_socket(topo.up)
    sink.bind(("198.18.0.2", 0))
    sink.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sink.listen(128)  # never accepted: the kernel completes each handshake, nobody reads
    port = sink.getsockname()[1]
    c = H2Client(box)
    try:
        stalled = [c.connect(f"api.example.com:{port}") for _ in range(70)]
        for sid in stalled:
            assert c.response(sid)[":status"] == "200"
        chunk = b"u" * 16384
        sent = dict.fromkeys(stalled, 0)
        for _ in range(400):  # until every stream's window is shut
            moved = False
            for sid in stalled:
                if sent[sid] < 1 << 20 and c.conn.local_flow_control_window(sid) >= len(chunk):
                    c.conn.send_data(sid, chunk)
                    sent[sid] += len(chunk)
                    moved = True
            c.flush()
            if not moved:
                break
            c.sock.settimeout(0.05)
            try:
                c.pump()
            except socket.timeout:
                pass
            finally:
                c.sock.settimeout(10)
        assert sum(sent.values()) > 16 << 20, sent  # more than the whole connection window
        fresh = c.connect("api.example.com:80")
        assert c.response(fresh)[":status"] == "200"
        c.send(fresh, b"GET /small.txt HTTP/1.0\r\n\r\n")
        assert c.read_to_end(fresh).endswith(b"hello from upstream\n")
    finally:
        c.close()
        sink.close()


def test_connect_udp_over_h2_echoes(box):
    mark = box.mark()
    c = H2Client(box)
    c.wait(lambda: c.remote_settings, "server SETTINGS")
    sid = c.request([(":method", "CONNECT"), (":protocol", "connect-udp"), (":scheme", "https"),
                     (":path", "/.well-known/masque/udp/api.example.com/5353/"),
                     (":authority", "localhost"), ("capsule-protocol", "?1")])
    h = c.response(sid)
    assert h[":status"] == "200" and h.get("capsule-protocol") == "?1", h
    c.send(sid, datagram_capsule(b"hello") + datagram_capsule(b"again"))
    c.wait(lambda: len(read_datagrams(c.data[sid])[0]) >= 2, "two echoed datagrams")
    assert read_datagrams(c.data[sid])[0] == [b"hello", b"again"]
    denied = c.request([(":method", "CONNECT"), (":protocol", "connect-udp"),
                        (":scheme", "https"), (":path", "/.well-known/masque/udp/pypi.org/53/"),
                        (":authority", "localhost")])
    h = c.response(denied)
    assert h[":status"] == "403" and h["boundary-reason"] == "not-allowlisted", h
    c.send(sid, b"", end=True)
    c.wait(lambda: sid in c.ended or sid in c.reset, "UDP stream end")
    c.close()
    log = box.wait_flow_log(since=mark, name="api.example.com", port=5353, outcome="allowed")
    assert log["kind"] == "udp" and log["bytes_up"] == 10, log


def test_mesh_over_h2_rewrites_x_sam_agent(box, sidecar):
    c = H2Client(box)
    sid = c.connect("mesh.sam.alt:80")
    assert c.response(sid)[":status"] == "200"
    c.send(sid, b"GET /v1/models HTTP/1.1\r\nHost: mesh.sam.alt\r\n"
                b"X-Sam-Agent: evil.prod.acme.example\r\nx-sam-agent: evil-2\r\n"
                b"Connection: close\r\n\r\n")
    status, body = http_response(c.read_to_end(sid))
    assert " 200 " in status, status
    rec = json.loads(body)
    assert [v for k, v in rec["headers"] if k.lower() == "x-sam-agent"] == [AGENT_ID], rec
    c.close()


def test_mesh_over_h2_oversized_first_request_is_answered_431(box, sidecar):
    n = len(sidecar.records)
    c = H2Client(box)
    sid = c.connect("mesh.sam.alt:80")
    assert c.response(sid)[":status"] == "200"
    c.send(sid, b"GET /v1/models HTTP/1.1\r\nHost: mesh.sam.alt\r\nX-Pad: " + b"a" * 9000 +
           b"\r\n\r\n")
    status, _ = http_response(c.read_to_end(sid))
    assert status.startswith("HTTP/1.1 431 "), status
    assert sid in c.ended and sid not in c.reset, "the stream ends cleanly after the answer"
    c.close()
    assert len(sidecar.records) == n, sidecar.records[n:]


def frames(raw):
    """(type, flags, stream_id, payload) of each whole frame in `raw`."""
    out, i = [], 0
    while i + 9 <= len(raw):
        ln = int.from_bytes(raw[i:i + 3], "big")
        out.append((raw[i + 3], raw[i + 4], int.from_bytes(raw[i + 5:i + 9], "big") & 0x7FFFFFFF,
                    raw[i + 9:i + 9 + ln]))
        i += 9 + ln
    return out


def read_all(s):
    got = b""
    while True:
        try:
            chunk = s.recv(4096)
        except ConnectionResetError:
            return got
        if not chunk:
            return got
        got += chunk


GOAWAY, PROTOCOL_ERROR = 7, 1


def test_bad_preface_and_garbage_close_the_connection_not_the_box(box):
    mark = box.mark()
    # The preface line, then not the rest of the preface; the whole preface, then garbage
    # instead of SETTINGS: GOAWAY PROTOCOL_ERROR, then the box closes the connection.
    for garbage in (b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n" + b"\xff" * 64,
                    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x04\xff\x00" + b"\x01" * 64):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(10)
        s.connect(box.socket_path)
        s.sendall(garbage)
        got = frames(read_all(s))
        s.close()
        goaways = [f for f in got if f[0] == GOAWAY]
        assert goaways, f"no GOAWAY in {got}"
        assert int.from_bytes(goaways[0][3][4:8], "big") == PROTOCOL_ERROR, goaways
    log = box.wait_flow_log(since=mark, route="malformed", reason="malformed-request")
    assert log["detail"].startswith("http2: "), log
    # A valid preface, then DATA on stream 0, which RFC 9113 §6.1 forbids: GOAWAY.
    c = H2Client(box)
    c.sock.sendall(b"\x00\x00\x00\x00\x00\x00\x00\x00\x00")
    c.wait(lambda: c.goaway is not None, "GOAWAY")
    assert c.goaway == PROTOCOL_ERROR
    c.close()
    assert box.alive
    # HTTP/1.1 on the same socket is untouched, and HTTP/2 still works.
    resp, conn = box.tunnel("api.example.com:80")
    assert resp.status == 200, resp
    conn.close()
    ok = H2Client(box)
    sid = ok.connect("api.example.com:80")
    assert ok.response(sid)[":status"] == "200"
    ok.close()
