"""nano-init's network side (issue 3 "Network", "--create-namespaces"): links, routes and
resolv.conf inside the sandbox, and end to end through a real sam-box to the test hosts that
conftest.py builds (198.18.0.0/15, 2001:db8::/32). Nothing is sent anywhere else."""

import json
import os
import re
import signal
import subprocess
import time

import pytest

import boxlib
from boxlib import delta, wait_for
from nano_fixtures import (NANO_INIT, dummy_boundary, nano, nano_command,  # noqa: F401
                           nano_has_netstack, nano_tmp, run_nano)


def _links(stdout):
    return sorted(line.split(":")[1].strip().split("@")[0] for line in stdout.splitlines()
                  if line.strip())


@pytest.mark.parametrize("create", [False, True])
def test_only_lo_and_tun0_with_default_routes(nano, dummy_boundary, create):
    flags = ["--create-namespaces"] if create else []
    r = run_nano(dummy_boundary.path,
                 ["sh", "-c", "ip -o link show; echo --; ip -4 route; ip -6 route; echo --; "
                  "ip -o addr show dev tun0"], flags=flags, netns=not create)
    assert r.returncode == 0, r.stderr
    links, routes, addrs = r.stdout.split("--\n")
    assert _links(links) == ["lo", "tun0"], links
    assert re.search(r"tun0: .* mtu 65520 ", links), links  # its own tun0 as the runner's
    assert re.search(r"^default dev tun0", routes, re.M), routes
    assert len(re.findall(r"^default dev tun0", routes, re.M)) == 2, routes
    assert "100.64.0.1/10" in addrs and "100::1/64" in addrs, addrs


def test_create_namespaces_gives_ipc_and_uts_of_its_own(nano, dummy_boundary):
    """A pod shares IPC and UTS between its containers: the agent must not share them."""
    r = run_nano(dummy_boundary.path, ["readlink", "/proc/self/ns/ipc", "/proc/self/ns/uts"],
                 flags=["--create-namespaces"], netns=False)
    assert r.returncode == 0, r.stderr
    ours = [os.readlink("/proc/self/ns/ipc"), os.readlink("/proc/self/ns/uts")]
    theirs = r.stdout.split()
    assert len(theirs) == 2 and theirs[0] != ours[0] and theirs[1] != ours[1], (theirs, ours)


def test_unprivileged_create_namespaces_fails_closed_with_a_reason(nano, dummy_boundary,
                                                                   nano_tmp):
    """/dev/net/tun is 0600 root here: an unprivileged nano-init gets its namespaces but
    cannot create tun0, and must say why instead of running the agent without a network."""
    marker = nano_tmp / "unpriv-ran"
    os.chmod(nano_tmp, 0o777)
    cmd = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
           str(NANO_INIT), "run", "--create-namespaces", dummy_boundary.path, "touch",
           str(marker)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    os.chmod(nano_tmp, 0o755)
    assert r.returncode != 0
    assert not marker.exists()
    assert "tun0" in r.stderr and ("/dev/net/tun" in r.stderr or "TUNSETIFF" in r.stderr), \
        r.stderr


def test_resolv_conf_points_at_the_virtual_dns_and_the_host_is_untouched(nano, dummy_boundary):
    before = open("/etc/resolv.conf").read()
    r = run_nano(dummy_boundary.path, ["cat", "/etc/resolv.conf"])
    assert r.returncode == 0, r.stderr
    servers = re.findall(r"^nameserver\s+(\S+)", r.stdout, re.M)
    assert servers == ["100.127.255.253"], r.stdout
    assert open("/etc/resolv.conf").read() == before


def test_getent_gets_a_synthetic_address(nano, dummy_boundary):
    r = run_nano(dummy_boundary.path,
                 ["sh", "-c", "getent ahostsv4 api.example.com | head -1; "
                  "getent ahostsv6 api.example.com | head -1"])
    assert r.returncode == 0, r.stderr
    v4, v6 = [line.split()[0] for line in r.stdout.splitlines()[:2]]
    a, b, _, _ = (int(x) for x in v4.split("."))
    assert a == 100 and 64 <= b <= 127, v4
    assert v6.startswith("100::"), v6


