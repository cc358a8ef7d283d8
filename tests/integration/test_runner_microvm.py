"""compass-runner's microvm tier with egress `boundary`, end to end under `--accel tcg`: a real
QEMU `-M microvm` guest booting Debian's cloud kernel (scripts/install-deps unpacks it into
/usr/local/lib/compass/guest-kernel), the runner's initramfs, the default image as an erofs
root, nano-init in the guest speaking HTTP/2 over a virtio-serial port to a real sam-box, and
the test hosts of runner_hosts.py (allowed.example, denied.example, an outside DNS server on
198.18.5.2:53, a listener on :853).

Every boot costs 5 to 40 s of emulated CPU on a loaded 2-CPU host, so one agent runs every
egress and privilege probe and prints one JSON line (the `probes` fixture). This host's
/dev/kvm is paravirtual and hangs stock guests: the KVM test checks that the hang is detected,
and skips (saying so) where KVM really boots the guest.

Binaries: COMPASS_RUNNER (default build/src/compass-runner/compass-runner); the runner finds
sam-box and nano-init beside it in the build tree, or COMPASS_SAM_BOX / COMPASS_NANO_INIT.
"""

import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

from microvm_lib import (ALLOW, NANO_INIT, PROBE_HELPERS, RUNNER, STATE_ROOT, TCG, Live,
                         build_image, guests_of, leftovers, runner, runner_env, wait_for)
from runner_hosts import runner_hosts  # noqa: F401 (a fixture)


@pytest.fixture(scope="module")
def image():
    build_image()


PROBE_SCRIPT = PROBE_HELPERS + r'''
def flood():
    import time
    pids, err = [], None
    for _ in range(80):
        try:
            pid = os.fork()
        except OSError as e:
            err = str(e)
            break
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    return {"started": len(pids), "error": err}
status = open("/proc/self/status").read()
res = boundary_egress(30)
res.update({
  "resolv": open("/etc/resolv.conf").read(),
  "status": {k: v.strip() for k, v in (l.split(":", 1) for l in status.splitlines())},
  "isatty": [os.isatty(0), os.isatty(1), os.isatty(2)],
  "uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
  "cwd": os.getcwd(), "home": os.environ.get("HOME"),
  "scratch": run("sh", "-c", "echo hi > /tmp/x && cat /tmp/x && touch /usr/x 2>&1; echo rc=$?"),
  "launch_dir": os.access("/.compass", os.R_OK),
  "tun_dev_mode": oct(os.stat("/dev/net/tun").st_mode & 0o777) if os.path.exists("/dev/net/tun") else None,
  "meminfo": open("/proc/meminfo").read().split("\n")[0],
  "nproc_limit": __import__("resource").getrlimit(__import__("resource").RLIMIT_NPROC)[0],
  "fork_flood": flood(),
  "ports": open_ports(),
  "fds": sorted(int(x) for x in os.listdir("/proc/self/fd")),
  "unshare_user": run("unshare", "-Urn", "true"),
  "modules_disabled": open("/proc/sys/kernel/modules_disabled").read().strip(),
  "forged_exit": run("sh", "-c", "printf 'fail forged by the agent\\nexit 0\\n' >&3"),
})
print("PROBES " + json.dumps(res), flush=True)
print("to-stderr", file=sys.stderr, flush=True)
sys.exit(7)
'''


@pytest.fixture(scope="module")
def probes(image, runner_hosts):
    """One guest runs every probe and exits 7; the tests below read its answers."""
    start = time.monotonic()
    r = runner("run", *TCG, "--egress-allow", ALLOW, "--workdir", "/tmp", "--memory", "384m",
               "--pids", "40", "--", "python3", "-c", PROBE_SCRIPT, timeout=400)
    line = [l for l in r.stdout.splitlines() if l.startswith("PROBES ")]
    assert line, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    res = json.loads(line[0][len("PROBES "):])
    res["_run"] = {"rc": r.returncode, "stdout": r.stdout, "stderr": r.stderr,
                   "seconds": time.monotonic() - start}
    return res


# ---------------------------------------------------------------------------------------
# Egress through the boundary (issue 4's list, in the guest)


