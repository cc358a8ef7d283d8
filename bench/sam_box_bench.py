#!/usr/bin/python3
"""sam-box benchmark: tunnel set-up latency, bulk throughput and memory of the boundary,
against a direct connection, against squid and tinyproxy given the same allowlist, and against
the floor: the least a separate process relaying CONNECT costs (sam-box-bench-load relay).

    sudo /usr/bin/python3 bench/sam_box_bench.py            # full run, about 2 minutes
    sudo /usr/bin/python3 bench/sam_box_bench.py --quick    # smoke run, about 20 seconds

Everything runs inside a network namespace this script creates (only `lo`, up), whose
/etc/hosts (via /etc/netns/NAME/hosts) maps bench.test and denied.test to 127.0.0.1. No
packet leaves that namespace's loopback. The bytes are moved by sam-box-bench-load
(bench/load.cc, built here with CMake if the project build does not include it); this file
only orchestrates, measures memory and CPU from /proc, and reports.

A benchmark, not a test: it prints PASS/MISS per target and exits 0 either way (non-zero
only when it could not measure at all). The results are also written as JSON under
bench/results/ (git-ignored). See bench/README.md for how to read them.

Two processes: the outer one (in the host's namespaces) creates and always removes the
namespace, its hosts file and the work directory; the inner one (`--inner`, started with
`ip netns exec`) starts the upstream, sam-box, the floor relay, squid and tinyproxy,
measures, and always stops them. Every child gets PR_SET_PDEATHSIG=SIGKILL, so nothing
outlives its parent even on SIGKILL; Ctrl-C and SIGTERM clean up in order.
"""

import argparse
import datetime
import hashlib
import json
import os
import pathlib
import platform
import pwd
import resource
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from benchlib import (GIB, MIB, cpu_model, descendants, die_with_parent, fmt, git_describe,
                      loadavg, log, median, percentile, raise_interrupt, size)

REPO = pathlib.Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
RESULTS = BENCH / "results"
NAME = "bench.test"  # the allowed name
UNCACHED = "sam-box/0"  # sam-box with --resolve-cache-ttl 0 (set-up latency only)
OTHER_NAME = "denied.test"  # resolves to the same address; only policy refuses it
FLOOR = "floor"  # sam-box-bench-load relay: CONNECT relayed with no policy (see load.cc)

# Targets from issue 2 ("Benchmark").
TARGET_SETUP_RATIO = 1.5  # sam-box median set-up ≤ 1.5 × direct
TARGET_THROUGHPUT_RATIO = 0.90  # sam-box throughput ≥ 90 % of direct
TARGET_RSS_IDLE_MIB = 4.0  # sam-box VmRSS idle

HARD_CAP_SECONDS = 420  # the outer process kills the inner one after this, whatever happens
START_TIMEOUT = 20.0  # each server must accept within this
CLK_TCK = os.sysconf("SC_CLK_TCK")



def _as_user_dying_with_parent(uid, gid):
    """preexec_fn: become uid/gid, then die_with_parent. In this order because a change of
    credentials clears PR_SET_PDEATHSIG: squid started as root switches to its own user by
    itself, and would then outlive a killed run."""
    def setup():
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        die_with_parent()
    return setup


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


# ---------------------------------------------------------------------------------------
# Arguments


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sam-box", default=str(REPO / "build/src/sam-box/sam-box"),
                   help="sam-box binary (default: the project build)")
    p.add_argument("--load", default="",
                   help="sam-box-bench-load binary (default: build/bench/ if the project "
                        "build has it and it is current, else built into build-bench/)")
    p.add_argument("--setups", type=int,
                   help="sequential set-ups timed per path (default 2000)")
    p.add_argument("--bytes", type=int,
                   help="bytes per direction per throughput run (default 1 GiB)")
    p.add_argument("--trials", type=int,
                   help="throughput runs per path and direction; the median is reported "
                        "(default 3)")
    p.add_argument("--flows", type=int,
                   help="concurrent tunnels held for the memory reading (default 1000)")
    p.add_argument("--budget", type=float, default=120.0,
                   help="seconds; past this, further throughput trials are skipped")
    p.add_argument("--only", default="",
                   help="comma-separated subset of sam-box,floor,squid,tinyproxy "
                        "(direct always runs)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 400 set-ups, 128 MiB, 1 trial, 200 flows (explicit flags win)")
    p.add_argument("--out", default="", help="JSON result path (default bench/results/…)")
    p.add_argument("--logs", default="",
                   help="directory for the proxies' logs (default: all logs go to /dev/null)")
    # Internal: the outer process starts the inner one with these.
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--workdir", default="", help=argparse.SUPPRESS)
    p.add_argument("--netns", default="", help=argparse.SUPPRESS)
    p.add_argument("--binary-id", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    defaults = {"setups": 400, "bytes": 128 * MIB, "trials": 1, "flows": 200} if args.quick \
        else {"setups": 2000, "bytes": GIB, "trials": 3, "flows": 1000}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for key in defaults:
        if getattr(args, key) < 1:
            p.error(f"--{key} must be at least 1")
    return args


# ---------------------------------------------------------------------------------------
# Outer process: the namespace, the work directory, the inner process.


def find_load_tool(explicit):
    """The load generator: explicit, or the project build's if current, else built here."""
    if explicit:
        return pathlib.Path(explicit).resolve()
    source_mtime = max(f.stat().st_mtime for f in (BENCH / "load.cc", BENCH / "load_common.h",
                                                BENCH / "load_common.cc", BENCH / "CMakeLists.txt"))
    in_project = REPO / "build/bench/sam-box-bench-load"
    if in_project.exists() and in_project.stat().st_mtime >= source_mtime:
        return in_project
    build_dir = REPO / "build-bench"
    log(f"building the load generator into {build_dir.relative_to(REPO)}/")
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    for cmd in (["cmake", "-S", str(BENCH), "-B", str(build_dir), *gen,
                 "-DCMAKE_BUILD_TYPE=Release"],
                ["cmake", "--build", str(build_dir), "--target", "sam-box-bench-load"]):
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=300)
        if r.returncode != 0:
            sys.exit(f"bench: {' '.join(cmd)} failed:\n{r.stdout}")
    return build_dir / "sam-box-bench-load"


