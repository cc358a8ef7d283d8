"""Egress `firewall` (seeds 000/002; issue 4): the real veth, nft rulesets, DNS forwarder and
test hosts, seen from inside the sandbox by an unprivileged process.

    root netns
      firewall_driver (tests/integration/firewall_driver.cc: firewall::arm(), then waits),
        in a private mount namespace whose /etc/hosts is this module's own file (so a test
        can move a name without touching the host's /etc/hosts)
      cv<id>  10.231.x.1 / fd5a:7c3e:91b4:n::1  — the sandbox's resolver, NAT to cr-up
      cr-up-h 198.18.5.1                         — runner_hosts.py's test hosts
    netns cfw…  (made here, holding only lo before arm())
      eth0 10.231.x.2 / …::2; /etc/netns/<ns>/resolv.conf names the resolver
      commands run as uid 65534 with no capabilities (setpriv), as an agent would

Nothing here sends traffic anywhere but loopback and the namespaces the tests create.
`compass-runner run --backend podman --egress firewall` is tested at the end when the podman
tier is built (COMPASS_RUNNER), with the same checks from inside the container.
"""

import json
import os
import pathlib
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

import boxlib

from runner_hosts import runner_hosts  # noqa: F401 (a fixture)
import runner_hosts as rh
from shell import sigterm_once_started

REPO = pathlib.Path(__file__).resolve().parents[2]


def _binary(env, default):
    p = pathlib.Path(os.environ.get(env, REPO / default))
    return p if p.is_absolute() else REPO / p


DRIVER = _binary("FIREWALL_DRIVER", "build/src/compass-runner/firewall_driver")
RUNNER = _binary("COMPASS_RUNNER", "build/src/compass-runner/compass-runner")

AGENT = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
         "--inh-caps=-all", "--bounding-set=-all"]

CURL_CONNECT_FAILED = 7  # curl: "Failed to connect" (refused / reset / unreachable)
CURL_NO_RESOLVE = 6      # curl: "Could not resolve host"
CURL_TIMEOUT = 28


