"""compass-runner's microvm tier with egress `firewall`, end to end under `--accel tcg`:
`compass-runner run --backend microvm --accel tcg --egress firewall --egress-allow
allowed.example:80 -- CMD…`, a real QEMU `-M microvm` guest with a virtio-net NIC, the runner's
DNS forwarder, and the test hosts of runner_hosts.py.

    root netns
      compass-runner: the per-agent DNS forwarder (refusals logged as JSON on its stderr)
      cv<id>  10.231.x.(4n+1)/30, fd5a:7c3e:91b4:N::1/64 — the guest's resolver and gateway,
              NAT (table inet compass_nat_<id>) to cr-up
      cr-up-h 198.18.5.1 — runner_hosts.py's test hosts: allowed.example (198.18.5.2,
              2001:db8:5::2), denied.example (.3, ::3), an outside DNS server on every one of
              their addresses (UDP+TCP 53), a listener on :853
    netns compass-<id>
      QEMU's tap, bridged to the veth's other end
    the guest (QEMU -M microvm, TCG)
      lo, eth0 10.231.x.(4n+2)/30, fd5a:7c3e:91b4:N::2/64, default routes via the host end;
      /etc/resolv.conf names the host end; `table inet compass_egress` (default deny, the
      allowed sets the forwarder fills) armed by the guest's root before the agent runs;
      the agent: uid 1000, gid 1000, no capability

Every boot costs 20 to 60 s of emulated CPU on a loaded 2-CPU host, so one guest runs every
probe and prints one JSON line (the `probes` fixture); a second guest (`sleep 600`) is looked
at from the host while it runs, then its runner is killed with SIGKILL and `compass-runner gc`
must leave nothing. The sidecar refusal boots nothing.

Skipped (saying why) when not root or when the guest kernel or QEMU is missing. Binaries as
in test_runner_microvm.py (COMPASS_RUNNER; microvm_lib.py). Nothing here sends traffic
anywhere but loopback, the guest's netns and the test hosts' netns.
"""

import ipaddress
import json
import os
import pathlib
import re
import socket
import subprocess
import time

import pytest

from microvm_lib import (ALLOW, PROBE_HELPERS, STATE_ROOT, TCG, Live, build_image,
                         guest_missing, guests_of, leftovers, runner)
from runner_hosts import runner_hosts  # noqa: F401 (a fixture)
import runner_hosts as rh

FIREWALL = ("--egress", "firewall")
ARMED = "egress firewall armed in the guest"
POOL4 = ipaddress.ip_network("10.231.0.0/16")
POOL6 = ipaddress.ip_network("fd5a:7c3e:91b4::/48")

CURL_NO_RESOLVE = 6      # curl: "Could not resolve host"
CURL_CONNECT_FAILED = 7  # curl: "Failed to connect" (reset / refused / admin-prohibited)
CURL_TIMEOUT = 28        # what a silently dropped packet would give


@pytest.fixture(scope="module")
def image():
    why = guest_missing()
    if why:
        pytest.skip(why)
    build_image()