def sweep_stale():
    """Removes what a run killed with SIGKILL left behind (its children die with it, through
    PR_SET_PDEATHSIG; its namespace, hosts file and work directory do not). Each carries the
    PID of the run that made it; only those whose run is gone are removed."""
    def dead(pid):
        return pid.isdigit() and not os.path.exists(f"/proc/{pid}")

    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    for line in netns.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith("sambench-") and dead(name[len("sambench-"):]):
            log(f"removing stale netns {name}")
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
    etc = pathlib.Path("/etc/netns")
    for d in etc.glob("sambench-*") if etc.is_dir() else ():
        if dead(d.name[len("sambench-"):]):
            shutil.rmtree(d, ignore_errors=True)
    for d in pathlib.Path(tempfile.gettempdir()).glob("sam-box-bench-*-*"):
        if dead(d.name.split("-")[3]):
            # A server still running from that directory (none should: every child dies
            # with its run) is killed by its exact path, then the directory goes.
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        if f"{d}/".encode() in f.read():
                            log(f"killing stale process {pid} of {d}")
                            os.kill(int(pid), signal.SIGKILL)
                except OSError:
                    pass
            log(f"removing stale {d}")
            shutil.rmtree(d, ignore_errors=True)


def sh(*cmd):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                   timeout=30)


def outer(args):
    if os.geteuid() != 0:
        sys.exit("bench: needs root (it creates a network namespace); run it with sudo")
    for tool in ("ip",):
        if not shutil.which(tool):
            sys.exit(f"bench: `{tool}` not found")
    sam_box = pathlib.Path(args.sam_box).resolve()
    if not os.access(sam_box, os.X_OK):
        sys.exit(f"bench: no sam-box at {sam_box}; build it with `bash scripts/build`")
    load = find_load_tool(args.load)

    # Explicitly: a shell's background job starts with SIGINT ignored, and Python keeps that.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, raise_interrupt)
    sweep_stale()
    netns = f"sambench-{os.getpid()}"
    workdir = tempfile.mkdtemp(prefix=f"sam-box-bench-{os.getpid()}-")
    etc = pathlib.Path("/etc/netns") / netns
    inner = None
    rc = 1
    try:
        # A snapshot of the binaries: a rebuild during the run must not change what is measured.
        os.chmod(workdir, 0o755)  # squid drops to its own user and must reach its config
        shutil.copy2(sam_box, pathlib.Path(workdir) / "sam-box")
        verifier = sam_box.parent / "sam-box-verify"  # found beside sam-box; unused here
        if verifier.exists():
            shutil.copy2(verifier, pathlib.Path(workdir) / "sam-box-verify")
        with open(sam_box, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()[:16]
        built = datetime.datetime.fromtimestamp(sam_box.stat().st_mtime, datetime.timezone.utc)
        shutil.copy2(load, pathlib.Path(workdir) / "sam-box-bench-load")
        sh("ip", "netns", "add", netns)
        sh("ip", "-n", netns, "link", "set", "lo", "up")
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(f"127.0.0.1 localhost\n127.0.0.1 {NAME}\n"
                                   f"127.0.0.1 {OTHER_NAME}\n")
        cmd = ["ip", "netns", "exec", netns, sys.executable, str(pathlib.Path(__file__).resolve()),
               *sys.argv[1:], "--inner", "--workdir", workdir, "--netns", netns,
               "--sam-box", str(pathlib.Path(workdir) / "sam-box"),
               "--load", str(pathlib.Path(workdir) / "sam-box-bench-load"),
               "--binary-id", f"{sam_box} sha256:{digest} built {built:%Y-%m-%dT%H:%M:%SZ}"]
        inner = subprocess.Popen(cmd, start_new_session=True, preexec_fn=die_with_parent)
        try:
            rc = inner.wait(timeout=HARD_CAP_SECONDS)
        except subprocess.TimeoutExpired:
            log(f"still running after {HARD_CAP_SECONDS}s: stopping it")
            rc = 1
    except KeyboardInterrupt:
        log("interrupted: cleaning up")
        rc = 130
    finally:
        if inner is not None and inner.poll() is None:
            inner.send_signal(signal.SIGTERM)
            try:
                inner.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(inner.pid, signal.SIGKILL)
                inner.wait()
        subprocess.run(["ip", "netns", "del", netns], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=30)
        shutil.rmtree(etc, ignore_errors=True)
        shutil.rmtree(workdir, ignore_errors=True)
    return rc


# ---------------------------------------------------------------------------------------
# Inner process: servers, measurements, report.


class Procs:
    """Every process the inner side starts, stopped in reverse order on the way out."""

    def __init__(self):
        self.live = []

    def start(self, name, cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
              preexec_fn=die_with_parent):
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                                start_new_session=True, preexec_fn=preexec_fn)
        self.live.append((name, proc))
        return proc

    def stop_all(self):
        for _, proc in reversed(self.live):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        for _, proc in reversed(self.live):
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.live.clear()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_accepting(proc, family, addr, what):
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode} before serving "
                               "(rerun with --logs DIR to see why)")
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(1.0)
            try:
                s.connect(addr)
                return
            except OSError:
                pass
        time.sleep(0.05)
    raise RuntimeError(f"{what} not accepting after {START_TIMEOUT}s")


