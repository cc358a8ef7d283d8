"""Tries netstack end to end against a real sam-box, by hand, before nano-init exists:

    sudo /usr/bin/python3 tests/netstack/try_driver.py [BUILD_DIR]

Builds the sam-box integration topology (tests/integration/conftest.py: netns BOX with
sam-box, netns UP with the upstream test hosts on 198.18.0.2 / 2001:db8::2), adds a netns SB
holding only lo + tun0 served by tests/netstack/netstack_driver.cc, and runs real clients in
SB. Everything it creates is removed at the end. Traffic never leaves these namespaces.
"""

import hashlib
import os
import pathlib
import secrets
import socket
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests/integration"))
import boxlib  # noqa: E402
import conftest  # noqa: E402

BUILD = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else REPO / "build")
DRIVER = BUILD / "src/netstack/netstack_driver"
boxlib.SAM_BOX = BUILD / "src/sam-box/sam-box"
ALLOW = ["api.example.com", "dual.example.com", "v6only.example.com"]
failures = []


def check(what, ok, detail=""):
    print(("PASS " if ok else "FAIL ") + what + (f": {detail}" if detail and not ok else ""))
    if not ok:
        failures.append(what)


def sb(ns, *cmd, timeout=60, **kw):
    return subprocess.run(["ip", "netns", "exec", ns, *cmd], capture_output=True,
                          timeout=timeout, **kw)