# The agent's probes. argv[1] is the test hosts' names and addresses (JSON). Each check is
# run before the next, the attempts on the ruleset near the end, and the "after" checks last.
PROBE_SCRIPT = PROBE_HELPERS + r'''
import time
H = json.loads(sys.argv[1])
def timed(*cmd):
    start = time.monotonic()
    r = run(*cmd)
    r["secs"] = round(time.monotonic() - start, 1)
    return r
def curl(*args):
    return timed("curl", "-sS", "-m", "20", *args)
def dig(*args):
    return timed("dig", "+time=3", "+tries=1", *args)
def ip_json(*args):
    r = run("ip", "-j", *args)
    try:
        r["json"] = json.loads(r["out"])
    except ValueError:
        r["json"] = None
    return r
def url(addr, port=80):
    return "http://" + ("[%s]" % addr if ":" in addr else addr) + ":%d/" % port
status = open("/proc/self/status").read()
res = {
  # First, before the agent has asked DNS anything: the launch step resolved the allowed
  # names through the forwarder (seed 000: DNS first, then the names), so their addresses
  # are already open.
  "curl4_literal_first": curl(url(H["allowed4"])),
  "curl6_literal_first": curl("-g", url(H["allowed6"])),
  "lo": run("sh", "-c", "python3 -c 'import socket; s=socket.socket(); s.bind((\"127.0.0.1\", 0)); s.listen(); c=socket.create_connection(s.getsockname()); print(\"ok\")'"),
  "uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
  "status": {k: v.strip() for k, v in (l.split(":", 1) for l in status.splitlines())},
  "links": ip_json("link", "show"),
  "addrs": ip_json("addr", "show", "dev", "eth0"),
  "routes4": ip_json("-4", "route", "show", "default"),
  "routes6": ip_json("-6", "route", "show", "default"),
  "resolv": open("/etc/resolv.conf").read(),
  "curl4_allowed": curl("-4", url(H["allowed"])),
  "curl6_allowed": curl("-6", url(H["allowed"])),
  "dig_allowed_a": dig("+short", H["allowed"], "A"),
  "dig_allowed_aaaa": dig("+short", H["allowed"], "AAAA"),
  "dig_denied_a": dig(H["denied"], "A"),
  "dig_denied_aaaa": dig(H["denied"], "AAAA"),
  "curl_denied_name": curl(url(H["denied"])),
  "curl6_denied_name": curl("-6", url(H["denied"])),
  "curl_denied_v4": curl(url(H["denied4"])),
  "curl_denied_v6": curl("-g", url(H["denied6"])),
  "curl_outside_53": curl(url(H["denied4"], 53)),
  "curl_outside_853": curl(url(H["denied4"], 853)),
  "curl_outside6_53": curl("-g", url(H["denied6"], 53)),
  "curl_outside6_853": curl("-g", url(H["denied6"], 853)),
  "curl4_allowed_853": curl("-4", url(H["allowed"], 853)),
  "curl6_allowed_853": curl("-6", url(H["allowed"], 853)),
  "dig_outside": dig("@" + H["denied4"], H["allowed"]),
  "dig_outside6": dig("@" + H["denied6"], H["allowed"]),
  "dig_outside_tcp": dig("+tcp", "@" + H["denied4"], H["allowed"]),
  "dig_allowed_host_53": dig("@" + H["allowed4"], H["allowed"]),
  "ports": open_ports(),
  "unshare_user": run("unshare", "-Urn", "true"),
  "nft_flush": run("nft", "flush", "ruleset"),
  "ip_link_add": run("ip", "link", "add", "dummy0", "type", "dummy"),
  "links_after": ip_json("link", "show"),
  "curl4_allowed_after": curl("-4", url(H["allowed"])),
  "curl6_allowed_after": curl("-6", url(H["allowed"])),
  "curl_denied_v4_after": curl(url(H["denied4"])),
}
print("PROBES " + json.dumps(res), flush=True)
sys.exit(7)
'''

HOSTS = {"allowed": rh.ALLOWED, "denied": rh.DENIED, "allowed4": rh.ALLOWED_V4,
         "allowed6": rh.ALLOWED_V6,
         "denied4": rh.DENIED_V4, "denied6": rh.DENIED_V6}


@pytest.fixture(scope="module")
def probes(image, runner_hosts):
    """One firewall guest runs every probe and exits 7; the tests below read its answers."""
    start = time.monotonic()
    try:
        # localhost: allowed, but only ever answered with nothing (a loopback address is never
        # opened), so the launch step's look-up says it has no address.
        r = runner("run", *TCG, *FIREWALL, "--egress-allow", ALLOW, "--egress-allow", "localhost",
                   "--memory", "384m", "--",
                   "python3", "-c", PROBE_SCRIPT, json.dumps(HOSTS), timeout=900)
    except subprocess.TimeoutExpired as e:
        runner("gc")  # the killed runner's guest, netns, veth and NAT table
        pytest.fail(f"the probe guest ran over 900 s\n{e.stdout}\n{e.stderr}")
    m = re.search(r"agent (a[0-9a-f]{10}) running", r.stderr)
    left = leftovers(m.group(1)) if m else None  # at once: the runner has exited
    line = [l for l in r.stdout.splitlines() if l.startswith("PROBES ")]
    assert line, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    res = json.loads(line[0][len("PROBES "):])
    res["_run"] = {"rc": r.returncode, "stdout": r.stdout, "stderr": r.stderr,
                   "id": m.group(1) if m else None, "leftovers": left,
                   "seconds": round(time.monotonic() - start, 1)}
    return res