def test_allowed_name_over_ipv4_and_ipv6(probes, runner_hosts):
    assert runner_hosts.fetch(runner_hosts.ALLOWED_V4) == "allowed.example\n"
    for key in ("curl4_allowed", "curl6_allowed"):
        assert probes[key]["rc"] == 0, probes[key]
        assert probes[key]["out"] == "allowed.example\n", probes[key]


def test_denied_name_is_refused_not_timed_out(probes, runner_hosts):
    assert runner_hosts.fetch(runner_hosts.DENIED_V4) == "denied.example\n"
    for key in ("curl_denied", "curl6_denied"):
        # 7 = connection refused (the SYN answered with RST); 28 would be the timeout.
        assert probes[key]["rc"] == 7, probes[key]
        assert "denied.example" not in probes[key]["out"], probes[key]


def test_raw_ip_literals_fail(probes):
    for key in ("curl_raw_ip", "curl_raw_ip6"):
        assert probes[key]["rc"] not in (0, 28), probes[key]
        assert "allowed.example" not in probes[key]["out"], probes[key]


def test_outside_resolver_gets_no_query_only_the_virtual_dns_answers(probes):
    for key in ("dig_outside", "dig_outside_tcp"):
        assert probes[key]["rc"] != 0, probes[key]
        assert "ANSWER SECTION" not in probes[key]["out"], probes[key]
    answers = probes["dig_virtual"]["out"].split()
    assert answers and all(a.startswith("100.") for a in answers), probes["dig_virtual"]


def test_tcp_53_and_853_out_fail(probes):
    for key in ("tcp_ip_53", "tcp_ip_853", "tcp_ip6_853", "tcp_name_53", "tcp_name_853"):
        assert not probes[key]["ok"], (key, probes[key])
        assert "timed out" not in probes[key]["error"], (key, probes[key])


def test_guest_has_no_nic_only_lo_and_tun0_and_the_virtual_resolver(probes):
    links = re.findall(r"^\d+: ([^:@]+)", probes["links"]["out"], re.M)
    assert sorted(links) == ["lo", "tun0"], probes["links"]
    assert "default dev tun0" in probes["routes"]["out"], probes["routes"]
    assert re.findall(r"^nameserver\s+(\S+)", probes["resolv"], re.M) == ["100.127.255.253"]


# ---------------------------------------------------------------------------------------
# The agent in the guest


def test_agent_cannot_change_the_network(probes):
    for key in ("ip_link_add", "ip_addr_add"):
        assert probes[key]["rc"] != 0, (key, probes[key])
        assert "Operation not permitted" in probes[key]["err"], (key, probes[key])
    # The boundary guest loads no nf_tables at all: there is no ruleset to flush, and the
    # agent (no capability) could not load the module.
    assert probes["nft_flush"]["rc"] != 0, probes["nft_flush"]
    assert re.search(r"Operation not permitted|Protocol not supported",
                     probes["nft_flush"]["err"]), probes["nft_flush"]


def test_agent_is_not_root_and_has_no_capability(probes):
    st = probes["status"]
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(st[cap], 16) == 0, (cap, st[cap])
    assert st["NoNewPrivs"] == "1"
    assert (probes["uid"], probes["gid"], probes["groups"]) == (1000, 1000, [])
    assert probes["home"] == "/home/agent"
    assert not probes["launch_dir"], "the launch step's directory must be root's only"
    # The boundary, control and stdio ports are root's: the agent cannot talk to sam-box or
    # the runner except through nano-init.
    assert len(probes["ports"]) == 4, probes["ports"]
    assert set(probes["ports"].values()) == {"PermissionError"}, probes["ports"]
    assert probes["tun_dev_mode"] in (None, "0o600"), probes["tun_dev_mode"]


def test_agent_holds_no_port_descriptor_and_cannot_forge_its_status(probes):
    """The control port is the launch step's: an agent holding it could report a status it did
    not have or inject lines into the runner's messages."""
    # listdir's own directory fd is the only one above 2.
    assert len([fd for fd in probes["fds"] if fd > 2]) <= 1, probes["fds"]
    assert probes["forged_exit"]["rc"] != 0, probes["forged_exit"]
    assert probes["_run"]["rc"] == 7, probes["_run"]["stderr"]
    assert "forged by the agent" not in probes["_run"]["stderr"]