def main():
    t = conftest.Topology()
    t.tag = "nst" + secrets.token_hex(3)
    t.box, t.up = t.tag + "b", t.tag + "u"
    t.veth_box, t.veth_up = t.tag + "vb", t.tag + "vu"
    t.tmp = tempfile.mkdtemp(prefix=t.tag + "-", dir="/tmp")
    t.etc = pathlib.Path("/etc/netns") / t.box
    t.made_etc_netns = not t.etc.parent.exists()
    t.up_proc = None
    ns = t.tag + "s"
    sb_etc = pathlib.Path("/etc/netns") / ns
    driver = None
    try:
        conftest._build(t)
        box = boxlib.SamBox(t, bundle=boxlib.bundle_yaml(allow=ALLOW),
                            args=["--insecure-unverified-bundle"]).start()
        subprocess.run(["ip", "netns", "add", ns], check=True)
        sb_etc.mkdir(parents=True)
        (sb_etc / "resolv.conf").write_text("nameserver 100.127.255.253\n")
        (sb_etc / "hosts").write_text("127.0.0.1 localhost\n")
        ingress = str(pathlib.Path(t.tmp) / "ingress.sock")
        driver = subprocess.Popen(["ip", "netns", "exec", ns, str(DRIVER), box.socket_path,
                                   "--ingress-socket", ingress],
                                  stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        line = driver.stderr.readline()
        while line and b"ready" not in line:
            line = driver.stderr.readline()
        check("driver ready", b"ready" in line)

        r = sb(ns, "curl", "-sS", "http://api.example.com/small.txt")
        check("allowed name: curl works", r.stdout == b"hello from upstream\n", r.stderr)

        r = sb(ns, "curl", "-sS", "-6", "http://v6only.example.com/small.txt")
        check("allowed name over IPv6", r.stdout == b"hello from upstream\n", r.stderr)

        r = sb(ns, "curl", "-sS", "-4", "http://api.example.com/small.txt")
        check("allowed name over IPv4", r.stdout == b"hello from upstream\n", r.stderr)

        probe = ("import socket,sys,time\n"
                 "t=time.monotonic()\n"
                 "try:\n"
                 "  socket.create_connection((sys.argv[1],int(sys.argv[2])),timeout=5)\n"
                 "  print('connected')\n"
                 "except OSError as e:\n"
                 "  print(type(e).__name__, round((time.monotonic()-t)*1000,1))\n")
        for target, what in (("evilpypi.org", "denied name"), ("198.18.0.2", "literal IPv4"),
                             ("2001:db8::2", "literal IPv6")):
            r = sb(ns, "/usr/bin/python3", "-c", probe, target, "80")
            out = r.stdout.decode().split()
            ok = len(out) == 2 and out[0] == "ConnectionRefusedError" and float(out[1]) < 100
            check(f"{what}: ConnectionRefusedError within 100 ms", ok, r.stdout + r.stderr)
            if ok:
                print(f"     {what} refused after {out[1]} ms")

        r = sb(ns, "curl", "-sS", "--cacert", t.ca, "https://api.example.com/big.bin")
        check("HTTPS 4 MiB byte-exact",
              hashlib.sha256(r.stdout).hexdigest() == t.big_sha256, r.stderr)

        r = sb(ns, "dig", "+short", "+tries=1", "+time=2", "api.example.com")
        check("dig over UDP answers a synthetic A", r.stdout.startswith(b"100."), r.stdout)
        r = sb(ns, "dig", "+short", "+tcp", "+tries=1", "+time=2", "AAAA", "api.example.com")
        check("dig over TCP answers a synthetic AAAA", r.stdout.startswith(b"100::"), r.stdout)

        udp = ("import socket\n"
               "a=socket.getaddrinfo('api.example.com',5353,socket.AF_INET,socket.SOCK_DGRAM)\n"
               "s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);s.settimeout(5)\n"
               "s.sendto(b'ping-netstack',a[0][4]);print(s.recvfrom(2048)[0].decode())\n")
        r = sb(ns, "/usr/bin/python3", "-c", udp)
        check("UDP echo through connect-udp", b"ping-netstack" in r.stdout, r.stderr)

        n = int(os.environ.get("BIG_MIB", "100"))
        big = os.urandom(n << 20)
        digest = hashlib.sha256(big).hexdigest()
        (pathlib.Path(t.tmp) / "www" / "huge.bin").write_bytes(big)
        up = pathlib.Path(t.tmp) / "upload.bin"
        up.write_bytes(big)
        del big
        start = time.monotonic()
        r = sb(ns, "sh", "-c", "curl -sS http://api.example.com/huge.bin | sha256sum", timeout=300)
        took = time.monotonic() - start
        check(f"{n} MiB download byte-exact", r.stdout.split()[:1] == [digest.encode()], r.stderr)
        print(f"     {n} MiB download: {n / took:.0f} MiB/s ({took:.2f} s)")
        start = time.monotonic()
        sb(t.box, "sh", "-c", "curl -sS http://198.18.0.2/huge.bin | sha256sum", timeout=300)
        took = time.monotonic() - start
        print(f"     baseline, same download from sam-box's netns directly: {n / took:.0f} MiB/s")
        start = time.monotonic()
        r = sb(ns, "curl", "-sS", "--data-binary", f"@{up}", "-H", "Expect:",
               "http://api.example.com/sha256", timeout=300)
        took = time.monotonic() - start
        check(f"{n} MiB upload byte-exact", digest.encode() in r.stdout, r.stdout + r.stderr)
        print(f"     {n} MiB upload: {n / took:.0f} MiB/s ({took:.2f} s)")

        # Ingress: a server on the sandbox's loopback, reached through the driver's socket.
        server = subprocess.Popen(["ip", "netns", "exec", ns, "/usr/bin/python3", "-m",
                                   "http.server", "--bind", "127.0.0.1", "8081",
                                   "--directory", str(pathlib.Path(t.tmp) / "www")],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            boxlib.wait_for(lambda: sb(ns, "curl", "-s", "http://127.0.0.1:8081/small.txt")
                            .returncode == 0, what="ingress test server")
            c = boxlib.Conn(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
            c.sock.connect(ingress)
            c.send(b"CONNECT 127.0.0.1:8081 HTTP/1.1\r\nHost: 127.0.0.1:8081\r\n\r\n")
            head = c.read_head()
            resp, body = boxlib.http_get(c, "/small.txt", "127.0.0.1")
            check("ingress relays to 127.0.0.1:<port>",
                  head.status == 200 and body == b"hello from upstream\n", f"{head} {body}")
            c.close()
            c = boxlib.Conn(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
            c.sock.connect(ingress)
            c.send(b"CONNECT 10.0.0.1:80 HTTP/1.1\r\nHost: 10.0.0.1:80\r\n\r\n")
            head = c.read_head()
            check("ingress refuses other targets with 403", head.status == 403, str(head))
            c.close()
        finally:
            server.kill()
            server.wait()
    finally:
        if driver is not None:
            driver.terminate()
            try:
                _, err = driver.communicate(timeout=5)
                tail = err.decode(errors="replace").strip().splitlines()[-3:]
                print("driver stderr tail:", *tail, sep="\n  ")
            except subprocess.TimeoutExpired:
                driver.kill()
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["rm", "-rf", str(sb_etc)])
        conftest._teardown(t)
    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