# ---------------------------------------------------------------------------------------
# End to end through a real sam-box


def test_allowed_name_works_through_sam_box(nano, std_box):
    r = run_nano(std_box.socket_path,
                 ["curl", "-sS", "--max-time", "10", "http://api.example.com/small.txt"])
    assert r.returncode == 0, r.stderr
    assert r.stdout == "hello from upstream\n"


def test_denied_name_is_refused_quickly(nano, std_box):
    # -v: curl sums up a refusal of both families as "Couldn't connect to server"; each
    # connect() underneath must have failed with ECONNREFUSED.
    script = ("s=$(date +%s%N); curl -sSv --max-time 5 http://denied.example.org/ 2>&1; "
              "echo rc=$?; e=$(date +%s%N); echo ms=$(( (e - s) / 1000000 ))")
    r = run_nano(std_box.socket_path, ["sh", "-c", script])
    assert "Connection refused" in r.stdout, r.stdout + r.stderr
    assert "rc=7" in r.stdout
    ms = int(re.search(r"ms=(\d+)", r.stdout).group(1))
    assert ms < 1000, f"refusal took {ms} ms"
    assert "timed out" not in r.stdout


def test_literal_ip_is_refused_and_counted_unresolved(nano, std_box):
    before = std_box.metrics()
    r = run_nano(std_box.socket_path,
                 ["curl", "-sSv", "--max-time", "5", "http://198.18.0.2/small.txt"])
    assert r.returncode == 7 and "Connection refused" in r.stderr, r.stderr
    wait_for(lambda: delta(before, std_box.metrics(), "sam_box_flows_total",
                           outcome="denied", route="unresolved") >= 1,
             what="the unresolved flow in the metrics")


def test_a_boundary_that_is_gone_refuses_flows_with_a_stable_reason(nano, nano_tmp):
    """With no sam-box behind BOUNDARY (it died, or never started), a flow is refused at once,
    and nano-init's line gives the reason boundary-unreachable, not a bare errno text."""
    gone = nano_tmp / "gone.sock"
    r = run_nano(str(gone), ["curl", "-sS", "--max-time", "5", "http://api.example.com/"])
    assert r.returncode == 7, r.stderr  # couldn't connect: refused, not timed out (28)
    refused = [json.loads(line) for line in r.stderr.splitlines()
               if line.startswith("{") and "tcp flow refused" in line]
    assert refused, r.stderr
    assert {e["reason"] for e in refused} == {"boundary-unreachable"}, refused
    assert all("No such file" in e["error"] for e in refused), refused
    assert all(e["target"] == "api.example.com:80" for e in refused), refused


def test_ten_thousand_names_leave_memory_bounded(nano, dummy_boundary):
    """10,000 random names through the virtual DNS: every one answered from 100.64/10, and
    nano-init's RSS stays small (the pool is bounded)."""
    script = r"""
python3 - <<'PY'
import random, socket, string, struct
def q(name, qid):
    out = struct.pack('>HHHHHH', qid, 0x0100, 1, 0, 0, 0)
    for l in name.split('.'):
        out += bytes([len(l)]) + l.encode()
    return out + b'\0' + struct.pack('>HH', 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(2)
ok = 0
for i in range(10000):
    name = ''.join(random.choice(string.ascii_lowercase) for _ in range(16)) + '.example.com'
    s.sendto(q(name, i & 0xffff), ('100.127.255.253', 53))
    r = s.recv(512)
    if r[3] & 0xf == 0 and r[-4] == 100 and 64 <= r[-3] <= 127:
        ok += 1
print('ok', ok)
PY
grep VmRSS /proc/1/status
"""
    r = run_nano(dummy_boundary.path, ["sh", "-c", script], timeout=120)
    assert r.returncode == 0, r.stderr
    assert "ok 10000" in r.stdout, r.stdout
    rss_kb = int(re.search(r"VmRSS:\s+(\d+)", r.stdout).group(1))
    print(f"nano-init RSS after 10,000 names: {rss_kb} kB")
    assert rss_kb < 32 * 1024, rss_kb


