"""Stopping sam-box (SIGTERM) with flows open: each open flow gets its one flow line
(reason boundary-stopped, the bytes it really moved, its duration) before the process exits,
on every route (external TCP, connect-udp, the mesh entrypoint, HTTP/2 streams); a tunnel
still connecting fails with that reason; and the stop is prompt even when an upstream never
reads or never answers a SYN."""

import socket
import threading
import time

import boxlib
from boxlib import STD_ALLOW, bundle_yaml, datagram_capsule, read_datagram, wait_for
from shell import sh
from test_h2_tunnels import H2Client

UP_ADDR = "198.18.0.2"  # api.example.com in the test topology (conftest.py)


class EchoUpstream:
    """A TCP server in the UP namespace that echoes every byte and never closes first."""

    def __init__(self, topo):
        self.listener = boxlib.netns_socket(topo.up)
        self.listener.bind((UP_ADDR, 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                s, _ = self.listener.accept()
            except OSError:
                return
            self.conns.append(s)
            threading.Thread(target=self._echo, args=(s,), daemon=True).start()

    @staticmethod
    def _echo(s):
        try:
            while True:
                data = s.recv(65536)
                if not data:
                    return
                s.sendall(data)
        except OSError:
            pass

    def close(self):
        for s in [self.listener] + self.conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


def start_box(sam_box, sidecar):
    return sam_box(bundle=bundle_yaml(allow=STD_ALLOW),
                   args=["--insecure-unverified-bundle", "--sidecar-socket", sidecar.path])


def sigterm(box):
    """SIGTERM; returns (exit code, seconds until the process was gone)."""
    started = time.monotonic()
    rc = box.stop(timeout=10)
    return rc, time.monotonic() - started


def the_flow_line(box, since, **match):
    lines = box.flow_logs(since, **match)
    assert len(lines) == 1, f"want one flow line for {match}, got {lines}:\n" \
                            f"{box.stderr_text()[-3000:]}"
    return lines[0]


def test_stop_logs_every_open_flow_with_the_bytes_it_moved(sam_box, topo, sidecar):
    echo = EchoUpstream(topo)
    try:
        b = start_box(sam_box, sidecar)
        mark = b.mark()

        # HTTP/1.1 CONNECT to the echo upstream: 12 bytes each way, then left open.
        resp, tcp = b.tunnel(f"api.example.com:{echo.port}")
        assert resp.status == 200, resp
        tcp.send(b"hello, echo!")
        assert tcp.read_exact(12) == b"hello, echo!"

        # The mesh entrypoint: one keep-alive request answered, the tunnel left open.
        resp, mesh = b.tunnel("mesh.sam.alt:80")
        assert resp.status == 200, resp
        request = b"GET /v1/models HTTP/1.1\r\nHost: mesh.sam.alt\r\n\r\n"
        mesh.send(request)
        answer, body = mesh.read_http_response()
        assert answer.status == 200, answer
        mesh_down = len(answer.raw) + 4 + len(body)

        # connect-udp: one datagram each way.
        resp, udp = b.udp_tunnel("api.example.com", 5353)
        assert resp.status == 101, resp
        udp.send(datagram_capsule(b"ping"))
        assert read_datagram(udp) == (0, b"ping")

        # An HTTP/2 CONNECT stream to the echo upstream.
        h2c = H2Client(b)
        sid = h2c.connect(f"api.example.com:{echo.port}")
        assert h2c.response(sid)[":status"] == "200"
        h2c.send(sid, b"over h2")
        h2c.wait(lambda: bytes(h2c.data[sid]) == b"over h2", "the echo over h2")

        # Every flow is open and has moved its bytes: sam-box has counted them by now.
        wait_for(lambda: b.metrics().get("sam_box_flows_in_progress", route="external") == 3
                 and b.metrics().get("sam_box_flows_in_progress", route="mesh-entrypoint") == 1,
                 what="four flows in progress")
        assert b.flow_logs(mark) == [], "a flow ended before the stop"

        rc, took = sigterm(b)
        assert rc == 0, b.stderr_text()[-3000:]
        assert took < 2.0, f"stop took {took:.2f}s"

        lines = b.flow_logs(mark)
        assert len(lines) == 4, lines
        for line in lines:
            assert line["outcome"] == "allowed" and line["reason"] == "boundary-stopped", line
            assert line["duration_ms"] >= 0, line
        by_port = {(line["kind"], line["port"]): line for line in lines}
        tcp_lines = [line for line in lines
                     if line["kind"] == "tcp" and line["port"] == echo.port]
        assert sorted((t["bytes_up"], t["bytes_down"]) for t in tcp_lines) == [(7, 7), (12, 12)], \
            tcp_lines
        udp_line = by_port[("udp", 5353)]
        assert (udp_line["bytes_up"], udp_line["bytes_down"]) == (4, 4), udp_line
        mesh_line = by_port[("tcp", 80)]
        assert mesh_line["route"] == "mesh-entrypoint", mesh_line
        # The request went out with X-Sam-Agent added; the answer came back byte for byte.
        assert mesh_line["bytes_up"] > len(request), mesh_line
        assert mesh_line["bytes_down"] == mesh_down, mesh_line

        stopping = [e for e in b.logs() if e.get("msg") == "stopping"]
        assert stopping and stopping[0]["open_flows"] >= 4, stopping
        assert not any("grace" in e.get("msg", "") for e in b.logs()), b.stderr_text()[-2000:]
        for c in (tcp, mesh, udp):
            c.close()
        h2c.close()
    finally:
        echo.close()


def test_stop_is_prompt_when_an_upstream_never_reads(sam_box, topo, sidecar):
    # The upstream's socket is never accepted nor read: the agent's upload fills it, and
    # sam-box's relay waits to write. The stop must not wait for it, and the flow line must
    # count exactly what sam-box handed to the upstream's connection.
    sink = boxlib.netns_socket(topo.up)
    sink.bind((UP_ADDR, 0))
    sink.listen(4)
    port = sink.getsockname()[1]
    try:
        b = start_box(sam_box, sidecar)
        mark = b.mark()
        resp, c = b.tunnel(f"api.example.com:{port}")
        assert resp.status == 200, resp
        c.sock.setblocking(False)
        sent = 0
        chunk = b"x" * 65536

        last = [-1]

        def stalled():
            # Sends until the agent's socket is full; stalled once a poll later no more fits:
            # every buffer between the agent and the upstream is full.
            nonlocal sent
            try:
                while sent < (256 << 20):
                    sent += c.sock.send(chunk)
            except BlockingIOError:
                pass
            if sent == last[0]:
                return True
            last[0] = sent
            return False
        wait_for(stalled, timeout=20, interval=0.3, what="the agent's upload to stall")

        rc, took = sigterm(b)
        assert rc == 0, b.stderr_text()[-3000:]
        assert took < 2.0, f"stop took {took:.2f}s"
        line = the_flow_line(b, mark, port=port)
        assert line["outcome"] == "allowed" and line["reason"] == "boundary-stopped", line
        assert 0 < line["bytes_up"] <= sent, (line, sent)

        # What sam-box counted is what reaches the upstream: its connection, closed, still
        # delivers the bytes it held once the upstream reads.
        sink.settimeout(10)
        conn, _ = sink.accept()
        conn.settimeout(10)
        got = 0
        try:
            while True:
                data = conn.recv(1 << 20)
                if not data:
                    break
                got += len(data)
        except ConnectionResetError:
            pass
        conn.close()
        assert got == line["bytes_up"], (got, line)
        c.close()
    finally:
        sink.close()


def test_stop_fails_a_tunnel_still_connecting(sam_box, topo, sidecar):
    # blackhole.example.com's SYNs vanish: the flow would wait for its 10 s connect deadline.
    # The stop ends it at once, as a failed flow (it was never open).
    b = start_box(sam_box, sidecar)
    mark = b.mark()
    c = b.connect()
    c.send(b"CONNECT blackhole.example.com:80 HTTP/1.1\r\nHost: blackhole.example.com:80\r\n\r\n")

    def connecting():
        r = sh("ip", "netns", "exec", topo.box, "ss", "-Htn", "state", "syn-sent",
                      "dst", "198.18.1.1", check=False)
        return r.stdout.strip()
    wait_for(connecting, what="sam-box's connect to the black hole")

    rc, took = sigterm(b)
    assert rc == 0, b.stderr_text()[-3000:]
    assert took < 2.0, f"stop took {took:.2f}s"
    line = the_flow_line(b, mark, name="blackhole.example.com")
    assert line["outcome"] == "error" and line["reason"] == "boundary-stopped", line
    assert line["bytes_up"] == 0 and line["bytes_down"] == 0, line
    assert c.is_closed(timeout=5), "the agent's connection stayed open"
    c.close()