def read_json_line(proc, timeout):
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        if not sel.select(timeout):
            raise RuntimeError(f"no output within {timeout}s")
    finally:
        sel.close()
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"exited with status {proc.wait()} without output")
    return json.loads(line)


# --- /proc readings -------------------------------------------------------------------


def memory(pid):
    """VmRSS and its parts (KiB), summed over the process and its descendants."""
    total = {"VmRSS": 0, "RssAnon": 0, "RssFile": 0, "RssShmem": 0}
    procs = descendants(pid)
    for p in procs:
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    key, _, value = line.partition(":")
                    if key in total:
                        total[key] += int(value.split()[0])
        except OSError:
            pass
    pss = 0
    for p in procs:
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        pss += int(line.split()[1])
        except OSError:
            pass
    return {"rss_kib": total["VmRSS"], "anon_kib": total["RssAnon"],
            "file_kib": total["RssFile"], "shmem_kib": total["RssShmem"], "pss_kib": pss,
            "processes": len(procs)}


def cpu_seconds(pid):
    """utime + stime of the process (all threads) and its descendants."""
    total = 0
    for p in descendants(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
        except (OSError, IndexError, ValueError):
            pass
    return total / CLK_TCK


# --- the systems under test ----------------------------------------------------------


def log_target(args, name):
    return str(pathlib.Path(args.logs).resolve() / name) if args.logs else "/dev/null"


def start_sam_box(args, procs, wd, port, name="sam-box", extra=()):
    fname = name.replace("/", "-")
    sock = str(wd / f"{fname}.sock")
    metrics_port = free_port()
    cmd = [args.sam_box, "run", "--socket", sock, "--egress-allow", f"{NAME}:{port}",
           "--allow-destination", "127.0.0.0/8", "--metrics-addr", f"127.0.0.1:{metrics_port}",
           *extra]
    return {**start_unix_proxy(args, procs, name, fname, cmd, sock, port),
            "metrics_port": metrics_port, "transport": "Unix socket (as a sandbox reaches it)"}


def start_unix_proxy(args, procs, name, log_name, cmd, sock, port):
    """Starts a proxy reached over the Unix socket `sock` (its stderr to LOG_NAME.log) and
    waits until it accepts; the path's facts shared by sam-box and the floor."""
    err = open(log_target(args, f"{log_name}.log"), "ab")
    try:
        proc = procs.start(name, cmd, stderr=err)
    finally:
        err.close()
    wait_accepting(proc, socket.AF_UNIX, sock, name)
    return {"proc": proc, "via": ["--via", f"unix:{sock}", "--authority", f"{NAME}:{port}"],
            "client": (socket.AF_UNIX, sock), "command": cmd}


def start_floor(args, procs, wd, port):
    """The floor: sam-box-bench-load relay, reached like sam-box over a Unix socket. It
    answers 200 to any CONNECT and splices to the upstream: no policy, no name lookup."""
    sock = str(wd / f"{FLOOR}.sock")
    cmd = [args.load, "relay", "--listen", f"unix:{sock}", "--to", f"127.0.0.1:{port}"]
    return {**start_unix_proxy(args, procs, FLOOR, FLOOR, cmd, sock, port),
            "enforces_policy": False, "transport": "Unix socket (as sam-box)"}


def start_squid(args, procs, wd, port):
    binary = shutil.which("squid") or "/usr/sbin/squid"
    if not os.access(binary, os.X_OK):
        raise RuntimeError("squid is not installed")
    listen = free_port()
    d = wd / "squid"
    d.mkdir()
    shutil.chown(d, "proxy", "proxy")
    conf = d / "squid.conf"
    logs = log_target(args, "squid")
    conf.write_text(f"""\
# sam-box bench: CONNECT to {NAME}:{port} only; no cache, no disk, no helpers.
http_port 127.0.0.1:{listen}
visible_hostname bench
acl CONNECT method CONNECT
acl bench_port port {port}
# -n: never match an IP literal by reverse lookup (sam-box never matches IPs to names)
acl bench_name dstdomain -n {NAME}
http_access allow CONNECT bench_name bench_port
http_access deny all
cache deny all
cache_mem 0 MB
access_log {"stdio:" + logs + "-access.log" if args.logs else "stdio:/dev/null"}
cache_log {logs + "-cache.log" if args.logs else "/dev/null"}
cache_store_log none
pid_filename none
coredump_dir {d}
hosts_file /etc/hosts
dns_nameservers 127.0.0.1
pinger_enable off
shutdown_lifetime 0 seconds
max_filedescriptors 16384
workers 1
""")
    if args.logs:
        shutil.chown(args.logs, "proxy")
    cmd = [binary, "-N", "-f", str(conf)]
    pw = pwd.getpwnam("proxy")
    proc = procs.start("squid", cmd, preexec_fn=_as_user_dying_with_parent(pw.pw_uid, pw.pw_gid))
    wait_accepting(proc, socket.AF_INET, ("127.0.0.1", listen), "squid")
    return {"proc": proc, "via": ["--via", f"tcp:127.0.0.1:{listen}", "--authority",
                                  f"{NAME}:{port}"],
            "client": (socket.AF_INET, ("127.0.0.1", listen)),
            "transport": "TCP 127.0.0.1", "command": cmd, "config": conf.read_text()}


def start_tinyproxy(args, procs, wd, port, flows):
    binary = shutil.which("tinyproxy") or "/usr/bin/tinyproxy"
    if not os.access(binary, os.X_OK):
        raise RuntimeError("tinyproxy is not installed")
    listen = free_port()
    d = wd / "tinyproxy"
    d.mkdir()
    filt = d / "filter"
    filt.write_text(f"^{NAME.replace('.', chr(92) + '.')}$\n")
    conf = d / "tinyproxy.conf"
    conf.write_text(f"""\
# sam-box bench: CONNECT to {NAME}:{port} only (default-deny filter on the host name).
Port {listen}
Listen 127.0.0.1
Timeout 600
MaxClients {max(2 * flows, 100)}
Allow 127.0.0.1
ConnectPort {port}
Filter "{filt}"
FilterType ere
FilterCaseSensitive Yes
FilterDefaultDeny Yes
DisableViaHeader Yes
LogFile "{log_target(args, "tinyproxy.log")}"
LogLevel Info
""")
    cmd = [binary, "-d", "-c", str(conf)]
    proc = procs.start("tinyproxy", cmd)
    wait_accepting(proc, socket.AF_INET, ("127.0.0.1", listen), "tinyproxy")
    return {"proc": proc, "via": ["--via", f"tcp:127.0.0.1:{listen}", "--authority",
                                  f"{NAME}:{port}"],
            "client": (socket.AF_INET, ("127.0.0.1", listen)),
            "transport": "TCP 127.0.0.1", "command": cmd, "config": conf.read_text()}


def connect_status(client, authority):
    """One CONNECT; the status code, or an error string. A 200 must also echo a byte."""
    family, addr = client
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(addr)
            s.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 65536:
                chunk = s.recv(4096)
                if not chunk:
                    break
                head += chunk
            if not head.startswith(b"HTTP/1."):
                return f"no response ({head[:40]!r})"
            status = int(head[9:12])
            if status == 200:
                s.sendall(b"e")
                if s.recv(1) != b"e":
                    return "200 without echo"
            return status
    except (OSError, ValueError) as e:
        return f"error: {e}"


# --- measurements --------------------------------------------------------------------


class Runner:
    def __init__(self, args):
        self.args = args
        self.t0 = time.monotonic()
        self.upstream_pid = None

    def elapsed(self):
        return time.monotonic() - self.t0

    def load(self, role, via, *extra, timeout=120):
        cmd = [self.args.load, role, *via, *[str(x) for x in extra]]
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, preexec_fn=die_with_parent)
        try:
            out, err = proc.communicate(timeout=timeout)
        finally:
            if proc.poll() is None:  # timed out or interrupted: kill it and reap it
                proc.kill()
                proc.wait()
        if proc.returncode != 0:
            raise RuntimeError(err.strip() or f"{role} exited {proc.returncode}")
        return json.loads(out)