def sh(*cmd, check=True, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def hosts_text(moving_v4=rh.ALLOWED_V4, moving_v6=rh.ALLOWED_V6):
    return ("127.0.0.1 localhost\n::1 localhost ip6-localhost\n"
            f"{rh.ALLOWED_V4} {rh.ALLOWED}\n{rh.ALLOWED_V6} {rh.ALLOWED}\n"
            f"{rh.DENIED_V4} {rh.DENIED}\n{rh.DENIED_V6} {rh.DENIED}\n"
            f"{rh.DENIED_V4} www.wild.example wild.example\n"
            f"{rh.DENIED_V6} www.wild.example wild.example\n"
            f"127.0.0.1 loop.example\n::1 loop.example\n"
            f"169.254.169.254 metadata.example\n::ffff:127.0.0.1 metadata.example\n"
            f"{moving_v4} moving.example\n{moving_v6} moving.example\n"
            f"{rh.ALLOWED_V4} v4only.example\n")


def write_in_place(path, text):
    # The driver sees this file through a bind mount: rewrite the same inode, never rename.
    with open(path, "r+") as f:
        f.seek(0)
        f.write(text)
        f.truncate()


class Sandbox:
    """A netns armed by firewall_driver; .run() executes a command in it as an agent would."""

    def __init__(self, driver, allow, tmp):
        self.id = "t" + secrets.token_hex(5)
        self.ns = "cfw" + self.id
        self.allow = allow
        self.tmp = pathlib.Path(tmp)
        self.hosts = self.tmp / f"hosts-{self.id}"
        self.hosts.write_text(hosts_text())
        self.etc = pathlib.Path("/etc/netns") / self.ns
        self.log = self.tmp / f"driver-{self.id}.log"
        self.driver = driver
        self.proc = None
        self.info = None
        sh("ip", "netns", "add", self.ns)
        try:
            self._start(driver)
        except BaseException:
            self.close()
            raise

    def _start(self, driver):
        with open(self.log, "wb") as err:
            self.proc = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                 'mount --bind "$0" /etc/hosts && exec "$@"', str(self.hosts),
                 str(driver), self.id, self.ns, *self.allow],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=30)
            raise RuntimeError(f"firewall_driver failed ({self.proc.returncode}): "
                               + self.log.read_text(errors="replace"))
        self.info = json.loads(line)
        self.etc.mkdir(parents=True, exist_ok=True)
        (self.etc / "resolv.conf").write_text(
            f"nameserver {self.info['resolver4']}\nnameserver {self.info['resolver6']}\n"
            "options timeout:2 attempts:1\n")
        # No host names from the host's /etc/hosts: every name goes through the resolver.
        (self.etc / "hosts").write_text("127.0.0.1 localhost\n::1 localhost\n")

    @property
    def veth(self):
        return self.info["veth"]

    def run(self, *cmd, timeout=30, root=False):
        prefix = ["ip", "netns", "exec", self.ns] + ([] if root else AGENT)
        return subprocess.run(prefix + list(cmd), capture_output=True, text=True,
                              timeout=timeout)

    def curl(self, url, *opts):
        return self.run("curl", "-sS", "--max-time", "5", *opts, url)

    def dig(self, *args):
        return self.run("dig", "+tries=1", "+time=3", *args)

    def connect(self, addr, port):
        """Connects from the sandbox; returns the Python exception's name or 'connected'."""
        code = ("import socket,sys\n"
                "try:\n"
                f"  socket.create_connection(({addr!r}, {port}), timeout=5).close()\n"
                "  print('connected')\n"
                "except Exception as e:\n"
                "  print(type(e).__name__)\n")
        r = self.run("/usr/bin/python3", "-c", code)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    def log_lines(self):
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    def stop(self):
        """Tears the firewall down (stdin EOF); returns the driver's exit status."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.stdin.close()
        out = self.proc.stdout.read()
        rc = self.proc.wait(timeout=30)
        assert json.loads(out.decode().strip().splitlines()[-1]) == {"down": True}
        return rc

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.stop()
            except Exception:
                self.proc.kill()
                self.proc.wait()
        sh("ip", "netns", "del", self.ns, check=False)
        shutil.rmtree(self.etc, ignore_errors=True)
        sh(str(self.driver), "--reap", self.id, check=False)  # whatever a failed test left


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    if not DRIVER.exists():
        pytest.fail(f"{DRIVER} not built (set FIREWALL_DRIVER or build the tree)")
    # A snapshot, so that a rebuild during the session cannot swap the binary under a test.
    snap = tmp_path_factory.mktemp("fw") / "firewall_driver"
    shutil.copy2(DRIVER, snap)
    return snap


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("fwsb")


@pytest.fixture(scope="module")
def sandbox(runner_hosts, driver, tmp):
    sb = Sandbox(driver, [rh.ALLOWED, "loop.example", "metadata.example"], tmp)
    yield sb
    sb.close()


@pytest.fixture
def make_sandbox(runner_hosts, driver, tmp):
    made = []

    def make(allow):
        sb = Sandbox(driver, allow, tmp)
        made.append(sb)
        return sb

    yield make
    for sb in made:
        sb.close()


# ---------------------------------------------------------------------------------------
# The agent's view


def test_agent_runs_without_capabilities(sandbox):
    r = sandbox.run("sh", "-c", "id -u; grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split()
    assert lines[0] == "65534"
    assert "0000000000000000" in r.stdout and r.stdout.count("0000000000000000") == 3


def test_allowed_name_over_ipv4_and_ipv6(sandbox):
    r4 = sandbox.curl(f"http://{rh.ALLOWED}/", "-4")
    assert r4.returncode == 0, r4.stderr
    assert r4.stdout == "allowed.example\n"
    r6 = sandbox.curl(f"http://{rh.ALLOWED}/", "-6")
    assert r6.returncode == 0, r6.stderr
    assert r6.stdout == "allowed.example\n"


def test_allowed_name_was_opened_before_the_agent_asked(sandbox):
    # Seed 000: names are resolved from inside the sandbox once DNS is allowed, so the sets
    # hold both families at start, with the name that opened each address.
    r = sandbox.run("nft", "list", "ruleset", root=True)
    assert f'{rh.ALLOWED_V4} comment "{rh.ALLOWED}"' in r.stdout
    assert f'{rh.ALLOWED_V6} comment "{rh.ALLOWED}"' in r.stdout
    assert rh.DENIED_V4 not in r.stdout and rh.DENIED_V6 not in r.stdout


def test_denied_name_is_refused_by_dns(sandbox):
    for qtype in ("A", "AAAA", "ANY", "TXT"):
        r = sandbox.dig(rh.DENIED, qtype)
        assert "status: REFUSED" in r.stdout, r.stdout + r.stderr
    r = sandbox.curl(f"http://{rh.DENIED}/")
    assert r.returncode == CURL_NO_RESOLVE, (r.returncode, r.stderr)


def test_each_refusal_is_logged_with_its_reason(sandbox):
    sandbox.dig(f"logged-{secrets.token_hex(3)}.denied.example", "A")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        hits = [l for l in sandbox.log_lines()
                if l.get("msg") == "dns refused" and l.get("reason") == "denied-name"
                and l.get("name", "").startswith("logged-") and l.get("agent") == sandbox.id]
        if hits:
            break
        time.sleep(0.05)
    assert hits, sandbox.log.read_text()


def test_allowed_name_with_other_types_gets_no_data(sandbox):
    r = sandbox.dig(rh.ALLOWED, "TXT")
    assert "status: NOERROR" in r.stdout and "ANSWER: 0" in r.stdout, r.stdout


def test_dns_answers_over_both_resolver_addresses_and_tcp(sandbox):
    for server in (sandbox.info["resolver4"], sandbox.info["resolver6"]):
        for transport in ("+notcp", "+tcp"):
            r = sandbox.dig(f"@{server}", transport, "+short", rh.ALLOWED, "AAAA")
            assert r.stdout.strip() == rh.ALLOWED_V6, (server, transport, r.stdout, r.stderr)


def test_denied_address_fails_fast_not_by_timeout(sandbox):
    for url, family in ((f"http://{rh.DENIED_V4}/", "-4"), (f"http://[{rh.DENIED_V6}]/", "-6")):
        r = sandbox.curl(url, family)
        assert r.returncode == CURL_CONNECT_FAILED, (url, r.returncode, r.stderr)
    assert sandbox.connect(rh.DENIED_V4, 80) == "ConnectionRefusedError"
    assert sandbox.connect(rh.DENIED_V6, 80) == "ConnectionRefusedError"


def test_outside_resolver_and_dns_ports_fail(sandbox):
    # cr-up answers DNS on every address it has; the denied one is an outside resolver.
    r = sandbox.dig(f"@{rh.DENIED_V4}", rh.ALLOWED, "A")
    assert r.returncode != 0 and "ANSWER SECTION" not in r.stdout, r.stdout
    assert "timed out" not in r.stdout + r.stderr  # rejected, not silently dropped
    r6 = sandbox.dig(f"@{rh.DENIED_V6}", rh.ALLOWED, "A")
    assert r6.returncode != 0 and "ANSWER SECTION" not in r6.stdout, r6.stdout
    for port in (53, 853):
        assert sandbox.connect(rh.DENIED_V4, port) == "ConnectionRefusedError", port
        assert sandbox.connect(rh.DENIED_V6, port) == "ConnectionRefusedError", port


def test_host_services_are_out_of_reach(sandbox):
    # The host end is the resolver and nothing else; the host's other addresses are not
    # reachable either (the test hosts' gateway 198.18.5.1 is one of the host's own).
    assert sandbox.connect(sandbox.info["resolver4"], 22) == "ConnectionRefusedError"
    assert sandbox.connect(rh.HOST_V4, 80) == "ConnectionRefusedError"


def test_resolver_serves_only_its_own_sandbox(sandbox, make_sandbox):
    query = bytes.fromhex("abcd01000001000000000000") + b"\x07allowed\x07example\x00\x00\x01\x00\x01"
    # From the host itself: the resolver's address takes nothing but from its veth.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(1.5)
        s.sendto(query, (sandbox.info["resolver4"], 53))
        with pytest.raises(socket.timeout):
            s.recv(512)
    # From another agent's sandbox: its own ruleset refuses it at once.
    other = make_sandbox([rh.ALLOWED])
    r = other.dig(f"@{sandbox.info['resolver4']}", rh.ALLOWED)
    assert r.returncode != 0 and "ANSWER SECTION" not in r.stdout, r.stdout
    assert "status: NOERROR" in other.dig(rh.ALLOWED).stdout  # its own resolver answers


def test_agent_cannot_change_the_ruleset(sandbox):
    r = sandbox.run("nft", "flush", "ruleset")
    assert r.returncode != 0
    assert "Operation not permitted" in r.stderr, r.stderr
    r = sandbox.run("ip", "link", "add", "x0", "type", "dummy")
    assert r.returncode != 0
    still = sandbox.run("nft", "list", "chain", "inet", "compass_egress", "output", root=True)
    assert "policy drop" in still.stdout
    assert sandbox.curl(f"http://{rh.DENIED_V4}/").returncode == CURL_CONNECT_FAILED


def test_wildcard_names_are_opened_on_demand(make_sandbox):
    sb = make_sandbox(["*.wild.example"])
    # Not pre-resolved: the address is closed until the agent asks for the name.
    assert sb.curl(f"http://{rh.DENIED_V4}/").returncode == CURL_CONNECT_FAILED
    r = sb.curl("http://www.wild.example/")
    assert r.returncode == 0 and r.stdout == "denied.example\n", r.stderr
    sets = sb.run("nft", "list", "ruleset", root=True).stdout
    assert f'{rh.DENIED_V4} comment "www.wild.example"' in sets
    assert "status: REFUSED" in sb.dig("wild.example").stdout  # `*.x` never matches x


def test_forbidden_addresses_are_never_answered(sandbox):
    for name in ("loop.example", "metadata.example"):
        for qtype in ("A", "AAAA"):
            r = sandbox.dig("+short", name, qtype)
            assert r.returncode == 0 and r.stdout.strip() == "", (name, qtype, r.stdout)
    assert any(l.get("reason") == "forbidden-address" for l in sandbox.log_lines())


def test_host_port_rule_opens_only_that_port(make_sandbox):
    sb = make_sandbox([f"{rh.ALLOWED}:80"])
    r = sb.curl(f"http://{rh.ALLOWED}/")
    assert r.returncode == 0 and r.stdout == "allowed.example\n", r.stderr
    # cr-up runs a DNS server on the allowed address: port 53 there is not port 80.
    d = sb.dig(f"@{rh.ALLOWED_V4}", rh.ALLOWED)
    assert d.returncode != 0 and "ANSWER SECTION" not in d.stdout, d.stdout
    assert sb.connect(rh.ALLOWED_V4, 853) == "ConnectionRefusedError"
    assert sb.connect(rh.ALLOWED_V6, 853) == "ConnectionRefusedError"
    assert sb.connect(rh.ALLOWED_V6, 80) == "connected"


def test_empty_policy_is_pure_default_deny(make_sandbox):
    sb = make_sandbox([])
    assert "status: REFUSED" in sb.dig(rh.ALLOWED).stdout
    assert sb.curl(f"http://{rh.ALLOWED_V4}/").returncode == CURL_CONNECT_FAILED
    assert sb.curl(f"http://[{rh.ALLOWED_V6}]/").returncode == CURL_CONNECT_FAILED
    assert sb.run("sh", "-c", "echo ok").stdout == "ok\n"  # loopback and the rest still work


def test_a_name_that_moves_keeps_working_without_widening(make_sandbox):
    sb = make_sandbox(["moving.example"])
    assert sb.curl("http://moving.example/").stdout == "allowed.example\n"
    # The host's resolver now gives other addresses (a CDN moving the name).
    write_in_place(sb.hosts, hosts_text(moving_v4=rh.DENIED_V4, moving_v6=rh.DENIED_V6))
    r4 = sb.curl("http://moving.example/", "-4")
    assert r4.returncode == 0 and r4.stdout == "denied.example\n", r4.stderr
    r6 = sb.curl("http://moving.example/", "-6")
    assert r6.returncode == 0 and r6.stdout == "denied.example\n", r6.stderr
    # Only what the name was answered with was opened: nothing else came with it.
    sets = sb.run("nft", "list", "ruleset", root=True).stdout
    assert f'{rh.DENIED_V4} comment "moving.example"' in sets
    assert "status: REFUSED" in sb.dig(rh.DENIED).stdout


def test_only_a_name_with_no_address_at_all_is_a_warning(make_sandbox):
    # An IPv4-only host is common: its empty AAAA is said at info level, not as a warning.
    sb = make_sandbox(["v4only.example", "nowhere.example"])
    lines = sb.log_lines()

    def said(msg):
        return sorted((l["name"], l["qtype"]) for l in lines
                      if l.get("msg") == f"egress firewall: {msg}" and l.get("agent") == sb.id)

    assert said("allowed name has no address yet") == [("nowhere.example", "A"),
                                                       ("nowhere.example", "AAAA")], lines
    assert said("allowed name has no address of this family") == [("v4only.example", "AAAA")]
    assert sb.curl("http://v4only.example/").stdout == "allowed.example\n"


# ---------------------------------------------------------------------------------------
# Arming and teardown


def _leftovers(sb_id, ns=None):
    found = []
    if sh("ip", "link", "show", f"cv{sb_id}", check=False).returncode == 0:
        found.append(f"veth cv{sb_id}")
    if sh("nft", "list", "table", "inet", f"compass_nat_{sb_id}", check=False).returncode == 0:
        found.append(f"table compass_nat_{sb_id}")
    if ns is not None and pathlib.Path(f"/run/netns/{ns}").exists():
        r = sh("ip", "netns", "exec", ns, "nft", "list", "ruleset", check=False)
        if r.stdout.strip():
            found.append(f"netns ruleset: {r.stdout[:200]}")
        links = sh("ip", "-n", ns, "-o", "link", "show", check=False).stdout
        if "eth0" in links:
            found.append("eth0 in the netns")
    return found


def test_teardown_leaves_nothing(make_sandbox):
    sb = make_sandbox([rh.ALLOWED])
    assert _leftovers(sb.id, sb.ns)  # armed: all of it is there
    assert sb.stop() == 0
    assert _leftovers(sb.id, sb.ns) == []
    # The resolver's port is free again: a new agent could bind it.
    r = sh("ss", "-Hlnu", f"src {sb.info['resolver4']}", check=False)
    assert r.stdout.strip() == ""


def test_reap_removes_what_a_killed_runner_left(make_sandbox, driver):
    sb = make_sandbox([rh.ALLOWED])
    sb.proc.send_signal(signal.SIGKILL)
    sb.proc.wait()
    assert f"veth cv{sb.id}" in _leftovers(sb.id)
    r = sh(str(driver), "--reap", sb.id)
    assert json.loads(r.stdout) == {"reaped": sb.id}
    assert _leftovers(sb.id) == []


def _arm_expect_refusal(driver, ns, allow, tmp):
    sb_id = "t" + secrets.token_hex(5)
    r = subprocess.run([str(driver), sb_id, ns, *allow], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=60)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    return sb_id, r.stderr


def test_arm_refuses_a_missing_netns(driver, tmp):
    sb_id, err = _arm_expect_refusal(driver, "cfw-missing-" + secrets.token_hex(3), [], tmp)
    assert "does not exist" in err
    assert _leftovers(sb_id) == []


def test_arm_refuses_a_bad_allow_entry(driver, tmp):
    ns = "cfwbad" + secrets.token_hex(3)
    sh("ip", "netns", "add", ns)
    try:
        sb_id, err = _arm_expect_refusal(driver, ns, ["198.18.5.2"], tmp)
        assert 'allow entry "198.18.5.2"' in err and "IP literal" in err, err
        assert _leftovers(sb_id, ns) == []
    finally:
        sh("ip", "netns", "del", ns, check=False)


def test_a_failing_step_unwinds_everything_before_it(driver, tmp):
    # A netns that already has a default route: "sandbox link" fails after the veth and its
    # host addresses exist, and they must go with the refusal.
    ns = "cfwfail" + secrets.token_hex(3)
    sh("ip", "netns", "add", ns)
    try:
        sh("ip", "-n", ns, "link", "add", "x0", "type", "veth", "peer", "name", "x1")
        sh("ip", "-n", ns, "link", "set", "x0", "up")
        sh("ip", "-n", ns, "route", "add", "default", "dev", "x0")
        sh("ip", "-n", ns, "-6", "route", "add", "default", "dev", "x0")
        sb_id, err = _arm_expect_refusal(driver, ns, [rh.ALLOWED], tmp)
        assert "egress firewall: sandbox link:" in err, err
        assert _leftovers(sb_id, ns) == []
    finally:
        sh("ip", "netns", "del", ns, check=False)


# ---------------------------------------------------------------------------------------
# End to end: compass-runner run --backend podman --egress firewall


def _podman_firewall_ready():
    if not RUNNER.exists():
        return f"{RUNNER} not built (set COMPASS_RUNNER)"
    r = subprocess.run(["podman", "image", "exists", "localhost/compass-agent:latest"],
                       capture_output=True)
    if r.returncode != 0:
        return "the default image is not built (`compass-runner image build`)"
    return None


def _firewall_argv(*cmd, allow=()):
    """`compass-runner run --backend podman --egress firewall [--egress-allow A]… -- CMD…`."""
    flags = [w for a in allow for w in ("--egress-allow", a)]
    return [str(RUNNER), "run", "--backend", "podman", "--egress", "firewall", *flags, "--", *cmd]


# Each check prints "name=value"; the tests below read them. `|| true` everywhere: the
# script must reach its end whatever one check does.
AGENT_SCRIPT = f"""
echo "first=$(curl -sS --max-time 5 http://{rh.DENIED_V4}/ >/dev/null 2>&1; echo $?)"
echo "pid1=$(tr '\\0' ' ' </proc/1/cmdline)"
echo "sockets=$(ls -l /proc/$$/fd /proc/1/fd 2>/dev/null | grep -c socket:)"
echo "uid=$(id -u)"
echo "hostuid=$(awk '$1 <= 1000 && 1000 < $1 + $3 {{ print $2 + 1000 - $1 }}' /proc/self/uid_map)"
echo "capeff=$(awk '/^CapEff/ {{ print $2 }}' /proc/self/status)"
echo "v4=$(curl -4 -sS --max-time 5 http://{rh.ALLOWED}/ 2>&1)"
echo "v6=$(curl -6 -sS --max-time 5 http://{rh.ALLOWED}/ 2>&1)"
echo "denied_dns=$(dig +tries=1 +time=3 {rh.DENIED} | grep -o 'status: [A-Z]*')"
echo "denied_name_curl=$(curl -sS --max-time 5 http://{rh.DENIED}/ >/dev/null 2>&1; echo $?)"
echo "denied_v4=$(curl -sS --max-time 5 http://{rh.DENIED_V4}/ >/dev/null 2>&1; echo $?)"
echo "denied_v6=$(curl -sS --max-time 5 'http://[{rh.DENIED_V6}]/' >/dev/null 2>&1; echo $?)"
echo "outside_dns=$(dig +tries=1 +time=3 +short @{rh.DENIED_V4} {rh.ALLOWED} >/dev/null 2>&1; echo $?)"
echo "tcp53=$(curl -sS --max-time 5 telnet://{rh.DENIED_V4}:53 </dev/null >/dev/null 2>&1; echo $?)"
echo "tcp853=$(curl -sS --max-time 5 telnet://{rh.DENIED_V4}:853 </dev/null >/dev/null 2>&1; echo $?)"
echo "tcp853v6=$(curl -sS --max-time 5 'telnet://[{rh.DENIED_V6}]:853' </dev/null >/dev/null 2>&1; echo $?)"
echo "nft_flush=$(nft flush ruleset >/dev/null 2>&1; echo $?)"
echo "ip_link_add=$(ip link add x0 type veth peer name x1 >/dev/null 2>&1; echo $?)"
echo "stdin_tty=$(test -t 0 && echo yes || echo no)"
echo "dev_tty=$( (exec </dev/tty) >/dev/null 2>&1 && echo opened || echo none)"
echo "v4_after=$(curl -4 -sS --max-time 5 http://{rh.ALLOWED}/ 2>&1)"
"""


@pytest.fixture(scope="module")
def podman_agent(runner_hosts):
    why = _podman_firewall_ready()
    if why:
        pytest.skip(why)
    # The operator's terminal: a pty on stdin. The agent must not be able to reach it.
    master, slave = os.openpty()
    try:
        r = subprocess.run(
            _firewall_argv("sh", "-c", AGENT_SCRIPT, allow=[rh.ALLOWED]),
            stdin=slave, capture_output=True, text=True, timeout=180)
    finally:
        os.close(slave)
        os.close(master)
    out = dict(l.split("=", 1) for l in r.stdout.splitlines() if "=" in l)
    m = re.search(r"agent (\S+) running", r.stderr)
    return {"rc": r.returncode, "out": out, "stderr": r.stderr,
            "id": m.group(1) if m else None}


def test_podman_agent_ran(podman_agent):
    assert podman_agent["rc"] == 0, podman_agent["stderr"]
    assert podman_agent["id"], podman_agent["stderr"]
    assert "egress firewall armed" in podman_agent["stderr"]


def test_podman_agent_is_unprivileged(podman_agent):
    o = podman_agent["out"]
    assert o["uid"] != "0"
    assert o["hostuid"] not in ("", "0"), o  # container uids map to an unprivileged range
    assert int(o["hostuid"]) > 65535
    assert o["capeff"] == "0000000000000000"
    assert o["nft_flush"] != "0" and o["ip_link_add"] != "0"
    assert o["v4_after"] == rh.ALLOWED  # the flush attempt changed nothing


def test_podman_agent_starts_behind_the_armed_gate(podman_agent):
    # podman starts the container while the runner arms the netns; the container's first
    # process is nano-init's exec gate, so even the agent's very first packet meets the ruleset.
    o = podman_agent["out"]
    assert o["first"] == str(CURL_CONNECT_FAILED), o
    assert o["pid1"].startswith("/run/sam/nano-init supervise --gate-fd 3 --lifeline -- sh -c"), o
    # The agent holds no socket: nano-init keeps the gate as its lifeline, close-on-exec, in a
    # process the agent (non-root, no capability) cannot look into.
    assert o["sockets"] == "0", o


def _fake_nft(tmp, name, on_ruleset):
    """A directory holding an `nft` that runs `on_ruleset` (shell) when given the netns's
    default-drop ruleset to load, and the real nft for everything else."""
    real = shutil.which("nft")
    fake_dir = pathlib.Path(tmp) / name
    fake_dir.mkdir()
    fake = fake_dir / "nft"
    fake.write_text(f"""#!/bin/sh