def test_agent_gets_no_user_namespace(probes):
    assert probes["unshare_user"]["rc"] != 0, probes["unshare_user"]


def test_no_kernel_module_can_be_loaded_once_the_agent_runs(probes):
    """Stage 1 sets kernel.modules_disabled after loading its modules: root in the guest (a
    kernel or launch-step exploit) can load no module, nor can an autoload the agent triggers."""
    assert probes["modules_disabled"] == "1", probes["modules_disabled"]


def test_agent_sees_no_terminal_and_has_writable_scratch_and_workdir(probes):
    assert probes["isatty"] == [False, False, False]
    assert probes["cwd"] == "/tmp"
    # /tmp is the guest's scratch; the image itself is not the agent's to write (uid 1000).
    assert probes["scratch"]["out"].startswith("hi\n"), probes["scratch"]
    assert "rc=1" in probes["scratch"]["out"], probes["scratch"]


def test_memory_and_pids_bind_in_the_guest(probes):
    total_kib = int(probes["meminfo"].split()[1])
    assert 256 * 1024 < total_kib <= 384 * 1024, probes["meminfo"]
    assert probes["nproc_limit"] == 40
    assert probes["fork_flood"]["started"] < 40, probes["fork_flood"]
    assert "Resource temporarily unavailable" in probes["fork_flood"]["error"], probes["fork_flood"]


def test_a_guest_out_of_memory_is_said_not_just_137(image):
    r = runner("run", *TCG, "--memory", "160m", "--", "python3", "-c",
               "x = []\nwhile True: x.append(bytearray(8 << 20))", timeout=300)
    assert r.returncode == 128 + signal.SIGKILL, (r.returncode, r.stderr)
    assert "the guest ran out of memory" in r.stderr, r.stderr


def test_exit_status_and_stdio_pass_through_and_the_console_stays_in_the_log(probes):
    run = probes["_run"]
    assert run["rc"] == 7, run
    # stdout holds the agent's lines only; stderr the agent's and nano-init's JSON log lines.
    assert [l for l in run["stdout"].splitlines() if l] == [
        l for l in run["stdout"].splitlines() if l.startswith("PROBES ")], run["stdout"]
    assert "to-stderr" in run["stderr"], run["stderr"]
    for text in (run["stdout"], run["stderr"]):
        assert "compass-init:" not in text and "Linux version" not in text
        assert not re.search(r"^\[\s*\d+\.\d+\]", text, re.M), "kernel console leaked"
    assert "--accel tcg" in run["stderr"] and "slow" in run["stderr"], run["stderr"]


# ---------------------------------------------------------------------------------------
# A live guest: roster, console log, resize refused, stop; then kill -9 of the runner and gc


def test_live_guest_roster_console_stop(image, runner_hosts):
    live = Live("sh", "-c", "echo ready; curl -s http://allowed.example/ >/dev/null; "
                "curl -s http://denied.example/ >/dev/null; exec sleep 300")
    try:
        rec = live.record
        assert rec["tier"] == "microvm" and rec["posture"] == "boundary", rec
        assert rec["sam_box_pid"] > 0 and re.fullmatch(r"127\.0\.0\.1:\d+", rec["metrics_addr"])
        state = STATE_ROOT / live.id
        cmd = pathlib.Path(f"/proc/{rec['pid']}/cmdline").read_bytes().split(b"\0")
        assert os.path.basename(cmd[0]).startswith(b"qemu-system-x86_64"), cmd
        info = json.loads((state / "microvm.json").read_text())
        assert info["accel"] == "tcg" and info["qemu_pid"] == rec["pid"], info
        assert oct(os.stat(state).st_mode & 0o777) == "0o700"
        console = (state / "console.log").read_text(errors="replace")
        assert re.search(r"compass-init: \[[\d.]+\] stage 2: starting the agent as 1000:1000",
                         console), console

        def counted():
            roster = json.loads(runner("agents", "--json").stdout)
            mine = [a for a in roster if a["id"] == live.id]
            return mine and mine[0]["allowed"] >= 1 and mine[0]["denied"] >= 1 and mine[0]
        mine = wait_for(counted, "one allowed and one denied flow in the roster", timeout=120)
        assert mine["tier"] == "microvm" and mine["egress"] == "boundary", mine
        r = runner("resize", live.id, "--memory", "1g")
        assert r.returncode == 1 and "fixed when it boots" in r.stderr, r.stderr
        assert runner("stop", live.id).returncode == 0
        code, out = live.wait()
        assert code == 128 + signal.SIGTERM, (code, live.err)
        assert "ready" in out
    finally:
        left = live.end()
    assert left == []