def account(path, flows, up, down):
    """What the client moved through `path` (flows opened, payload bytes each way), to check
    sam-box's own counters against at the end."""
    path["flows"] = path.get("flows", 0) + flows
    path["bytes_up"] = path.get("bytes_up", 0) + up
    path["bytes_down"] = path.get("bytes_down", 0) + down


def measure_latency(run, paths, setups, blocks=8, warmup=10):
    """Sequential set-ups, in blocks interleaved across paths (rotating the order each
    block), so slow drift on a shared machine lands on every path alike."""
    names = list(paths)
    samples = {n: [] for n in names}
    cpu = {n: [0.0, 0] for n in names}  # proxy CPU seconds, set-ups (warm-ups included)
    blocks = min(blocks, setups)
    per_block = setups // blocks
    for b in range(blocks):
        order = names[b % len(names):] + names[:b % len(names)]
        for n in order:
            if paths[n].get("error"):
                continue
            proc = paths[n].get("proc")
            cpu0 = cpu_seconds(proc.pid) if proc else 0.0
            try:
                out = run.load("latency", paths[n]["via"], "--count", per_block,
                               "--warmup", warmup, timeout=120)
                samples[n] += out["samples_us"]
                if proc:
                    cpu[n][0] += cpu_seconds(proc.pid) - cpu0
                    cpu[n][1] += per_block + warmup
                k = per_block + warmup
                account(paths[n], k, k, k)  # one byte echoed each way per set-up
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                paths[n]["error"] = f"latency: {e}"
                log(f"{n}: {paths[n]['error']}")
    result = {}
    for n in names:
        v = sorted(samples[n])
        if not v:
            continue
        result[n] = {"count": len(v), "median_us": median(v), "p90_us": percentile(v, 90),
                     "p99_us": percentile(v, 99), "mean_us": sum(v) / len(v),
                     "min_us": v[0], "max_us": v[-1],
                     "proxy_cpu_us_per_setup": cpu[n][0] / cpu[n][1] * 1e6 if cpu[n][1] else None}
    return result


MODES = (("up", 1, 0), ("down", 0, 1), ("both", 1, 1))