def _show(probes, *keys):
    return json.dumps({k: probes[k] for k in keys}, indent=1)


def _guest_addresses(probes):
    """eth0's global IPv4 and IPv6 addresses in the guest, as ip_interface objects."""
    info = probes["addrs"]["json"]
    assert info, probes["addrs"]
    found = [ipaddress.ip_interface(f"{a['local']}/{a['prefixlen']}")
             for a in info[0].get("addr_info", []) if a.get("scope") == "global"]
    v4 = [a for a in found if a.version == 4]
    v6 = [a for a in found if a.version == 6]
    assert len(v4) == 1 and len(v6) == 1, probes["addrs"]
    return v4[0], v6[0]


def _slot4(host):
    return (int(host) - int(POOL4.network_address)) // 4


def _slot6(host):
    return (int(host) >> 64) & 0xFFFF


# ---------------------------------------------------------------------------------------
# 1. The guest's network: eth0 on the per-agent /30 and /64, the host end its gateway and
#    resolver, and nothing else


def test_guest_has_exactly_lo_and_eth0(probes):
    links = sorted(l["ifname"] for l in probes["links"]["json"] or [])
    assert links == ["eth0", "lo"], probes["links"]


def test_eth0_is_on_the_agents_subnet_with_default_routes_via_the_host_end(probes):
    v4, v6 = _guest_addresses(probes)
    # IPv4: 10.231.x.(4n+2)/30; IPv6: fd5a:7c3e:91b4:N::2/64; one slot n for both.
    assert v4.network.prefixlen == 30 and v4.ip in POOL4, (str(v4), probes["addrs"])
    assert int(v4.ip) - int(v4.network.network_address) == 2, str(v4)
    assert v6.network.prefixlen == 64 and v6.ip in POOL6, (str(v6), probes["addrs"])
    assert int(v6.ip) & ((1 << 64) - 1) == 2, str(v6)
    assert _slot4(v4.ip) == _slot6(v6.ip), (str(v4), str(v6))
    host4, host6 = v4.ip - 1, v6.ip - 1
    for family, host in (("routes4", host4), ("routes6", host6)):
        routes = probes[family]["json"] or []
        gateways = [(ipaddress.ip_address(r["gateway"]), r.get("dev")) for r in routes
                    if r.get("dst") == "default" and "gateway" in r]
        assert gateways == [(host, "eth0")], (str(host), probes[family])


def test_resolv_conf_names_the_host_end_in_both_families(probes):
    v4, v6 = _guest_addresses(probes)
    servers = re.findall(r"^nameserver\s+(\S+)", probes["resolv"], re.M)
    assert sorted(map(str, map(ipaddress.ip_address, servers))) == sorted(
        [str(v4.ip - 1), str(v6.ip - 1)]), probes["resolv"]


def test_the_forwarder_answers_allowed_names_with_their_real_addresses(probes):
    # Not the boundary's virtual 100.x addresses: the test hosts' own.
    assert probes["dig_allowed_a"]["out"].split() == [rh.ALLOWED_V4], probes["dig_allowed_a"]
    assert probes["dig_allowed_aaaa"]["out"].split() == [rh.ALLOWED_V6], \
        probes["dig_allowed_aaaa"]


# ---------------------------------------------------------------------------------------
# 2. Armed in the guest before the agent runs


def test_allowed_names_were_opened_before_the_agent_asked(probes):
    # The agent's very first act: the allowed host by its literal addresses, no DNS asked.
    for key in ("curl4_literal_first", "curl6_literal_first"):
        assert probes[key]["rc"] == 0, _show(probes, key)
        assert probes[key]["out"] == rh.ALLOWED + "\n", _show(probes, key)


def test_loopback_is_up_in_the_guest(probes):
    assert probes["lo"]["rc"] == 0 and probes["lo"]["out"].strip() == "ok", _show(probes, "lo")


def test_an_allowed_name_without_an_address_is_said_before_the_agent_runs(probes):
    err = probes["_run"]["stderr"]
    running = err.index("running (tier microvm")
    for qtype in ("A", "AAAA"):
        line = [l for l in err.splitlines()
                if "allowed name has no address yet" in l and '"name":"localhost"' in l
                and f'"qtype":"{qtype}"' in l]
        assert line and err.index(line[0]) < running, err
    assert "allowed name has no address yet" not in "".join(
        l for l in err.splitlines() if rh.ALLOWED in l), err