case " $* " in *" -f - "*)
  input=$(cat)
  case "$input" in
    *"table inet compass_egress"*"policy drop"*) {on_ruleset} ;;
  esac
  printf '%s\\n' "$input" | exec {real} "$@" ;;
esac
exec {real} "$@"
""")
    fake.chmod(0o755)
    return dict(os.environ, PATH=f"{fake_dir}:{os.environ.get('PATH', '/usr/sbin:/usr/bin')}")


def _start_refused_by_arming(tmp, name, on_ruleset):
    """Starts an agent under a fake `nft` (`_fake_nft`) whose arming must fail after podman has
    started the container: the agent never runs and nothing is left. Returns the run."""
    why = _podman_firewall_ready()
    if why:
        pytest.skip(why)
    env = _fake_nft(tmp, name, on_ruleset)
    before = _agent_traces()
    r = subprocess.run(
        _firewall_argv("sh", "-c", "echo AGENT-RAN", allow=[rh.ALLOWED]),
        env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180)
    assert r.returncode != 0, r
    assert "AGENT-RAN" not in r.stdout + r.stderr
    assert _agent_traces() == before  # no container, netns, veth or host table left
    return r


def test_podman_arming_failure_never_runs_the_agent(runner_hosts, tmp):
    # An `nft` that refuses the netns's ruleset: the gate must close unopened.
    r = _start_refused_by_arming(tmp, "nft-refuses", 'echo "fake nft: refused" >&2; exit 1')
    assert "egress firewall: ruleset:" in r.stderr and "fake nft: refused" in r.stderr, r.stderr
    assert "closed before egress was armed" in r.stderr  # nano-init's gate said why


def test_podman_a_load_that_says_ok_but_loaded_nothing_never_runs_the_agent(runner_hosts, tmp):
    # An `nft` that exits 0 having loaded nothing (as nft 1.0.6 does with -j and a piped
    # ruleset): `verify` judges what the kernel echoed, so there is nothing to pass.
    r = _start_refused_by_arming(tmp, "nft-silent", "exit 0")
    assert "egress firewall: verify:" in r.stderr and "policy drop" in r.stderr, r.stderr


def test_podman_netns_has_no_way_out_until_its_ruleset_is_verified(runner_hosts, tmp):
    # A slow ruleset load (a loaded host): the container already sits in the netns at its gate,
    # so eth0 must stay down, with no route, for as long as the netns has no ruleset.
    why = _podman_firewall_ready()
    if why:
        pytest.skip(why)
    env = _fake_nft(tmp, "nft-slow", "sleep 2")
    before = set(pathlib.Path("/run/netns").glob("compass-*"))
    p = subprocess.Popen(
        _firewall_argv("sh", "-c", f"curl -sS --max-time 5 http://{rh.ALLOWED}/",
                       allow=[rh.ALLOWED]),
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        ns = boxlib.wait_for(
            lambda: next(iter(set(pathlib.Path("/run/netns").glob("compass-*")) - before), None),
            timeout=30, what="the agent's netns")
        samples = 0
        while p.poll() is None:
            # The link first, the table after: the runner loads the ruleset before it brings
            # eth0 up, so a table still missing after the link was read means the link was
            # read before the load (the other order raced the load and the link's set-up,
            # which follow each other within a millisecond).
            link = sh("ip", "-n", ns.name, "-o", "link", "show", "eth0", check=False).stdout
            routes = sh("ip", "-n", ns.name, "route", "show", "default", check=False).stdout
            table = sh("ip", "netns", "exec", ns.name, "nft", "list", "table", "inet",
                       "compass_egress", check=False)
            if table.returncode == 0:
                break  # armed: from here on eth0 may be up
            assert not re.search(r"[<,]UP[,>]", link), link
            assert routes.strip() == "", routes
            samples += 1
        assert samples > 0, "the ruleset was never seen missing: the fake nft did not delay it"
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        assert out.strip() == rh.ALLOWED  # armed in the end, and the allowed name works
    finally:
        p.kill()
        p.wait()


def test_podman_runner_killed_while_arming_never_runs_the_agent_and_gc_cleans(runner_hosts, tmp):
    # kill -9 of the runner while it arms (a slow nft holds it there): podman, which outlives
    # it, finishes the start; the gate is closed, so the agent never runs; gc removes the rest,
    # runc's state included.
    why = _podman_firewall_ready()
    if why:
        pytest.skip(why)
    env = _fake_nft(tmp, "nft-slow-kill", "sleep 2")
    before = _agent_traces()
    runc_before = set(sh("runc", "list", "-q").stdout.split())
    out = pathlib.Path(tmp) / "killed-runner.out"
    with open(out, "w") as sink:
        p = subprocess.Popen(
            _firewall_argv("sh", "-c", "echo AGENT-RAN"), env=env, stdin=subprocess.DEVNULL,
            stdout=sink, stderr=sink, start_new_session=True)
    name = _await_new_container(before)
    p.kill()
    p.wait()
    status = _await_exited(name, "the container to end at its closed gate")
    assert status.startswith("Exited (70)"), status
    assert "AGENT-RAN" not in out.read_text()
    sh(str(RUNNER), "gc")
    assert _agent_traces() == before
    assert set(sh("runc", "list", "-q").stdout.split()) <= runc_before


def test_podman_sigterm_while_arming_keeps_the_gate_shut(runner_hosts, tmp):
    # The operator stops the runner while it arms: the agent must not start only to be
    # stopped; the runner exits 128+15 and leaves nothing.
    why = _podman_firewall_ready()
    if why:
        pytest.skip(why)
    env = _fake_nft(tmp, "nft-slow-term", "sleep 2")
    before = _agent_traces()
    p, out, err = sigterm_once_started(_firewall_argv("sh", "-c", "echo AGENT-RAN"), env,
                                       lambda: _await_new_container(before), timeout=60)
    assert p.returncode == 128 + signal.SIGTERM, err
    assert "stopped by SIGTERM before the agent started" in err, err
    assert "AGENT-RAN" not in out + err
    assert _agent_traces() == before


def test_podman_sigterm_while_pre_resolving_a_long_allowlist_stops_at_once(runner_hosts, tmp):
    """HOLE (review of 2026-12-02): a stop during pre-resolve waited for every allowed name
    (2,100 names: over a minute, so `compass-runner stop` gave up after 30 s). Arming now asks
    before each name. Here 60 rules (one name, 60 ports) each load their elements through an
    `nft` that counts the loads and takes 0.3 s over each; SIGTERM comes after the first
    load: the runner stops with 143 having loaded a few, not all 60 rules' elements."""
    why = _podman_firewall_ready()
    if why:
        pytest.skip(why)
    real = shutil.which("nft")
    fake_dir = pathlib.Path(tmp) / "nft-count"
    fake_dir.mkdir()
    loads = fake_dir / "loads"
    (fake_dir / "nft").write_text(f"""#!/bin/sh
case " $* " in *" -f - "*)
  input=$(cat)
  case "$input" in *"add element"*) echo load >> {loads}; sleep 0.3 ;; esac
  printf '%s\\n' "$input" | exec {real} "$@" ;;
esac
exec {real} "$@"
""")
    (fake_dir / "nft").chmod(0o755)
    env = dict(os.environ, PATH=f"{fake_dir}:{os.environ.get('PATH', '/usr/sbin:/usr/bin')}")
    rules = 60
    before = _agent_traces()
    p, out, err = sigterm_once_started(
        _firewall_argv("sh", "-c", "echo AGENT-RAN",
                       allow=[f"{rh.ALLOWED}:{port}" for port in range(1, rules + 1)]),
        env, lambda: boxlib.wait_for(lambda: loads.exists(), timeout=60,
                                     what="the first pre-resolved name's elements"),
        timeout=120)
    assert p.returncode == 128 + signal.SIGTERM, err
    assert "stopped by SIGTERM before the agent started" in err, err
    assert "AGENT-RAN" not in out + err
    done = len(loads.read_text().splitlines())
    assert done < rules // 2, f"{done} element loads after the stop: pre-resolve went on"
    assert _agent_traces() == before