def measure_throughput(run, paths, nbytes, trials, budget):
    names = list(paths)
    runs = {n: {m: [] for m, _, _ in MODES} for n in names}
    skipped = 0
    for t in range(trials):
        if t > 0 and run.elapsed() > budget:
            skipped = trials - t
            log(f"over the {budget:.0f}s budget: skipping {skipped} throughput trial(s)")
            break
        order = names[t % len(names):] + names[:t % len(names)]
        for n in order:
            for mode, up, down in MODES:
                if paths[n].get("error") or paths[n].get("latency_only"):
                    continue
                proc = paths[n].get("proc")
                cpu0 = cpu_seconds(proc.pid) if proc else None
                up0 = cpu_seconds(run.upstream_pid)
                try:
                    out = run.load("throughput", paths[n]["via"], "--up", up * nbytes,
                                   "--down", down * nbytes, timeout=180)
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    paths[n]["error"] = f"throughput {mode}: {e}"
                    log(f"{n}: {paths[n]['error']}")
                    continue
                account(paths[n], 1, 17 + out["up_bytes"], out["down_bytes"] + 8)  # header, ack
                moved = out["up_bytes"] + out["down_bytes"]
                runs[n][mode].append({
                    "seconds": out["seconds"], "gib_per_s": moved / GIB / out["seconds"],
                    "proxy_cpu_s": (cpu_seconds(proc.pid) - cpu0) if proc else None,
                    "upstream_cpu_s": cpu_seconds(run.upstream_pid) - up0,
                    "client_cpu_s": out["cpu_s"], "bytes": moved})
    result = {}
    for n in names:
        if paths[n].get("latency_only"):
            continue
        result[n] = {}
        for mode, _, _ in MODES:
            r = runs[n][mode]
            if not r:
                continue
            rates = [x["gib_per_s"] for x in r]

            def per_gib(key, r=r):
                v = [x[key] / (x["bytes"] / GIB) for x in r if x[key] is not None]
                return median(v) if v else None

            result[n][mode] = {"gib_per_s": median(rates), "min": min(rates), "max": max(rates),
                               "trials": len(r), "proxy_cpu_s_per_gib": per_gib("proxy_cpu_s"),
                               "client_cpu_s_per_gib": per_gib("client_cpu_s"),
                               "upstream_cpu_s_per_gib": per_gib("upstream_cpu_s"), "runs": r}
    return result, skipped