def test_the_runner_says_the_firewall_was_armed_in_the_guest(probes):
    assert ARMED in probes["_run"]["stderr"], probes["_run"]["stderr"]


# ---------------------------------------------------------------------------------------
# 3. What the agent gets and does not


def test_agent_is_uid_1000_without_capabilities(probes):
    st = probes["status"]
    assert (probes["uid"], probes["gid"]) == (1000, 1000), (probes["uid"], probes["gid"])
    assert st["CapEff"] == "0000000000000000", {k: st[k] for k in st if k.startswith("Cap")}


def test_allowed_name_over_ipv4_and_ipv6(probes, runner_hosts):
    assert runner_hosts.fetch(runner_hosts.ALLOWED_V4) == "allowed.example\n"
    for key in ("curl4_allowed", "curl6_allowed"):
        assert probes[key]["rc"] == 0, _show(probes, key)
        assert probes[key]["out"] == "allowed.example\n", _show(probes, key)


def test_denied_name_is_refused_by_dns(probes):
    for key in ("dig_denied_a", "dig_denied_aaaa"):
        assert "status: REFUSED" in probes[key]["out"], _show(probes, key)
        assert "ANSWER SECTION" not in probes[key]["out"], _show(probes, key)
    for key in ("curl_denied_name", "curl6_denied_name"):
        assert probes[key]["rc"] == CURL_NO_RESOLVE, _show(probes, key)


def test_denied_addresses_fail_fast_not_by_timeout(probes, runner_hosts):
    # The hosts answer from the root netns: only the guest's ruleset stands in the way.
    assert runner_hosts.fetch(runner_hosts.DENIED_V4) == "denied.example\n"
    for key in ("curl_denied_v4", "curl_denied_v6"):
        # 7 = the SYN answered with a reset or an admin-prohibited; 28 would be a drop.
        assert probes[key]["rc"] == CURL_CONNECT_FAILED, _show(probes, key)
        assert "denied.example" not in probes[key]["out"], _show(probes, key)


def test_outside_resolver_and_other_ports_of_the_allowed_host_fail_fast(probes):
    keys = ("curl_outside_53", "curl_outside_853", "curl_outside6_53", "curl_outside6_853",
            "curl4_allowed_853", "curl6_allowed_853")
    for key in keys:
        assert probes[key]["rc"] == CURL_CONNECT_FAILED, _show(probes, key)


def test_outside_resolver_gets_no_query(probes):
    # The outside server answers every query with an address: any answer has escaped. The
    # allowed host runs one too, and allowed.example:80 does not open its port 53.
    for key in ("dig_outside", "dig_outside6", "dig_outside_tcp", "dig_allowed_host_53"):
        assert probes[key]["rc"] != 0, _show(probes, key)
        assert "ANSWER SECTION" not in probes[key]["out"], _show(probes, key)


def test_agent_cannot_change_the_ruleset_or_the_links(probes):
    for key in ("nft_flush", "ip_link_add"):
        assert probes[key]["rc"] != 0, _show(probes, key)
    links = sorted(l["ifname"] for l in probes["links_after"]["json"] or [])
    assert links == ["eth0", "lo"], probes["links_after"]
    # The ruleset is as it was: the allowed name still works, a denied address still fails.
    for key in ("curl4_allowed_after", "curl6_allowed_after"):
        assert probes[key]["rc"] == 0, _show(probes, "nft_flush", key)
        assert probes[key]["out"] == "allowed.example\n", _show(probes, "nft_flush", key)
    assert probes["curl_denied_v4_after"]["rc"] == CURL_CONNECT_FAILED, \
        _show(probes, "nft_flush", "curl_denied_v4_after")


def test_agent_cannot_open_the_control_ports(probes):
    ports = probes["ports"]
    assert ports, "no /dev/vport* in the guest: nothing was tried"
    assert "opened" not in ports.values(), ports


def test_agent_gets_no_user_namespace(probes):
    assert probes["unshare_user"]["rc"] != 0, probes["unshare_user"]


# ---------------------------------------------------------------------------------------
# 4. The forwarder's refusals on the runner's stderr


