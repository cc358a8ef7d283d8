#!/usr/bin/python3
"""The upstream test host's servers, run inside the UP network namespace by conftest.py:

    ip netns exec UP /usr/bin/python3 upstream.py --dir WWW --cert C --key K

Every server listens on [::] with IPV6_V6ONLY off, so it answers both 198.18.0.2 and
2001:db8::2:
  HTTP on 80 and 8080   files from --dir; GET /peer answers the client's address (an IPv4
                        client shows as ::ffff:a.b.c.d), GET /port the server's port,
                        POST /sha256 the SHA-256 of the request body
  HTTPS on 443          the same, with --cert/--key
  UDP echo on 5353      echoes each datagram; the datagram b"whoami" is answered with the
                        client's address instead

Prints "ready" on stdout once every socket is bound, then serves until SIGTERM.
"""

import argparse
import functools
import hashlib
import http.server
import signal
import socket
import ssl
import sys
import threading


class DualStackHTTPServer(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET6
    daemon_threads = True
    request_queue_size = 1024
    allow_reuse_address = True

    def server_bind(self):
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()

    def handle_error(self, request, client_address):
        pass  # clients that hang up early are expected (refusal tests)


class TLSServer(DualStackHTTPServer):
    def __init__(self, addr, handler, context):
        self.context = context
        super().__init__(addr, handler)

    def get_request(self):
        sock, addr = self.socket.accept()
        # The handshake runs in the connection's thread, so a stalled client cannot block
        # accept().
        return self.context.wrap_socket(sock, server_side=True,
                                        do_handshake_on_connect=False), addr

    def finish_request(self, request, client_address):
        try:
            request.do_handshake()
        except (ssl.SSLError, OSError):
            return
        super().finish_request(request, client_address)


class Handler(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def do_GET(self):  # noqa: N802
        if self.path in ("/peer", "/port"):
            text = (self.client_address[0] if self.path == "/peer"
                    else str(self.server.server_address[1]))
            body = (text + "\n").encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        super().do_GET()

    def do_POST(self):  # noqa: N802
        # POST /sha256: answers the SHA-256 of the request body (upload checks).
        n = int(self.headers.get("Content-Length") or 0)
        h = hashlib.sha256()
        while n > 0:
            chunk = self.rfile.read(min(n, 1 << 16))
            if not chunk:
                break
            h.update(chunk)
            n -= len(chunk)
        body = (h.hexdigest() + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt, *args):
        pass


def udp_echo(sock):
    while True:
        data, peer = sock.recvfrom(65535)
        if data == b"whoami":
            data = peer[0].encode()
        sock.sendto(data, peer)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--cert", required=True)
    p.add_argument("--key", required=True)
    args = p.parse_args()

    handler = functools.partial(Handler, directory=args.dir)
    servers = [DualStackHTTPServer(("::", 80), handler),
               DualStackHTTPServer(("::", 8080), handler)]
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(args.cert, args.key)
    servers.append(TLSServer(("::", 443), handler, ctx))
    udp = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    udp.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    udp.bind(("::", 5353))

    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    threading.Thread(target=udp_echo, args=(udp,), daemon=True).start()

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print("ready", flush=True)
    stop.wait()
    sys.exit(0)


if __name__ == "__main__":
    main()
