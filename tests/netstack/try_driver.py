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
        driver = subprocess.Popen(["ip", "netns", "exec", ns, str(DRIVER), box.socket_path],
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
        upload = ("import socket,hashlib,time\n"
                  "s=socket.create_connection(('api.example.com',8080))\n")
        del upload
        start = time.monotonic()
        r = sb(ns, "sh", "-c", f"curl -sS http://api.example.com/big.bin -o /dev/null "
               f"-w '%{{speed_download}}'")
        check("download speed measured", r.returncode == 0, r.stderr)
        print(f"     4 MiB download: {float(r.stdout or 0) / 1e6:.1f} MB/s")
        _ = n
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