def test_rootfs_dir_and_bundle_allowlist(image, runner_hosts, tmp_path):
    env = dict(os.environ, CONTAINERS_CONF=str(STATE_ROOT / "containers.conf"))
    mount = subprocess.run(["podman", "image", "mount", "localhost/compass-agent:latest"],
                           capture_output=True, text=True, env=env, check=True).stdout.strip()
    bundle = tmp_path / "bundle.yaml"
    bundle.write_text("version: v1\nagent:\n  id: researcher-1.test.example\n"
                      "egress:\n  allow: [allowed.example]\n")
    try:
        r = runner("run", *TCG, "--bundle", str(bundle), "--rootfs", mount, "--cpus", "1.5",
                   "--", "sh", "-c", "echo hi > /home/agent/new && cat /home/agent/new && "
                   "id -u && nproc && curl -sS -m 30 http://allowed.example/; "
                   "curl -sS -m 30 http://denied.example/; echo rc=$?")
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == ["hi", "1000", "2", "allowed.example", "rc=7"], r.stdout
        assert "whole vCPUs" in r.stderr, r.stderr
        assert "NOT verified" in r.stderr, r.stderr
        assert not pathlib.Path(mount, "home/agent/new").exists()
    finally:
        subprocess.run(["podman", "image", "unmount", "localhost/compass-agent:latest"],
                       capture_output=True, env=env)


def _credential_run(tmp_path, sub, *cmd):
    """Runs CMD in a guest with a verified identity (boxlib.credentialed_runner_flags, against
    a local HTTPS OIDC issuer). Returns (result, the node's records)."""
    import boxlib
    from oidc_issuer import TestIssuer
    issuer = TestIssuer(tmp_path / "oidc")
    issuer.start()
    try:
        with boxlib.credentialed_runner_flags(tmp_path, issuer, sub) as (flags, node):
            r = runner("run", *TCG, *flags, "--", *cmd)
    finally:
        issuer.stop()
    return r, node.records


def test_a_verified_identity_reaches_the_node_from_the_guest(image, tmp_path):
    """seed 003 "Identity", in this tier: the runner's sam-box verifies the platform token,
    and a mesh request from the guest (HTTP/2 over the virtio-serial port) reaches the node
    as the bundle's verified agent.id, whatever the agent sends as X-Sam-Agent."""
    r, records = _credential_run(tmp_path, "sa:agents:verified", "curl", "-sS", "-m", "30",
                                 "-H", "X-Sam-Agent: admin.test.example",
                                 "http://mesh.sam.alt/whoami")
    assert r.returncode == 0, r.stderr
    assert "NOT verified" not in r.stderr, r.stderr
    assert len(records) == 1, records
    sent = [v for k, v in records[0]["headers"] if k.lower() == "x-sam-agent"]
    assert sent == ["verified.test.example"], records


def test_a_credential_for_another_subject_never_runs_the_agent(image, tmp_path):
    before = set(os.listdir(STATE_ROOT))
    r, records = _credential_run(tmp_path, "sa:agents:someone-else", "sh", "-c",
                                 "echo AGENT-RAN")
    assert r.returncode != 0, r.stdout + r.stderr
    assert re.search(r"\bsub\b|subject|external_id", r.stderr), r.stderr  # sam-box's reason
    assert "AGENT-RAN" not in r.stdout + r.stderr
    assert records == []
    assert _no_new_state_dirs(before) == [], r.stderr