def test_podman_runner_killed_with_a_running_agent_stops_it(runner_hosts, tmp):
    # kill -9 of the runner once the agent runs: nano-init supervise --lifeline sees the
    # runner's end of the gate close and stops the agent as on SIGTERM; gc removes the rest.
    why = _podman_firewall_ready()
    if why:
        pytest.skip(why)
    before = _agent_traces()
    err = pathlib.Path(tmp) / "killed-runner.err"
    with open(err, "w") as sink:
        p = subprocess.Popen(_firewall_argv("sleep", "300"), stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=sink, start_new_session=True)
    try:
        boxlib.wait_for(lambda: re.search(r"agent a[0-9a-f]{10} running", err.read_text()),
                        timeout=60, what="the agent to run")
        name = _await_new_container(before)
    finally:
        p.kill()
        p.wait()
    status = _await_exited(name, "the container to end once its runner is gone")
    assert status.startswith("Exited (143)"), status
    sh(str(RUNNER), "gc")
    assert _agent_traces() == before


def _container_status(name):
    return sh("podman", "ps", "-a", "--filter", f"name=^{name}$", "--format",
              "{{.Status}}").stdout.strip()


def _await_exited(name, what):
    """The container's status ("Exited (N) …") once it has exited, waiting up to 60 s."""
    return boxlib.wait_for(lambda: (st := _container_status(name)).startswith("Exited") and st,
                           timeout=60, what=what)