def hold(run, path, count):
    """Holds `count` tunnels open through `path`; returns (memory while held, set-up s)."""
    proc = subprocess.Popen([run.args.load, "hold", *path["via"], "--count", str(count)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=die_with_parent)
    try:
        opened = read_json_line(proc, timeout=120)
        time.sleep(0.2)  # let the proxy finish its side of the last set-up
        mem = memory(path["proc"].pid)
        proc.stdin.close()
        proc.wait(timeout=60)
        account(path, count, count, count)
        return mem, opened["seconds"]
    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
        err = ""
        if proc.poll() is not None:
            err = proc.stderr.read().strip()
        raise RuntimeError(f"hold {count}: {e} {err}".strip()) from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def scrape_metrics(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
    except OSError:
        return {}
    out = {}
    for line in data.decode("latin-1").split("\r\n\r\n", 1)[-1].splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            try:
                out[key] = float(value)
            except ValueError:
                pass
    return out


# --- report --------------------------------------------------------------------------


def targets(lat, thr, rss):
    """Each target of issue 2 as (name, value text, PASS/MISS/n/a)."""
    rows = []

    def row(name, value, ok):
        rows.append({"target": name, "value": value,
                     "verdict": "n/a" if ok is None else ("PASS" if ok else "MISS")})

    def ratio(a, b):
        return a / b if a is not None and b else None

    d, s = lat.get("direct"), lat.get("sam-box")
    r = ratio(s and s["median_us"], d and d["median_us"])
    row(f"set-up latency ≤ {TARGET_SETUP_RATIO}× direct (median)",
        f"{r:.2f}×" if r else "n/a", None if r is None else r <= TARGET_SETUP_RATIO)
    u = lat.get(UNCACHED)
    r = ratio(u and u["median_us"], d and d["median_us"])
    row(f"  the same, a lookup every flow ({UNCACHED})",
        f"{r:.2f}×" if r else "n/a", None if r is None else r <= TARGET_SETUP_RATIO)
    for mode, _, _ in MODES:
        r = ratio(thr.get("sam-box", {}).get(mode, {}).get("gib_per_s"),
                  thr.get("direct", {}).get(mode, {}).get("gib_per_s"))
        row(f"throughput ≥ {TARGET_THROUGHPUT_RATIO:.0%} of direct ({mode})",
            f"{r:.0%}" if r else "n/a", None if r is None else r >= TARGET_THROUGHPUT_RATIO)
    for other in ("squid", "tinyproxy"):
        o = lat.get(other)
        r = ratio(s and s["median_us"], o and o["median_us"])
        row(f"set-up faster than {other} (median)",
            f"{r:.2f}× of {other}'s time" if r else "n/a", None if r is None else r < 1)
        worst = None
        for mode, _, _ in MODES:
            q = ratio(thr.get("sam-box", {}).get(mode, {}).get("gib_per_s"),
                      thr.get(other, {}).get(mode, {}).get("gib_per_s"))
            if q is not None:
                worst = q if worst is None else min(worst, q)
        row(f"throughput faster than {other} (every direction)",
            f"{worst:.2f}× {other}'s, worst direction" if worst else "n/a",
            None if worst is None else worst > 1)
    idle = rss.get("sam-box", {}).get("idle")
    mib = idle["rss_kib"] / 1024 if idle else None
    row(f"sam-box RSS idle ≤ {TARGET_RSS_IDLE_MIB:g} MiB", f"{mib:.1f} MiB" if mib else "n/a",
        None if mib is None else mib <= TARGET_RSS_IDLE_MIB)
    return rows


def floor_comparison(lat, thr):
    """sam-box (and sam-box/0) against the floor relay, and the floor against direct: how much
    of sam-box's cost is a second process relaying CONNECT at all, and how much is sam-box."""
    def ratio(a, b):
        return a / b if a is not None and b else None

    def med(n):
        return lat.get(n, {}).get("median_us")

    out = {"setup": {}, "throughput": {}}
    d, f = med("direct"), med(FLOOR)
    out["setup"]["floor_x_direct"] = ratio(f, d)
    out["setup"]["floor_extra_us"] = f - d if f is not None and d is not None else None
    out["setup"]["floor_proxy_cpu_us"] = lat.get(FLOOR, {}).get("proxy_cpu_us_per_setup")
    for n in ("sam-box", UNCACHED):
        s = med(n)
        out["setup"][n] = {
            "x_floor": ratio(s, f), "x_direct": ratio(s, d),
            "extra_us_over_floor": s - f if s is not None and f is not None else None,
            "extra_us_over_direct": s - d if s is not None and d is not None else None,
            # the floor's share of what sam-box adds over direct
            "floor_share": ratio(f - d, s - d) if None not in (s, f, d) else None,
            "proxy_cpu_us": lat.get(n, {}).get("proxy_cpu_us_per_setup")}
    for mode, _, _ in MODES:
        def rate(n, mode=mode):
            return thr.get(n, {}).get(mode, {}).get("gib_per_s")

        def cpu(n, mode=mode):
            return thr.get(n, {}).get(mode, {}).get("proxy_cpu_s_per_gib")

        out["throughput"][mode] = {
            "sam_box_of_floor": ratio(rate("sam-box"), rate(FLOOR)),
            "sam_box_of_direct": ratio(rate("sam-box"), rate("direct")),
            "floor_of_direct": ratio(rate(FLOOR), rate("direct")),
            "sam_box_proxy_cpu_s_per_gib": cpu("sam-box"), "floor_proxy_cpu_s_per_gib": cpu(FLOOR)}
    return out


def floor_lines(fc):
    """The summary lines of floor_comparison; none without both sam-box and the floor."""
    lines = []
    st = fc["setup"]
    if st["floor_x_direct"] is None:
        return lines
    for n in ("sam-box", UNCACHED):
        x = st.get(n, {})
        if x.get("x_floor") is None:
            continue
        lines.append(f"  {n} set-up: {x['x_floor']:.2f}× the floor relay; the floor relay itself"
                     f" {st['floor_x_direct']:.2f}× direct")
        lines.append(f"    of {n}'s {x['extra_us_over_direct']:+.0f} µs over direct, the floor"
                     f" relay's {st['floor_extra_us']:+.0f} µs ({fmt(x['floor_share'], '.0%')});"
                     f" proxy CPU per set-up {fmt(x['proxy_cpu_us'], '.0f')} µs against"
                     f" {fmt(st['floor_proxy_cpu_us'], '.0f')}")
    for mode, _, _ in MODES:
        t = fc["throughput"][mode]
        if t["sam_box_of_floor"] is None:
            continue
        lines.append(f"  sam-box throughput {mode + ':':<5} {t['sam_box_of_floor']:.0%} of the"
                     f" floor relay's; the floor relay itself {fmt(t['floor_of_direct'], '.0%')} of"
                     f" direct (proxy CPU s per GiB"
                     f" {fmt(t['sam_box_proxy_cpu_s_per_gib'], '.2f')} against"
                     f" {fmt(t['floor_proxy_cpu_s_per_gib'], '.2f')})")
    return lines


def print_report(res):
    m, lat, thr, rss = res["meta"], res["latency"], res["throughput"], res["memory"]
    out = []
    out.append(f"sam-box benchmark  {m['date']}  repo {m['git']}  {m['cpus']} CPUs "
               f"({m['cpu_model']})  Linux {m['kernel']}")
    out.append(f"sam-box binary: {m['sam_box_binary']}")
    out.append(f"load average at start {m['loadavg_start']}, at end {m['loadavg_end']}"
               + ("   <- other work on this machine: expect noise" if
                  max(m["loadavg_start"][0], m["loadavg_end"][0]) > 0.5 * m["cpus"] else ""))
    out.append(f"all traffic on the loopback of netns {m['netns']}; upstream 127.0.0.1:"
               f"{m['upstream_port']} named {NAME} (/etc/netns hosts)")
    out.append("client transport: " + "; ".join(
        f"{n}: {p['transport']}" for n, p in res["paths"].items()))
    out.append("")
    out.append(f"Allowlist check (CONNECT → status; want 200 / refused / refused / refused)")
    for n, c in res["checks"].items():
        if c.get("policy") == "none":
            out.append(f"  {n:<10} {NAME}:port {c['allowed']}   (no policy: relays every CONNECT"
                       " to the upstream; the refusals are not checked)")
            continue
        out.append(f"  {n:<10} {NAME}:port {c['allowed']}   {OTHER_NAME}:port {c['other_name']}"
                   f"   {NAME}:other-port {c['other_port']}   127.0.0.1:port {c['ip_literal']}")
    for n, p in res["paths"].items():
        if p.get("error"):
            out.append(f"  ! {n}: {p['error']}")
    out.append("")
    out.append(f"Set-up latency, µs (connect → CONNECT → 200 → 1 byte echoed; "
               f"{m['setups']} sequential set-ups per path)")
    out.append(f"  {'path':<10} {'median':>8} {'p90':>8} {'p99':>8} {'mean':>8}"
               f" {'×direct':>8} {'+µs':>7} {'p99×dir':>8}  proxy CPU µs/set-up")
    d = lat.get("direct")
    for n, v in lat.items():
        out.append(f"  {n:<10} {v['median_us']:>8.1f} {v['p90_us']:>8.1f} {v['p99_us']:>8.1f}"
                   f" {v['mean_us']:>8.1f} {fmt(d and v['median_us'] / d['median_us'], '>8.2f')}"
                   f" {fmt(d and v['median_us'] - d['median_us'], '>7.0f')}"
                   f" {fmt(d and v['p99_us'] / d['p99_us'], '>8.2f')}"
                   f"  {fmt(v['proxy_cpu_us_per_setup'], '>8.0f')}")
    out.append("")
    out.append(f"Throughput, GiB/s ({size(m['bytes'])} per direction, one tunnel; median of"
               f" {m['trials']} run(s); 'both' = up+down moved at once, aggregate)")
    out.append(f"  {'path':<10} {'dir':<5} {'GiB/s':>6} {'×direct':>8} {'min–max':>11}"
               f"   CPU s per GiB: {'client':>6} {'proxy':>6} {'upstream':>8}")
    dt = thr.get("direct", {})
    for n, v in thr.items():
        for k, _, _ in MODES:
            x = v.get(k)
            if not x:
                continue
            rel = x["gib_per_s"] / dt[k]["gib_per_s"] if dt.get(k) else None
            out.append(f"  {n:<10} {k:<5} {x['gib_per_s']:>6.2f} {fmt(rel, '>8.0%')}"
                       f" {x['min']:>5.2f}–{x['max']:<5.2f}   {'':15}"
                       f"{fmt(x['client_cpu_s_per_gib'], '>6.2f')}"
                       f" {fmt(x['proxy_cpu_s_per_gib'], '>6.2f')}"
                       f" {fmt(x['upstream_cpu_s_per_gib'], '>8.2f')}")
    if res.get("throughput_trials_skipped"):
        out.append(f"  ({res['throughput_trials_skipped']} trial(s) skipped: over the time budget)")
    out.append("")
    out.append(f"Memory, VmRSS MiB [of which anonymous]: idle at start, 1 open flow, "
               f"{m['flows']} open flows, idle after the run; then PSS idle")
    for n, v in rss.items():
        cells = []
        for k in ("idle", "one", "many", "idle_after"):
            x = v.get(k)
            cells.append(f"{x['rss_kib'] / 1024:6.1f} [{x['anon_kib'] / 1024:5.1f}]" if x
                         else f"{'-':>14}")
        idle = v.get("idle")
        extra = f"   PSS {idle['pss_kib'] / 1024:.1f}" if idle else ""
        out.append(f"  {n:<10} " + "  ".join(cells) + extra)
    if res.get("sam_box_metrics_check"):
        out.append(f"  sam-box metrics: {res['sam_box_metrics_check']}")
    lines = floor_lines(res["floor_comparison"])
    if lines:
        out.append("")
        out.append("Against the floor (the least a separate process relaying CONNECT costs here;"
                   " targets stay against direct)")
        out += lines
    out.append("")
    out.append("Targets (issue 2)")
    for t in res["targets"]:
        out.append(f"  {t['verdict']:<5} {t['target']:<48} {t['value']}")
    out.append("")
    out.append(f"elapsed {m['elapsed_s']:.0f}s; JSON: {res['json_path']}")
    print("\n".join(out), flush=True)


def run_bench(args, procs):
    run = Runner(args)
    wd = pathlib.Path(args.workdir)
    nofile = raise_nofile()
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "git": git_describe(REPO, ("src",)), "cpus": os.cpu_count(), "cpu_model": cpu_model(),
            "kernel": platform.release(), "netns": args.netns, "loadavg_start": loadavg(),
            "setups": args.setups, "bytes": args.bytes, "trials": args.trials,
            "flows": args.flows, "nofile": list(nofile), "python": platform.python_version(),
            "sam_box_binary": args.binary_id or args.sam_box}

    upstream = procs.start("upstream", [args.load, "serve", "--listen", "127.0.0.1:0"],
                           stdout=subprocess.PIPE)
    port = read_json_line(upstream, timeout=START_TIMEOUT)["port"]
    run.upstream_pid = upstream.pid
    meta["upstream_port"] = port
    log(f"upstream on 127.0.0.1:{port} ({NAME})")

    wanted = {"sam-box", FLOOR, "squid", "tinyproxy"}
    if args.only:
        wanted &= {x.strip() for x in args.only.split(",")}
    paths = {"direct": {"via": ["--via", "direct", "--target", f"127.0.0.1:{port}"],
                        "client": (socket.AF_INET, ("127.0.0.1", port)),
                        "transport": "TCP 127.0.0.1, no proxy"}}
    memory_rows = {}
    # sam-box keeps a name's answer for --resolve-cache-ttl (5 s), so after the first set-up
    # of a block every sam-box set-up reuses it. UNCACHED is the same boundary with the cache
    # off: every set-up pays a getaddrinfo(3) and two thread hand-offs. Set-up latency only.
    starters = {"sam-box": lambda: start_sam_box(args, procs, wd, port),
                UNCACHED: lambda: dict(start_sam_box(args, procs, wd, port, name=UNCACHED,
                                                     extra=["--resolve-cache-ttl", "0"]),
                                       latency_only=True),
                FLOOR: lambda: start_floor(args, procs, wd, port),
                "squid": lambda: start_squid(args, procs, wd, port),
                "tinyproxy": lambda: start_tinyproxy(args, procs, wd, port, args.flows)}
    if "sam-box" in wanted:
        wanted.add(UNCACHED)
    for name in ("sam-box", UNCACHED, FLOOR, "squid", "tinyproxy"):
        if name not in wanted:
            continue
        try:
            paths[name] = starters[name]()
            time.sleep(0.3)  # let start-up settle before the idle reading
            if not paths[name].get("latency_only"):
                memory_rows[name] = {"idle": memory(paths[name]["proc"].pid)}
            log(f"{name} ready (pid {paths[name]['proc'].pid})")
        except (RuntimeError, OSError) as e:
            paths[name] = {"error": f"start: {e}", "transport": "-"}
            log(f"{name}: {paths[name]['error']}")

    # The same allowlist everywhere: one name, one port, no IP literals. The floor relay has
    # no policy by construction: only its allowed CONNECT is checked (it must carry data).
    checks = {}
    closed_port = free_port()
    for name, p in paths.items():
        if name == "direct" or p.get("error"):
            continue
        if p.get("enforces_policy") is False:
            checks[name] = {"allowed": connect_status(p["client"], f"{NAME}:{port}"),
                            "policy": "none"}
            account(p, 1, 1, 1)
            if checks[name]["allowed"] != 200:
                p["error"] = f"CONNECT {NAME}:{port} answered {checks[name]['allowed']}, not 200"
            continue
        c = {"allowed": connect_status(p["client"], f"{NAME}:{port}"),
             "other_name": connect_status(p["client"], f"{OTHER_NAME}:{port}"),
             "other_port": connect_status(p["client"], f"{NAME}:{closed_port}"),
             "ip_literal": connect_status(p["client"], f"127.0.0.1:{port}")}
        checks[name] = c
        account(p, 1, 1, 1)
        if c["allowed"] != 200:
            p["error"] = f"CONNECT {NAME}:{port} answered {c['allowed']}, not 200"
        elif any(c[k] == 200 for k in ("other_name", "other_port", "ip_literal")):
            p["policy_differs"] = True
            log(f"{name}: allowlist is wider than sam-box's: {c}")

    phases = {"start": run.elapsed()}
    log(f"set-up latency: {args.setups} per path")
    lat = measure_latency(run, paths, args.setups)
    phases["latency"] = run.elapsed()
    log(f"throughput: {size(args.bytes)} per direction, {args.trials} trial(s)")
    thr, skipped = measure_throughput(run, paths, args.bytes, args.trials, args.budget)
    phases["throughput"] = run.elapsed()
    log(f"memory: 1 and {args.flows} open flows")
    for name, p in paths.items():
        if name == "direct" or p.get("error") or p.get("latency_only"):
            continue
        try:
            memory_rows[name]["one"], _ = hold(run, p, 1)
            memory_rows[name]["many"], memory_rows[name]["many_setup_s"] = hold(
                run, p, args.flows)
            time.sleep(0.5)  # the proxy closes its upstream side of every held flow
            memory_rows[name]["idle_after"] = memory(p["proc"].pid)
        except RuntimeError as e:
            p["error"] = str(e)
            log(f"{name}: {e}")

    phases["memory"] = run.elapsed()
    meta["phases_end_s"] = {k: round(v, 1) for k, v in phases.items()}
    metrics_check = None
    sb = paths.get("sam-box", {})
    if sb.get("metrics_port"):
        mx = scrape_metrics(sb["metrics_port"])
        allowed = mx.get('sam_box_flows_total{outcome="allowed",route="external"}')
        denied = sum(v for k, v in mx.items() if k.startswith("sam_box_flows_total")
                     and 'outcome="denied"' in k)
        open_now = sum(v for k, v in mx.items() if k.startswith("sam_box_flows_in_progress"))
        up = mx.get('sam_box_bytes_total{direction="upstream",route="external"}', 0)
        down = mx.get('sam_box_bytes_total{direction="downstream",route="external"}', 0)
        want = (sb.get("flows", 0), sb.get("bytes_up", 0), sb.get("bytes_down", 0))
        if allowed is not None:
            ok = (allowed, up, down) == want and open_now == 0
            metrics_check = (("consistent" if ok else "INCONSISTENT (a broken build? see "
                              "README)") + f": flows allowed {allowed:.0f}/{want[0]}, bytes up "
                             f"{up:.0f}/{want[1]}, down {down:.0f}/{want[2]} (counted/sent), "
                             f"{denied:.0f} denied, {open_now:.0f} open at the end")

    meta["loadavg_end"] = loadavg()
    meta["elapsed_s"] = run.elapsed()
    res = {"meta": meta,
           "paths": {n: {k: v for k, v in p.items() if k not in ("proc", "client")}
                     for n, p in paths.items()},
           "checks": checks, "latency": lat, "throughput": thr,
           "throughput_trials_skipped": skipped, "memory": memory_rows,
           "sam_box_metrics_check": metrics_check}
    res["targets"] = targets(lat, thr, memory_rows)
    res["floor_comparison"] = floor_comparison(lat, thr)
    out = pathlib.Path(args.out) if args.out else RESULTS / (
        "sam-box-" + meta["date"].replace(":", "").replace("-", "") + ".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    res["json_path"] = str(out)
    out.write_text(json.dumps(res, indent=2) + "\n")
    print_report(res)
    return 0


def inner(args):
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, raise_interrupt)
    procs = Procs()
    try:
        return run_bench(args, procs)
    except KeyboardInterrupt:
        log("interrupted: stopping servers")
        return 130
    finally:
        procs.stop_all()


def main(argv):
    args = parse_args(argv)
    return inner(args) if args.inner else outer(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