def test_refuses_a_namespace_with_another_interface(nano, dummy_boundary, nano_tmp):
    """A NIC (a veth) beside lo: the agent could route around tun0, so nano-init refuses."""
    marker = nano_tmp / "nic-ran"
    r = subprocess.run(
        ["unshare", "--net", "sh", "-c",
         f"ip link add nic0 type veth peer name nic1 && exec {NANO_INIT} run --user 0:0 {dummy_boundary.path} "
         f"touch {marker}"], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "nic0" in r.stderr, r.stderr
    assert not marker.exists()


def test_adopts_a_tun0_passed_as_fd_3(nano, dummy_boundary):
    """The launcher makes tun0 in the sandbox's netns and hands it over open as fd 3 (as
    `podman --preserve-fds 1` does); nano-init adopts it and does not leak it to the agent."""
    script = r"""
import fcntl, os, struct, subprocess, sys
fd = os.open('/dev/net/tun', os.O_RDWR)
fcntl.ioctl(fd, 0x400454ca, struct.pack('16sH', b'tun0', 0x0001 | 0x1000))  # TUNSETIFF
os.dup2(fd, 3, inheritable=True)
os.close(fd)
r = subprocess.run(sys.argv[1:], pass_fds=(3,))
sys.exit(r.returncode)
"""
    r = subprocess.run(
        ["unshare", "--net", "--pid", "--fork", "--mount-proc", "/usr/bin/python3", "-c", script,
         str(NANO_INIT), "run", "--user", "0:0", dummy_boundary.path, "sh", "-c",
         "ip -o link show | cut -d: -f2; readlink /proc/$$/fd/3 || echo no-fd-3"],
        capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert "tun0" in r.stdout
    assert r.stdout.split()[-1] == "no-fd-3", f"fd 3 leaked into the agent: {r.stdout}"


_GATED_LAUNCHER = r"""
import fcntl, os, socket, struct, subprocess, sys
send_tun = sys.argv[1] == "tun"
if send_tun:
    tun = os.open('/dev/net/tun', os.O_RDWR)
    fcntl.ioctl(tun, 0x400454ca, struct.pack('16sH', b'tun0', 0x0001 | 0x1000))  # TUNSETIFF
ours, theirs = socket.socketpair()
os.dup2(theirs.fileno(), 9, inheritable=True)
theirs.close()
p = subprocess.Popen(sys.argv[2:], pass_fds=(9,))
os.close(9)
heard = ours.recv(6)
links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
print("HEARD", heard, "LINKS-AT-GATE", " ".join(sorted(l.split(":")[1].strip() for l in links.splitlines())), flush=True)
socket.send_fds(ours, [b"armed\n"], [tun] if send_tun else [])
if send_tun:
    os.close(tun)
ours.close()
sys.exit(p.wait())
"""


@pytest.mark.parametrize("passed", ["tun", "nothing"])
def test_run_behind_a_gate_sets_up_nothing_until_armed_and_adopts_the_tun0_it_brings(
        nano, dummy_boundary, passed):
    """`run --gate-fd 9`: nano-init says "ready" and waits with the namespace untouched (the
    launcher may still be configuring it); the tun0 that comes with "armed" is the one it
    adopts, and neither it nor the gate leaks into the agent. Without a tun0 it makes one."""
    r = subprocess.run(
        ["unshare", "--net", "--pid", "--fork", "--mount-proc", "/usr/bin/python3", "-c",
         _GATED_LAUNCHER, passed, str(NANO_INIT), "run", "--user", "0:0", "--gate-fd", "9",
         dummy_boundary.path,
         "sh", "-c", "ip -o addr show dev tun0; echo fds:; for n in $(seq 3 32); do "
         "readlink /proc/$$/fd/$n; done; echo end"],
        capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    at_gate = "lo tun0" if passed == "tun" else "lo"
    assert f"HEARD b'ready\\n' LINKS-AT-GATE {at_gate}\n" in r.stdout, r.stdout
    # At the gate lo was still down and tun0 had no address: nothing was set up before "armed".
    assert "100.64.0.1/10" in r.stdout, r.stdout
    assert r.stdout.endswith("fds:\nend\n"), f"a descriptor leaked into the agent: {r.stdout}"


def test_run_behind_a_gate_refuses_a_descriptor_that_is_not_tun0(nano, dummy_boundary,
                                                                 nano_tmp):
    marker = nano_tmp / "gate-not-tun-ran"
    launcher = _GATED_LAUNCHER.replace(
        "[tun] if send_tun else []", "[os.open('/dev/null', os.O_RDONLY)]")
    r = subprocess.run(
        ["unshare", "--net", "--pid", "--fork", "--mount-proc", "/usr/bin/python3", "-c",
         launcher, "tun", str(NANO_INIT), "run", "--user", "0:0", "--gate-fd", "9",
         dummy_boundary.path,
         "touch", str(marker)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 70, r.stderr
    assert "not tun0" in r.stderr, r.stderr
    assert not marker.exists()


def test_dig_other_types_get_no_answer(nano, dummy_boundary):
    """A gets one synthetic address; TXT and MX get NOERROR with no answer;
    an invalid name gets NXDOMAIN. Nothing here is ever sent to a real resolver."""
    script = ("dig +short +tries=1 +time=2 api.example.com A; echo --; "
              "dig +tries=1 +time=2 api.example.com TXT | grep -E 'status|ANSWER:'; echo --; "
              "dig +tries=1 +time=2 example.com MX | grep -E 'status|ANSWER:'; echo --; "
              "dig +tries=1 +time=2 bad_name.example.com A | grep status")
    r = run_nano(dummy_boundary.path, ["sh", "-c", script])
    assert r.returncode == 0, r.stderr
    udp, txt, mx, bad = r.stdout.split("--\n")
    assert udp.strip().startswith("100."), udp
    for out in (txt, mx):
        assert "status: NOERROR" in out and "ANSWER: 0" in out, out
    assert "status: NXDOMAIN" in bad, bad


def test_dns_over_tcp(nano, dummy_boundary):
    script = ("dig +short +tries=1 +time=2 api.example.com A; echo --; "
              "dig +short +tcp +tries=1 +time=2 api.example.com A")
    r = run_nano(dummy_boundary.path, ["sh", "-c", script])
    udp, tcp = r.stdout.split("--\n")
    assert udp.strip() == tcp.strip() and udp.strip().startswith("100."), (udp, tcp)


_DNS_TCP_HOARDER = r"""
import socket, struct, subprocess
q = struct.pack('>HHHHHH', 1, 0x0100, 1, 0, 0, 0) + b'\x01a\x00' + struct.pack('>HH', 1, 1)
chunk = (struct.pack('>H', len(q)) + q) * 512
held, refused = [], 0
for _ in range(200):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)  # answers pile up on nano-init's side
    try:
        s.connect(('100.127.255.253', 53))
    except ConnectionRefusedError:
        refused += 1
        continue
    for _ in range(4):
        try:
            s.send(chunk, socket.MSG_DONTWAIT)
        except OSError:
            break
    held.append(s)
udp = subprocess.run(['dig', '+short', '+tries=1', '+time=2', 'api.example.com', 'A'],
                     capture_output=True, text=True).stdout.strip()
rss = [l.split()[1] for l in open('/proc/1/status') if l.startswith('VmRSS')][0]
print(len(held), refused, udp, rss)
"""


_DNS_TCP_PIPELINE = r"""
import socket, struct, sys, threading
q = struct.pack('>HHHHHH', 7, 0x0100, 1, 0, 0, 0) + b'\x03api\x07example\x03com\x00' \
    + struct.pack('>HH', 1, 1)
n, concurrent = int(sys.argv[1]), sys.argv[2] == "concurrent"
s = socket.create_connection(('100.127.255.253', 53), timeout=20)
def send():  # then half-close, as a client that has nothing more to ask does
    s.sendall((struct.pack('>H', len(q)) + q) * n)
    s.shutdown(socket.SHUT_WR)
if concurrent:
    threading.Thread(target=send).start()
else:
    send()  # all of it before reading a single answer
got, buf = 0, b''
while got < n:
    chunk = s.recv(65536)
    if not chunk:
        break
    buf += chunk
    while len(buf) >= 2 and len(buf) >= 2 + int.from_bytes(buf[:2], 'big'):
        buf = buf[2 + int.from_bytes(buf[:2], 'big'):]
        got += 1
print(got)
"""


@pytest.mark.parametrize("n,mode", [(10000, "concurrent"), (1500, "then-read")])
def test_dns_over_tcp_answers_a_pipeline_larger_than_the_window(nano, dummy_boundary, n, mode):
    """Pipelined queries, then a half-close: 10,000 (330 KB, more than the window) written
    while the answers are read, or 1,500 (more answers than nano-init holds back, 64 KiB)
    written before reading any. Every query is answered: queries are taken as the window
    allows (acknowledged once answered), never buffered until a limit resets the connection
    (before: reset past 64 KiB), and the FIN ends the connection only once all are answered."""
    r = run_nano(dummy_boundary.path, ["/usr/bin/python3", "-c", _DNS_TCP_PIPELINE, str(n), mode],
                 timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(n)], r.stdout + r.stderr[-2000:]


def test_dns_over_tcp_connections_are_capped(nano, dummy_boundary):
    """An agent opening DNS-over-TCP connection after connection to the virtual resolver and
    never reading the answers: the 65th and later are refused (RST), so nano-init holds at
    most 64 connections' answers (before, 2,000 took it to 450 MB), and UDP DNS still
    answers."""
    r = run_nano(dummy_boundary.path, ["/usr/bin/python3", "-c", _DNS_TCP_HOARDER], timeout=60)
    assert r.returncode == 0, r.stderr
    held, refused, udp, rss_kib = r.stdout.split()
    assert (int(held), int(refused)) == (64, 136), r.stdout
    assert udp.startswith("100."), r.stdout
    assert int(rss_kib) < 96 * 1024, r.stdout
    assert '"cap_dns_tcp_flows":136' in r.stderr, r.stderr[-2000:]


def _run_nano_with_file_over(boundary, source, target, script):
    """nano-init running `sh -c script`, launched where `source` is bind-mounted over `target`
    (in a mount namespace of the launcher's own: the host's file is never touched)."""
    inner = nano_command(boundary, ["sh", "-c", script])
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                        f'mount --bind {source} {target} && exec "$@"', "sh", *inner],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r


def test_resolv_conf_already_right_is_left_alone(nano, dummy_boundary, nano_tmp):
    """The seed's pod mounts a resolv.conf naming the virtual DNS: no bind mount then (the
    one operation containerd's AppArmor profile denies)."""
    right = nano_tmp / "pod-resolv.conf"
    right.write_text("nameserver 100.127.255.253\n")
    r = _run_nano_with_file_over(dummy_boundary.path, right, "/etc/resolv.conf",
                                 "cat /etc/resolv.conf; grep -c nano-init-resolv "
                                 "/proc/self/mountinfo || true")
    lines = r.stdout.splitlines()
    assert lines[0] == "nameserver 100.127.255.253"
    assert lines[-1] == "0", "nano-init bind-mounted over a resolv.conf that was already right"


def test_host_names_in_etc_hosts_do_not_bypass_the_virtual_dns(nano, dummy_boundary, nano_tmp):
    """A by-hand launch sees the host's /etc/hosts: its test-host names would give the agent
    real addresses (refused as unresolved-address) or loopback ones inside the sandbox.
    nano-init puts a localhost-only file over it in its own mount namespace, so such a name
    goes to the virtual DNS; the host's file is untouched."""
    hosts = nano_tmp / "host-hosts"
    hosts.write_text("127.0.0.1 localhost\n198.18.77.2 good.trial.example\n"
                     "127.0.0.1 loop.trial.example\n")
    r = _run_nano_with_file_over(dummy_boundary.path, hosts, "/etc/hosts",
                                 "getent hosts good.trial.example loop.trial.example; "
                                 "grep -c trial /etc/hosts || true")
    lines = r.stdout.splitlines()
    assert lines[-1] == "0", r.stdout  # the sandbox's /etc/hosts names neither
    addresses = [line.split()[0] for line in lines[:-1]]
    # Synthetic: 100.64.0.0/10 or 100::/64.
    assert len(addresses) == 2 and all(a.startswith(("100.", "100::")) for a in addresses), r.stdout
    assert "good.trial.example" in hosts.read_text()


def test_root_of_the_machine_runs_the_agent_only_as_the_user_it_names(nano, dummy_boundary,
                                                                      nano_tmp):
    """Started by root of the machine (the by-hand launch), nano-init refuses to leave the agent
    at uid 0, where it would own every root-owned file and could signal every root process,
    capabilities or not; with --create-namespaces --user 65534:65534 the agent runs as nobody
    and cannot write where root alone may."""
    marker = nano_tmp / "root-agent-ran"
    # Dropping CAP_SYS_ADMIN changes nothing: the uid still owns root's files.
    no_sys_admin = ["setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin"]
    for argv in (["unshare", "--net", "--pid", "--fork", "--mount-proc", str(NANO_INIT), "run",
                  "--create-namespaces", dummy_boundary.path, "touch", str(marker)],
                 [str(NANO_INIT), "supervise", "touch", str(marker)],
                 [*no_sys_admin, str(NANO_INIT), "run", "--create-namespaces",
                  dummy_boundary.path, "touch", str(marker)],
                 # A launcher's user namespace that maps uid 0 to uid 0 changes nothing.
                 ["unshare", "-r", str(NANO_INIT), "supervise", "touch", str(marker)],
                 # Nor does an effective uid lowered while the real one stays 0.
                 ["setpriv", "--euid", "65534", str(NANO_INIT), "supervise", "touch",
                  str(marker)]):
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        assert r.returncode == 2, r.stderr
        assert "refusing to run the agent as uid 0 of this machine" in r.stderr, r.stderr
        assert "--user" in r.stderr, r.stderr
        assert not marker.exists()
    # Root without CAP_SYS_ADMIN (a pod's container) makes a user namespace with setgroups
    # denied: --user naming its own ids is taken, another is refused before the agent runs.
    r = subprocess.run([*no_sys_admin, str(NANO_INIT), "run", "--create-namespaces", "--user",
                        "0:0", dummy_boundary.path, "id", "-u"],
                       capture_output=True, text=True, timeout=30)
    assert (r.returncode, r.stdout) == (0, "0\n"), r.stderr
    r = subprocess.run([*no_sys_admin, str(NANO_INIT), "run", "--create-namespaces", "--user",
                        "65534:65534", dummy_boundary.path, "touch", str(marker)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 70 and "cannot be taken" in r.stderr, r.stderr
    assert not marker.exists()
    # There, supplementary groups cannot be dropped: a held one (disk) is refused, not kept.
    r = subprocess.run(["setpriv", "--groups", "6", *no_sys_admin[1:], str(NANO_INIT), "run",
                        "--create-namespaces", "--user", "0:0", dummy_boundary.path, "touch",
                        str(marker)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 126 and "supplementary groups" in r.stderr, r.stderr
    assert not marker.exists()
    rootonly = nano_tmp / "root-only"
    rootonly.mkdir(mode=0o755)
    r = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", str(NANO_INIT), "run",
         "--create-namespaces", "--user", "65534:65534", dummy_boundary.path, "sh", "-c",
         f"id -u; touch {rootonly}/planted 2>/dev/null && echo wrote || echo denied; "
         "ip -o link show | cut -d: -f2"],
        capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split()
    assert lines[:2] == ["65534", "denied"], r.stdout
    assert "tun0" in lines, r.stdout
    assert not (rootonly / "planted").exists()


def test_launched_by_hand_nothing_of_the_agent_outlives_the_sandbox(nano, dummy_boundary):
    """Not PID 1 (a by-hand launch), nano-init makes a PID namespace of its own: the agent,
    even at nano-init's uid, cannot kill it (it is PID 1 there, and its launcher cannot be
    named), and a setsid'd process that ignores SIGTERM dies with the sandbox instead of
    being adopted by the host's init."""
    tag = f"3{os.getpid() % 1000}.25"  # a sleep length no other process uses
    r = subprocess.run(
        [str(NANO_INIT), "run", "--create-namespaces", "--user", "0:0", dummy_boundary.path,
         "sh", "-c",
         f"(setsid sh -c 'trap \"\" TERM; exec sleep {tag}' &); sleep 0.2; "
         "kill -9 1; kill -9 $PPID; echo pid=$$; ls /proc | grep -c '^[0-9]'; exit 3"],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 3, r.stderr  # nano-init lived to report the agent's status
    lines = r.stdout.split()
    assert lines[0] == "pid=2", r.stdout  # its own PID namespace, nano-init as PID 1
    assert int(lines[1]) < 10, r.stdout   # its /proc lists the sandbox's processes only
    left = subprocess.run(["pgrep", "-f", f"sleep {tag}"], capture_output=True, text=True)
    assert left.stdout == "", f"a process of the agent outlived the sandbox: {left.stdout}"


def test_a_stop_asked_for_while_the_sandbox_is_set_up_is_acted_on(nano, dummy_boundary):
    """SIGTERM a moment after the launch, while nano-init still makes its namespaces and
    tun0: it stays pending and stops the agent once it runs (143), instead of being dropped
    (PID 1 of a new PID namespace ignores what it has no handler for) and letting the agent
    run to its end."""
    for delay in (0.0, 0.002, 0.005, 0.02):
        p = subprocess.Popen([str(NANO_INIT), "run", "--create-namespaces", "--user", "0:0",
                              dummy_boundary.path, "sleep", "60"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
        time.sleep(delay)
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            raise AssertionError(f"SIGTERM {delay}s after the launch was lost")
        p.stderr.close()
        # Before nano-init blocked it (right after exec) the signal's default action ends it.
        assert rc in (143, -signal.SIGTERM), (delay, rc)


def test_slips_are_named_before_anything_runs(nano, dummy_boundary, nano_tmp):
    """A BOUNDARY path with no socket (a typo, or BOUNDARY left out so that the command's
    first word took its place) and nano-init's options written after BOUNDARY each get a
    line saying so, instead of only every flow failing or a refusal asking for what was
    given."""
    r = run_nano(nano_tmp / "typo.sock", ["true"])
    assert r.returncode == 0, r.stderr
    assert f"BOUNDARY {nano_tmp / 'typo.sock'} is no socket (yet)" in r.stderr, r.stderr
    r = run_nano(dummy_boundary.path, ["true"])
    assert "is no socket" not in r.stderr, r.stderr
    r = subprocess.run([str(NANO_INIT), "run", dummy_boundary.path, "--user", "0:0", "true"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, r.stderr
    assert "--user after BOUNDARY is part of the agent's command" in r.stderr, r.stderr


def test_the_agent_starts_with_no_blocked_or_ignored_forwarded_signal(nano, dummy_boundary):
    """A launcher that blocked signals and ignored SIGINT (as a shell's `&` does): the agent
    still starts with nothing blocked and SIGINT at its default, so what nano-init forwards
    takes effect."""
    launcher = ("import signal, subprocess, sys\n"
                "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM, signal.SIGTERM})\n"
                "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                "sys.exit(subprocess.run(sys.argv[1:]).returncode)\n")
    r = subprocess.run(["/usr/bin/python3", "-c", launcher, str(NANO_INIT), "supervise", "--user",
                        "0:0", "grep", "-E", "^Sig(Blk|Ign)", "/proc/self/status"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    fields = dict(line.split(":\t") for line in r.stdout.splitlines())
    assert int(fields["SigBlk"], 16) == 0, r.stdout
    assert int(fields["SigIgn"], 16) & (1 << (signal.SIGINT - 1)) == 0, r.stdout