def test_sigterm_while_the_guest_boots_stops_it_once_started(image):
    before = set(os.listdir(STATE_ROOT))
    proc = subprocess.Popen([str(RUNNER), "run", *TCG, "--", "sleep", "300"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=runner_env())
    try:
        def qemu_started():
            return [d for d in set(os.listdir(STATE_ROOT)) - before
                    if (STATE_ROOT / d / "qemu.pid").exists()]
        new = wait_for(qemu_started, "QEMU to start", timeout=60)
        proc.send_signal(signal.SIGTERM)  # before the guest is up
        _, err = proc.communicate(timeout=180)
        err = err.decode(errors="replace")
        assert proc.returncode == 128 + signal.SIGTERM, err
        assert "received SIGTERM" in err, err
        assert leftovers(new[0]) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            runner("gc")


def test_kill_9_of_the_runner_then_gc_leaves_nothing(image):
    live = Live("sleep", "300")
    assert guests_of(live.id), "no QEMU/sam-box found for the live agent"
    live.proc.kill()
    live.proc.wait()
    # QEMU and sam-box die with the runner (PDEATHSIG); gc removes the state dir.
    wait_for(lambda: not guests_of(live.id), "QEMU and sam-box to die with the runner", 15)
    r = runner("gc")
    assert r.returncode == 0, r.stderr
    assert live.id in r.stdout, r.stdout
    assert leftovers(live.id) == []
    assert runner("gc").stdout.count(live.id) == 0


# ---------------------------------------------------------------------------------------
# The KVM floor: no silent degrade


def _no_new_state_dirs(before):
    return sorted(set(os.listdir(STATE_ROOT)) - before) if STATE_ROOT.is_dir() else []


def test_refuses_without_kvm_unless_tcg_is_asked_for(image):
    before = set(os.listdir(STATE_ROOT)) if STATE_ROOT.is_dir() else set()
    env = runner_env(COMPASS_KVM_DEVICE="/nonexistent/kvm")
    r = runner("run", "--backend", "microvm", "--", "true", env=env)
    assert r.returncode == 2, r.stderr
    assert "needs KVM" in r.stderr and "/nonexistent/kvm" in r.stderr, r.stderr
    assert "--accel tcg" in r.stderr and "never falls back" in r.stderr, r.stderr
    r = runner("run", "--backend", "microvm", "--accel", "kvm", "--", "true", env=env)
    assert r.returncode == 2 and "needs KVM" in r.stderr, r.stderr
    assert _no_new_state_dirs(before) == []


def test_a_kvm_that_cannot_run_the_guest_is_detected_in_bounded_time(image):
    kvm = pathlib.Path("/dev/kvm")
    if not kvm.exists():
        pytest.skip("no /dev/kvm on this host: the hang detection needs a KVM that opens")
    start = time.monotonic()
    r = runner("run", "--backend", "microvm", "--egress-allow", ALLOW, "--", "true",
               env=runner_env(COMPASS_MICROVM_BOOT_TIMEOUT="6"), timeout=120)
    elapsed = time.monotonic() - start
    if r.returncode == 0:
        pytest.skip("KVM boots the guest on this host: there is no hung KVM guest to detect "
                    f"(took {elapsed:.1f} s)")
    assert r.returncode == 70, r.stderr
    assert "KVM is present" in r.stderr and "cannot run the guest" in r.stderr, r.stderr
    assert "--accel tcg" in r.stderr, r.stderr
    # The 6 s boot timeout plus preparing the images (cached) and tearing down.
    assert elapsed < 60, elapsed
    m = re.search(r"agent (a[0-9a-f]{10})", r.stderr)
    assert not m or leftovers(m.group(1)) == []
    assert not [p for p in pathlib.Path("/proc").glob("[0-9]*/cmdline")
                if b"qemu-system" in _read(p) and b"-accel\0kvm" in _read(p)]


def _read(p):
    try:
        return p.read_bytes()
    except OSError:
        return b""


def test_refusals_name_the_flag(image):
    r = runner("run", *TCG, "--memory", "64m", "--", "true")
    assert r.returncode == 2 and "--memory" in r.stderr, r.stderr
    r = runner("run", "--backend", "podman", "--accel", "tcg", "--", "true")
    assert r.returncode == 2 and "only the microvm tier" in r.stderr, r.stderr
    r = runner("run", *TCG[:2], "--accel", "hvf", "--", "true")
    assert r.returncode == 2 and "expected kvm or tcg" in r.stderr, r.stderr
    r = runner("run", *TCG, "--memory", "64m", "--", "true")
    assert r.returncode == 2 and "at least 128 MiB" in r.stderr, r.stderr
    r = runner("run", *TCG, "--", "true",
               env=runner_env(COMPASS_GUEST_KERNEL="/nonexistent"))
    assert r.returncode == 2 and "install-deps" in r.stderr, r.stderr
    r = runner("run", *TCG, "--", "true", env=runner_env(COMPASS_QEMU="/nonexistent/qemu"))
    assert r.returncode == 2 and 'COMPASS_QEMU="/nonexistent/qemu"' in r.stderr, r.stderr
    r = runner("run", *TCG, "--", "true",
               env=runner_env(COMPASS_MICROVM_CACHE="mvm-relative-cache"))
    assert r.returncode == 2 and "not an absolute path" in r.stderr, r.stderr
    assert not pathlib.Path("mvm-relative-cache").exists()


def test_a_cache_dir_someone_else_owns_is_refused(image):
    """What is cached is booted for later agents: a cache another user could write (here one
    `nobody` made, or one of ours with mode 0777) could hold a planted root image, so it is
    refused (exit 2) before anything runs."""
    tmp_path = pathlib.Path(tempfile.mkdtemp(prefix="mvm-cache-", dir="/tmp"))
    try:
        _cache_refusals(tmp_path)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def _cache_refusals(tmp_path):
    os.chmod(tmp_path, 0o777)
    cache = tmp_path / "cache"
    subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                    "mkdir", "-m", "0755", str(cache)], check=True)
    r = runner("run", *TCG, "--", "true", env=runner_env(COMPASS_MICROVM_CACHE=str(cache)))
    assert r.returncode == 2 and "belongs to uid 65534" in r.stderr, r.stderr
    ours = tmp_path / "ours"
    ours.mkdir()
    os.chmod(ours, 0o777)
    r = runner("run", *TCG, "--", "true", env=runner_env(COMPASS_MICROVM_CACHE=str(ours)))
    assert r.returncode == 2 and "has mode 0777" in r.stderr, r.stderr
    assert oct(os.stat(ours).st_mode & 0o777) == "0o777", "refused, not repaired"
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    r = runner("run", *TCG, "--", "true", env=runner_env(COMPASS_MICROVM_CACHE=str(link)))
    assert r.returncode == 2 and "a symlink is refused" in r.stderr, r.stderr
    assert oct(os.stat(tmp_path).st_mode & 0o777) == "0o777", "the link's target was chmodded"