def _await_new_container(before):
    """The name of the agent container that is not in `before` (_agent_traces()), once podman
    has created it (the runner is still arming: a fake nft holds it there)."""
    return boxlib.wait_for(
        lambda: next(iter(set(_agent_traces()[0]) - set(before[0])), None),
        timeout=60, what="podman to create the container while the runner arms")


def _agent_traces():
    """Every agent container, netns, host veth and host table on the machine."""
    containers = sh("podman", "ps", "-a", "--filter", "label=compass.agent", "--format",
                    "{{.Names}}").stdout.split()
    netns = sorted(p.name for p in pathlib.Path("/run/netns").glob("compass-*"))
    links = re.findall(r"^\d+: (cv[a-z0-9]+)[@:]", sh("ip", "-o", "link", "show").stdout, re.M)
    tables = re.findall(r"table inet (compass_nat_\w+)", sh("nft", "list", "tables").stdout)
    return sorted(containers), netns, sorted(links), sorted(tables)


def test_podman_agent_sees_no_terminal(podman_agent):
    o = podman_agent["out"]
    assert o["stdin_tty"] == "no"
    assert o["dev_tty"] == "none"


def test_podman_allowed_name_over_both_families(podman_agent):
    o = podman_agent["out"]
    assert o["v4"] == rh.ALLOWED and o["v6"] == rh.ALLOWED, o


def test_podman_denials_fail_fast(podman_agent):
    o = podman_agent["out"]
    assert o["denied_dns"] == "status: REFUSED"
    assert o["denied_name_curl"] == str(CURL_NO_RESOLVE)
    for key in ("denied_v4", "denied_v6", "tcp53", "tcp853", "tcp853v6"):
        assert o[key] == str(CURL_CONNECT_FAILED), (key, o[key])
    assert o["outside_dns"] != "0"
    assert '"reason":"denied-name"' in podman_agent["stderr"]


def test_podman_teardown_leaves_nothing(podman_agent):
    agent_id = podman_agent["id"]
    assert agent_id
    assert _leftovers(agent_id) == []
    assert not pathlib.Path(f"/run/netns/compass-{agent_id}").exists()