def test_the_forwarders_refusals_are_logged_with_their_reason(probes):
    err = probes["_run"]["stderr"]
    hits = [l for l in err.splitlines() if '"reason":"denied-name"' in l]
    assert hits, err
    assert any(rh.DENIED in l for l in hits), hits


# ---------------------------------------------------------------------------------------
# 5. The agent's status, and nothing left once it exits


def test_the_runner_exits_with_the_agents_status(probes):
    run = probes["_run"]
    assert run["rc"] == 7, (run["rc"], run["stderr"])


def test_nothing_is_left_after_the_agent_exits(probes):
    run = probes["_run"]
    assert run["id"], run["stderr"]
    assert run["leftovers"] == [], run["leftovers"]


# ---------------------------------------------------------------------------------------
# 6. A live guest seen from the host; then kill -9 of its runner and gc


@pytest.fixture(scope="module")
def live(image, runner_hosts):
    guest = Live("sleep", "600", extra=(*FIREWALL, "--memory", "384m"))
    try:
        yield guest
    finally:
        guest.end()


def test_a_live_guest_has_its_netns_veth_and_nat_table_and_no_sam_box(live):
    armed = live.read_until(re.escape(ARMED), 60)
    assert armed, live.err
    rec = live.record
    want = {"tier": "microvm", "posture": "firewall", "egress_armed_in_guest": True,
            "netns": f"compass-{live.id}", "veth": f"cv{live.id}"}
    assert {k: rec.get(k) for k in want} == want, rec
    procs = guests_of(live.id)
    assert [p for p in procs if p.startswith("qemu-system")], procs
    assert not [p for p in procs if p.startswith("sam-box")], procs
    assert pathlib.Path(f"/run/netns/compass-{live.id}").exists(), sorted(
        os.listdir("/run/netns") if os.path.isdir("/run/netns") else [])
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    assert f"table inet compass_nat_{live.id}" in tables, tables
    # The host end of the veth: 10.231.x.(4n+1)/30 and fd5a:7c3e:91b4:N::1/64, one slot.
    r = subprocess.run(["ip", "-j", "addr", "show", "dev", f"cv{live.id}"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)[0]
    ends = [ipaddress.ip_interface(f"{a['local']}/{a['prefixlen']}")
            for a in info.get("addr_info", []) if a.get("scope") == "global"]
    v4 = [a for a in ends if a.version == 4]
    v6 = [a for a in ends if a.version == 6]
    assert len(v4) == 1 and len(v6) == 1, r.stdout
    assert v4[0].network.prefixlen == 30 and v4[0].ip in POOL4, str(v4[0])
    assert int(v4[0].ip) - int(v4[0].network.network_address) == 1, str(v4[0])
    assert v6[0].network.prefixlen == 64 and v6[0].ip in POOL6, str(v6[0])
    assert int(v6[0].ip) & ((1 << 64) - 1) == 1, str(v6[0])
    assert _slot4(v4[0].ip) == _slot6(v6[0].ip), (str(v4[0]), str(v6[0]))
    # QEMU's tap is in the agent's netns.
    links = subprocess.run(["ip", "-n", f"compass-{live.id}", "-d", "-o", "link", "show"],
                           capture_output=True, text=True)
    assert re.search(r"\btun type tap\b", links.stdout), links.stdout + links.stderr
    # The netns only carries frames: no address on any of its links, not even a link-local
    # one, so root in the guest finds no IP stack there to talk to.
    addrs = subprocess.run(["ip", "-n", f"compass-{live.id}", "-o", "addr", "show"],
                           capture_output=True, text=True)
    assert addrs.returncode == 0 and not re.search(r"\binet6? ", addrs.stdout), addrs.stdout


FETCH = r"""
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
try:
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
        print(s.recv(4096).decode(errors="replace").split("\r\n\r\n", 1)[-1].strip())
except OSError as e:
    print("error: " + type(e).__name__)
"""


def test_a_guest_whose_own_ruleset_is_gone_still_reaches_only_the_allowlist(live, runner_hosts):
    """What root in the guest (a guest-kernel exploit) could do: drop the guest's ruleset. Played
    from the agent's netns: tap0 leaves the bridge and the bridge takes the guest's addresses,
    so packets reach the host exactly as the guest's would, with no guest ruleset in the way.
    The host table's copy of the allow sets still lets out only the pre-resolved allowed host."""
    assert live.read_until(re.escape(ARMED), 60), live.err
    ns = f"compass-{live.id}"
    table = subprocess.run(["nft", "list", "table", "inet", f"compass_nat_{live.id}"],
                           capture_output=True, text=True).stdout
    assert f"{rh.ALLOWED_V4} . 80" in table and f"{rh.ALLOWED_V6} . 80" in table, table
    r = subprocess.run(["ip", "-j", "addr", "show", "dev", f"cv{live.id}"],
                       capture_output=True, text=True)
    ends = [ipaddress.ip_interface(f"{a['local']}/{a['prefixlen']}")
            for a in json.loads(r.stdout)[0]["addr_info"] if a.get("scope") == "global"]
    host4 = next(a for a in ends if a.version == 4)
    host6 = next(a for a in ends if a.version == 6)
    batch = (f"link set tap0 nomaster\n"
             f"addr add {host4.ip + 1}/30 dev br0\n"
             f"addr add {host6.ip + 1}/64 dev br0 nodad\n"
             f"route add default via {host4.ip}\n"
             f"route add ::/0 via {host6.ip}\n")
    r = subprocess.run(["ip", "-n", ns, "-batch", "-"], input=batch, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr

    def fetch(addr, port):
        return subprocess.run(["ip", "netns", "exec", ns, "python3", "-c", FETCH, addr,
                               str(port)], capture_output=True, text=True,
                              timeout=30).stdout.strip()

    assert fetch(rh.ALLOWED_V4, 80) == rh.ALLOWED
    assert fetch(rh.ALLOWED_V6, 80) == rh.ALLOWED
    for addr, port in ((rh.DENIED_V4, 80), (rh.DENIED_V6, 80), (rh.ALLOWED_V4, 853),
                       (rh.DENIED_V4, 853)):
        got = fetch(addr, port)
        assert got.startswith("error"), (addr, port, got)


def test_kill_9_of_the_runner_then_gc_leaves_nothing(live):
    assert live.proc.poll() is None, live.err
    assert leftovers(live.id), "the live agent has nothing on the host to remove"
    live.proc.kill()
    live.proc.wait()
    r = runner("gc")
    assert r.returncode == 0, r.stderr
    assert live.id in r.stdout, (r.stdout, r.stderr)
    assert leftovers(live.id) == []
    assert runner("gc").stdout.count(live.id) == 0


# ---------------------------------------------------------------------------------------
# 7. Refused before anything is made


def _firewall_names():
    """The state dirs, netns compass-*, links cv* and NAT tables on the host now."""
    names = set()
    if STATE_ROOT.is_dir():
        names |= {f"state dir {d}" for d in os.listdir(STATE_ROOT)}
    if pathlib.Path("/run/netns").is_dir():
        names |= {f"netns {n}" for n in os.listdir("/run/netns") if n.startswith("compass-")}
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    names |= {f"link {n}" for n in re.findall(r"^\d+: (cv[^:@]+)", links, re.M)}
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    names |= {f"nft {t}" for t in re.findall(r"^table inet (compass_nat_\S+)", tables, re.M)}
    return names


def test_sidecar_socket_with_egress_firewall_is_refused(image, tmp_path):
    # A real Unix socket and a bundle: the posture is the only reason left to refuse.
    sock_path = tmp_path / "node.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(sock_path))
    sock.listen(1)
    bundle = tmp_path / "bundle.yaml"
    bundle.write_text("version: v1\nagent:\n  id: researcher-1.test.example\n"
                      "egress:\n  allow: [allowed.example]\n")
    before = _firewall_names()
    try:
        r = runner("run", *TCG, *FIREWALL, "--bundle", str(bundle), "--sidecar-socket",
                   str(sock_path), "--", "true", timeout=120)
    finally:
        sock.close()
    assert r.returncode != 0, (r.returncode, r.stdout, r.stderr)
    assert "--sidecar-socket" in r.stderr, r.stderr
    assert "not built yet" not in r.stderr, r.stderr
    assert not re.search(r"agent a[0-9a-f]{10} running", r.stderr), r.stderr
    assert sorted(_firewall_names() - before) == []