def test_a_command_that_looks_like_nano_init_options_runs_as_given(image):
    r = runner("run", *TCG, "--", "--help")
    assert r.returncode == 127, (r.returncode, r.stdout, r.stderr)
    assert "nano-init" not in r.stdout


# ---------------------------------------------------------------------------------------
# nano-init's --user (the guest's nano-init is root; its agent is not), without a VM


def test_nano_init_user_runs_the_agent_as_that_uid_without_capabilities(tmp_path):
    r = subprocess.run(
        ["unshare", "--net", "--pid", "--fork", "--mount-proc", str(NANO_INIT), "run",
         "--user", "65534:65534", str(tmp_path / "none.sock"), "sh", "-c",
         "id -u; id -g; id -G; grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status"],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("\n")
    assert lines[:3] == ["65534", "65534", "65534"], r.stdout
    assert re.search(r"CapEff:\s+0+\n", r.stdout) and re.search(r"CapBnd:\s+0+\n", r.stdout)
    assert re.search(r"NoNewPrivs:\s+1", r.stdout), r.stdout
    bad = subprocess.run([str(NANO_INIT), "run", "--user", "nobody", "x.sock", "true"],
                         capture_output=True, text=True, timeout=10)
    assert bad.returncode == 2 and "--user" in bad.stderr, bad.stderr
