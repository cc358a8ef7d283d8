#!/usr/bin/python3
"""nano-init benchmark: connect latency, bulk TCP throughput and memory of a sandbox's only way
out (nano-init's userspace TCP/IP + sam-box), against the same client run directly on the
host side, and in network namespaces given connectivity by pasta and by slirp4netns.

    sudo /usr/bin/python3 bench/nano_init_bench.py            # full run, about 3-5 minutes
    sudo /usr/bin/python3 bench/nano_init_bench.py --quick    # smoke run, about 30 seconds

Everything runs in network namespaces this script creates and removes: "up" holds the
upstream server on a veth (198.18.0.2, RFC 2544 benchmarking space); "host" is the other end
of that veth (198.18.0.1) and plays the machine's own network: the direct client, sam-box,
pasta and slirp4netns run there. No packet goes anywhere else. The bytes are moved by
nano-init-bench-load (bench/nano-init/nano_load.cc, built here with CMake on first use); this
file only orchestrates, measures memory and CPU from /proc, and reports.

A benchmark, not a test: it prints PASS/MISS per target of issue 3 and exits 0 either way
(non-zero only when it could not measure at all). The results are also written as JSON under
bench/results/ (git-ignored). See bench/README.md ("nano-init") for how to read them.

Every child gets PR_SET_PDEATHSIG=SIGKILL, so nothing outlives the run even on SIGKILL; Ctrl-C,
SIGTERM and the hard time cap clean up in order; a run killed with SIGKILL leaves namespaces
named after its PID, which the next run removes.
"""

import argparse
import datetime
import hashlib
import json
import os
import pathlib
import platform
import re
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from benchlib import (GIB, MIB, cpu_model, descendants, die_with_parent, fmt, git_describe,
                      loadavg, log, median, percentile, raise_interrupt, size)

REPO = pathlib.Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
LOAD_SRC = BENCH / "nano-init"
RESULTS = BENCH / "results"
NAME = "upstream.nano-bench.test"  # the upstream's name, the one sam-box allows
UP_ADDR, HOST_ADDR, PREFIX = "198.18.0.2", "198.18.0.1", 24

# Targets from issue 3 ("Benchmark").
TARGET_CONNECT_RATIO = 2.0  # nano-init connect ≤ 2 × direct
TARGET_RSS_MIB = 8.0  # nano-init VmRSS with 1,000 open flows
TARGET_RSS_FLOWS = 1000

HARD_CAP_SECONDS = 900  # the whole run is stopped (and cleaned up) after this
START_TIMEOUT = 20.0
CLK_TCK = os.sysconf("SC_CLK_TCK")
PREFIX_NS = "nbench-"



# ---------------------------------------------------------------------------------------
# Arguments


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nano-init", default=str(REPO / "build/src/nano-init/nano-init"),
                   help="nano-init binary (default: the project build; must be the static "
                        "release build, not a sanitizer one)")
    p.add_argument("--sam-box", default=str(REPO / "build/src/sam-box/sam-box"),
                   help="sam-box binary (default: the project build)")
    p.add_argument("--load", default="", help="a prebuilt nano-init-bench-load")
    p.add_argument("--setups", type=int, help="timed connects per path (default 2000)")
    p.add_argument("--bytes", type=int,
                   help="bytes per direction per throughput run (default 1 GiB)")
    p.add_argument("--trials", type=int,
                   help="throughput runs per path and direction; median reported (default 3)")
    p.add_argument("--flows", type=int,
                   help="connections held open at once for the memory reading (default 1000)")
    p.add_argument("--tun-mtu", type=int, default=65520,
                   help="also measure nano-init on a tun0 its launcher made with this MTU "
                        "(default 65520, the MTU pasta and slirp4netns use here; 0: off)")
    p.add_argument("--budget", type=float, default=240.0,
                   help="seconds; past this, further throughput trials are skipped")
    p.add_argument("--only", default="",
                   help="comma-separated subset of nano-init,pasta,slirp4netns "
                        "(direct always runs)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 400 connects, 128 MiB, 1 trial, 200 flows "
                        "(explicit flags win)")
    p.add_argument("--out", default="", help="JSON result path (default bench/results/…)")
    p.add_argument("--logs", default="",
                   help="directory for nano-init's, sam-box's, pasta's and slirp4netns' logs "
                        "(default: a temporary one, removed; its tail is printed on failure)")
    args = p.parse_args(argv)
    defaults = {"setups": 400, "bytes": 128 * MIB, "trials": 1, "flows": 200} if args.quick \
        else {"setups": 2000, "bytes": GIB, "trials": 3, "flows": 1000}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for key in defaults:
        if getattr(args, key) < 1:
            p.error(f"--{key} must be at least 1")
    if args.tun_mtu and not 1280 <= args.tun_mtu <= 65535:
        p.error("--tun-mtu must be 0 or 1280..65535")
    return args


# ---------------------------------------------------------------------------------------
# Binaries


def find_load_tool(explicit):
    """The load generator: explicit, or built here into build-nbench-load/ when stale."""
    if explicit:
        return pathlib.Path(explicit).resolve()
    build_dir = REPO / "build-nbench-load"
    binary = build_dir / "nano-init-bench-load"
    sources = [LOAD_SRC / "nano_load.cc", LOAD_SRC / "CMakeLists.txt",
               BENCH / "load_common.h", BENCH / "load_common.cc"]
    if binary.exists() and binary.stat().st_mtime >= max(f.stat().st_mtime for f in sources):
        return binary
    log(f"building the load generator into {build_dir.relative_to(REPO)}/")
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    for cmd in (["cmake", "-S", str(LOAD_SRC), "-B", str(build_dir), *gen,
                 "-DCMAKE_BUILD_TYPE=Release"],
                ["cmake", "--build", str(build_dir), "--target", "nano-init-bench-load"]):
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=300)
        if r.returncode != 0:
            sys.exit(f"bench: {' '.join(cmd)} failed:\n{r.stdout}")
    return binary


def binary_id(path):
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    built = datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.timezone.utc)
    return f"{path} sha256:{digest} built {built:%Y-%m-%dT%H:%M:%SZ}"


def is_static(path):
    r = subprocess.run(["ldd", str(path)], capture_output=True, text=True, timeout=30)
    out = r.stdout + r.stderr
    return "not a dynamic executable" in out or "statically linked" in out  # static PIE: the 2nd


def tool_version(cmd):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
        return (r.stdout + r.stderr).strip().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "unknown"


def deb_version(package):
    try:
        r = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True,
                           text=True, timeout=10)
        return r.stdout.strip() or "not installed"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


# ---------------------------------------------------------------------------------------
# Namespaces


def sh(*cmd, check=True):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")
    return r


def sweep_stale():
    """Removes namespaces and work directories of runs that are gone (each name carries its
    run's PID). Their processes died with them (PR_SET_PDEATHSIG)."""
    def dead(pid):
        return pid.isdigit() and not os.path.exists(f"/proc/{pid}")

    listed = sh("ip", "netns", "list", check=False).stdout
    for line in listed.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(PREFIX_NS) and dead(name[len(PREFIX_NS):].split("-")[0]):
            log(f"removing stale netns {name}")
            sh("ip", "netns", "del", name, check=False)
    for d in pathlib.Path(tempfile.gettempdir()).glob("nano-init-bench-*-*"):
        if dead(d.name.split("-")[3]):
            log(f"removing stale {d}")
            shutil.rmtree(d, ignore_errors=True)


class Namespaces:
    """The run's network namespaces: created here, always removed."""

    def __init__(self, wd):
        self.tag = f"{PREFIX_NS}{os.getpid()}"
        self.made = []
        # The upstream's name for every process outside a sandbox, as /etc/hosts in a private
        # mount namespace per process (see in_ns). Not through /etc/netns or a bind mount of
        # /etc/hosts: when anything on the host replaces /etc/hosts (rename over it, as other
        # test suites on a shared machine do), the kernel detaches every mount on that file in
        # every namespace, and the name would silently stop resolving mid-run.
        self.wd = wd
        self.overlays = 0

    def etc_overlay(self):
        """A fresh upper/work pair holding only `hosts`, for one overlay over /etc."""
        self.overlays += 1
        base = self.wd / f"etc{self.overlays}"
        (base / "upper").mkdir(parents=True)
        (base / "work").mkdir()
        (base / "upper" / "hosts").write_text(f"127.0.0.1 localhost\n{UP_ADDR} {NAME}\n")
        return base

    def name(self, role):
        return f"{self.tag}-{role}"

    def add(self, role):
        ns = self.name(role)
        sh("ip", "netns", "add", ns)
        self.made.append(ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        return ns

    def in_ns(self, ns, cmd):
        """argv running `cmd` in netns `ns`, in a private mount namespace whose /etc is the
        host's with an overlay: an /etc/hosts that names the upstream (and nothing else)."""
        base = self.etc_overlay()
        mount = (f"mount -t overlay nano-init-bench -o lowerdir=/etc,upperdir={base}/upper,"
                 f"workdir={base}/work /etc")
        return ["nsenter", f"--net=/run/netns/{ns}", "unshare", "--mount", "--propagation",
                "private", "--", "sh", "-c", mount + ' && exec "$@"', "sh",
                *[str(c) for c in cmd]]

    def wire(self):
        """host ⇄ up over one veth pair; up does not forward, so nothing goes further."""
        host, up = self.add("host"), self.add("up")
        pid = os.getpid()
        vh, vu = f"nb{pid}h", f"nb{pid}u"
        sh("ip", "link", "add", vh, "type", "veth", "peer", "name", vu)
        sh("ip", "link", "set", vh, "netns", host)
        sh("ip", "link", "set", vu, "netns", up)
        sh("ip", "-n", host, "addr", "add", f"{HOST_ADDR}/{PREFIX}", "dev", vh)
        sh("ip", "-n", up, "addr", "add", f"{UP_ADDR}/{PREFIX}", "dev", vu)
        sh("ip", "-n", host, "link", "set", vh, "up")
        sh("ip", "-n", up, "link", "set", vu, "up")
        # pasta and slirp4netns need a default route to pick their outbound interface.
        sh("ip", "-n", host, "route", "add", "default", "via", UP_ADDR)
        return host, up, vh

    def remove(self):
        for ns in reversed(self.made):
            # Anything still inside (none should be: every child dies with this run).
            for pid in sh("ip", "netns", "pids", ns, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            sh("ip", "netns", "del", ns, check=False)
        self.made.clear()


# ---------------------------------------------------------------------------------------
# Processes


class Procs:
    """Every long-lived process of the run, stopped in reverse order on the way out."""

    def __init__(self):
        self.live = []

    def start(self, name, cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
              stderr=subprocess.DEVNULL):
        proc = subprocess.Popen(cmd, stdin=stdin, stdout=stdout, stderr=stderr,
                                start_new_session=True, preexec_fn=die_with_parent)
        self.live.append((name, proc))
        return proc

    def stop_all(self):
        # Agents first, by closing their stdin: an agent then exits, and so does the nano-init
        # whose agent it is (`unshare --fork` blocks SIGTERM; it exits with its child).
        for _, proc in reversed(self.live):
            if proc.stdin is not None and not proc.stdin.closed:
                try:
                    proc.stdin.close()
                except OSError:
                    pass
        deadline = time.monotonic() + 3
        for _, proc in reversed(self.live):
            if proc.stdin is not None:
                try:
                    proc.wait(timeout=max(0.05, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        for _, proc in reversed(self.live):
            if proc.poll() is None:
                try:
                    proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 5
        for _, proc in reversed(self.live):
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        self.live.clear()


class Lines:
    """Whole lines from a pipe, with a timeout; buffered here, not in a file object, so that
    select() never waits for a line that is already read."""

    def __init__(self, fd):
        self.fd, self.buf = fd, b""

    def read(self, timeout, proc=None):
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"no output within {timeout:.0f}s")
            ready, _, _ = select.select([self.fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(self.fd, 65536)
            if not chunk:
                status = proc.wait() if proc is not None else "?"
                raise RuntimeError(f"exited with status {status} without output")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode(errors="replace")


def read_json_line(proc, timeout):
    """The next line of `proc`'s stdout (a pipe), as JSON."""
    if not hasattr(proc, "lines"):
        proc.lines = Lines(proc.stdout.fileno())
    line = proc.lines.read(timeout, proc)
    try:
        return json.loads(line)
    except ValueError:
        raise RuntimeError(f"not JSON: {line[:200]!r}") from None


class Agent:
    """One `nano-init-bench-load agent` inside a path's namespace: one command per line."""

    def __init__(self, proc, name):
        self.proc, self.name = proc, name

    def run(self, line, timeout):
        """Runs one command; its JSON lines, up to {"done": 0}. RuntimeError otherwise."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"agent exited with status {self.proc.returncode}")
        self.send(line + "\n")
        return self.collect(timeout)

    def send(self, text):
        self.proc.stdin.write(text.encode())
        self.proc.stdin.flush()

    def collect(self, timeout):
        out = []
        deadline = time.monotonic() + timeout
        while True:
            d = read_json_line(self.proc, max(0.1, deadline - time.monotonic()))
            if "done" in d:
                if d["done"] != 0:
                    errors = [x["error"] for x in out if "error" in x]
                    raise RuntimeError("; ".join(errors) or f"exit status {d['done']}")
                return out
            out.append(d)


def child_pid(pid, timeout=START_TIMEOUT):
    """The first child of `pid` (unshare --fork's child: nano-init)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        kids = descendants(pid)[1:]
        if kids:
            return kids[0]
        time.sleep(0.02)
    raise RuntimeError(f"process {pid} has no child after {timeout:.0f}s")


def memory(pids):
    """VmRSS and RssAnon (KiB) summed over `pids` (each alone, not its descendants)."""
    total = {"VmRSS": 0, "RssAnon": 0}
    for p in pids:
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    key, _, value = line.partition(":")
                    if key in total:
                        total[key] += int(value.split()[0])
        except OSError:
            pass
    return {"rss_kib": total["VmRSS"], "anon_kib": total["RssAnon"]}


def cpu_seconds(pids):
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, IndexError, ValueError):
            pass
    return total / CLK_TCK


def wait_for(pred, what, timeout=START_TIMEOUT, proc=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: exited with status {proc.returncode}")
        if pred():
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what}: not ready after {timeout:.0f}s")


def link_mtu(ns, dev):
    r = sh("ip", "-n", ns, "-o", "link", "show", "dev", dev, check=False)
    m = re.search(r" mtu (\d+)", r.stdout)
    return int(m.group(1)) if m else None


def has_default_route(ns):
    return "default" in sh("ip", "-n", ns, "route", "show", check=False).stdout


# ---------------------------------------------------------------------------------------
# The paths under test. Each returns a dict: agent, stack_pids (the processes whose CPU and
# memory are the path's cost), description, mtu.


class Bench:
    def __init__(self, args, procs, nss, wd, logs):
        self.args, self.procs, self.nss, self.wd, self.logs = args, procs, nss, wd, logs
        self.port = None
        self.t0 = time.monotonic()

    def elapsed(self):
        return time.monotonic() - self.t0

    def logfile(self, name):
        return open(self.logs / name, "ab")

    def start_agent(self, name, cmd):
        err = self.logfile(f"{name}.log")
        try:
            proc = self.procs.start(f"agent {name}", cmd, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=err)
        finally:
            err.close()
        return proc, Agent(proc, name)

    def upstream(self, up_ns):
        proc = self.procs.start("upstream", ["nsenter", f"--net=/run/netns/{up_ns}",
                                             self.args.load, "serve", "--listen",
                                             f"{UP_ADDR}:0"], stdout=subprocess.PIPE)
        self.port = read_json_line(proc, START_TIMEOUT)["port"]
        self.upstream_pid = proc.pid
        return proc

    def direct(self, host_ns, vh):
        _, agent = self.start_agent("direct", self.nss.in_ns(host_ns, [self.args.load, "agent"]))
        return {"agent": agent, "stack_pids": lambda: [], "mtu": link_mtu(host_ns, vh),
                "description": "the client in the host namespace, kernel TCP over the veth"}

    def start_sam_box(self, host_ns, label):
        """One sam-box per nano-init path, so each path's memory and CPU are its own."""
        sock = str(self.wd / f"{label}.sock")
        cmd = self.nss.in_ns(host_ns, [self.args.sam_box, "run", "--socket", sock,
                                       "--egress-allow", f"{NAME}:{self.port}"])
        err = self.logfile(f"sam-box-{label}.log")
        try:
            proc = self.procs.start(f"sam-box {label}", cmd, stderr=err)
        finally:
            err.close()
        wait_for(lambda: os.path.exists(sock), "sam-box", proc=proc)
        return proc, sock

    def nano_init(self, host_ns, label, tun_mtu):
        """nano-init as PID 1 of fresh PID + network namespaces. tun_mtu None: it makes tun0
        itself (as in `docker run --cap-add NET_ADMIN`). Else the launcher made a persistent
        tun0 with that MTU in the netns first (DESIGN.md: the runner prepares the netns), and
        nano-init attaches to it."""
        sb_proc, sock = self.start_sam_box(host_ns, label)
        tail = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child",
                self.args.nano_init, "run", "--user", "0:0", sock, self.args.load, "agent"]
        if tun_mtu is None:
            cmd = ["unshare", "--net", *tail[1:]]
            how = "nano-init made tun0 itself (with its own MTU)"
        else:
            ns = self.nss.add(label.replace("nano-init", "n"))
            sh("ip", "-n", ns, "tuntap", "add", "dev", "tun0", "mode", "tun")
            sh("ip", "-n", ns, "link", "set", "tun0", "mtu", str(tun_mtu))
            cmd = ["nsenter", f"--net=/run/netns/{ns}", *tail]
            how = f"tun0 made by the launcher with MTU {tun_mtu}, adopted by nano-init"
        # Not through in_ns: the sandbox sees the host's /etc/hosts, which does not know the
        # name, so the agent resolves it through nano-init's virtual DNS.
        proc, agent = self.start_agent(label, cmd)
        nano_pid = child_pid(proc.pid)
        logpath = self.logs / f"{label}.log"
        wait_for(lambda: b"netstack started" in logpath.read_bytes(), label, proc=proc)
        m = re.search(rb'"msg":"netstack started"[^\n]*?"mtu":(\d+)|"mtu":(\d+)[^\n]*'
                      rb'"msg":"netstack started"', logpath.read_bytes())
        mtu = int(m.group(1) or m.group(2)) if m else None
        static = is_static(self.args.nano_init)
        return {"agent": agent, "proc": proc, "nano_pid": nano_pid, "log": logpath,
                "stack_pids": lambda: [nano_pid, sb_proc.pid], "mtu": mtu,
                "description": f"{how}; lwIP in nano-init (PID 1, "
                               f"{'static' if static else 'NOT static'}) → Unix socket → "
                               f"sam-box → kernel TCP over the veth"}

    def pasta(self, host_ns):
        ns = self.nss.add("pasta")
        # --runas 0:0: Debian bookworm's pasta (2023-03) drops to nobody before joining the
        # namespace and then cannot ("Couldn't switch to pasta namespaces").
        cmd = self.nss.in_ns(host_ns, [
            "pasta", "-f", "-q", "--runas", "0:0", "--config-net", "--no-map-gw", "-t", "none",
            "-u", "none", "-T", "none", "-U", "none", "--netns", f"/run/netns/{ns}"])
        err = self.logfile("pasta.log")
        try:
            proc = self.procs.start("pasta", cmd, stderr=err)
        finally:
            err.close()
        wait_for(lambda: has_default_route(ns), "pasta", proc=proc)
        _, agent = self.start_agent("pasta", self.nss.in_ns(ns, [self.args.load, "agent"]))
        dev = sh("ip", "-n", ns, "-o", "route", "show", "default").stdout.split(" dev ")[1].split()[0]
        return {"agent": agent, "stack_pids": lambda: [proc.pid], "mtu": link_mtu(ns, dev),
                "description": "pasta (tap, L2 → host sockets; --config-net copies the host's "
                               "address and routes; --no-map-gw)"}

    def slirp4netns(self, host_ns):
        ns = self.nss.add("slirp")
        cmd = self.nss.in_ns(host_ns, [
            "slirp4netns", "--configure", "--mtu=65520", "--disable-host-loopback",
            "--netns-type=path", f"/run/netns/{ns}", "tap0"])
        err = self.logfile("slirp4netns.log")
        try:
            proc = self.procs.start("slirp4netns", cmd, stdout=err, stderr=err)
        finally:
            err.close()
        wait_for(lambda: has_default_route(ns), "slirp4netns", proc=proc)
        _, agent = self.start_agent("slirp4netns", self.nss.in_ns(ns, [self.args.load, "agent"]))
        return {"agent": agent, "stack_pids": lambda: [proc.pid], "mtu": link_mtu(ns, "tap0"),
                "description": "slirp4netns (tap, libslirp's TCP/IP → host sockets)"}


# ---------------------------------------------------------------------------------------
# Measurements


def target(bench):
    return f"{NAME}:{bench.port}"


def measure_latency(bench, paths, setups, blocks=8, warmup=10):
    """Sequential connects, in blocks interleaved across paths (rotated order per block), so
    drift on a shared machine lands on every path alike. Each block resolves the name once
    (not timed in the samples; reported as resolve_us)."""
    names = [n for n in paths if not paths[n].get("error")]
    samples = {n: [] for n in names}
    resolve = {n: [] for n in names}
    cpu = {n: [0.0, 0] for n in names}
    nano_cpu = {n: 0.0 for n in names}
    blocks = min(blocks, setups)
    per_block = setups // blocks
    for b in range(blocks):
        order = names[b % len(names):] + names[:b % len(names)]
        for n in order:
            p = paths[n]
            if p.get("error"):
                continue
            pids = p["stack_pids"]()
            cpu0 = cpu_seconds(pids)
            nano0 = cpu_seconds([p["nano_pid"]]) if "nano_pid" in p else 0.0
            try:
                out = p["agent"].run(f"latency --target {target(bench)} --count {per_block} "
                                     f"--warmup {warmup}", timeout=120)[0]
            except RuntimeError as e:
                p["error"] = f"latency: {e}"
                log(f"{n}: {p['error']}")
                continue
            samples[n] += out["samples_us"]
            resolve[n].append(out["resolve_us"])
            p["address_seen"] = out["address"]
            if pids:
                cpu[n][0] += cpu_seconds(pids) - cpu0
                cpu[n][1] += per_block + warmup
            if "nano_pid" in p:
                nano_cpu[n] += cpu_seconds([p["nano_pid"]]) - nano0
    result = {}
    for n in names:
        v = sorted(samples[n])
        if not v:
            continue
        result[n] = {"count": len(v), "median_us": median(v), "p90_us": percentile(v, 90),
                     "p99_us": percentile(v, 99), "mean_us": sum(v) / len(v), "min_us": v[0],
                     "max_us": v[-1], "resolve_us_median": median(resolve[n]),
                     "stack_cpu_us_per_connect":
                         cpu[n][0] / cpu[n][1] * 1e6 if cpu[n][1] else None,
                     "nano_init_cpu_us_per_connect":
                         nano_cpu[n] / cpu[n][1] * 1e6 if cpu[n][1] and "nano_pid" in paths[n]
                         else None}
    return result


MODES = (("up", 1, 0), ("down", 0, 1))


def measure_throughput(bench, paths, nbytes, trials, budget):
    names = list(paths)
    runs = {n: {m: [] for m, _, _ in MODES} for n in names}
    failures = {n: [] for n in names}
    skipped = 0
    for t in range(trials):
        if t > 0 and bench.elapsed() > budget:
            skipped = trials - t
            log(f"over the {budget:.0f}s budget: skipping {skipped} throughput trial(s)")
            break
        order = names[t % len(names):] + names[:t % len(names)]
        for n in order:
            p = paths[n]
            for mode, up, down in MODES:
                amount = nbytes
                while not p.get("error"):
                    pids = p["stack_pids"]()
                    cpu0 = cpu_seconds(pids)
                    nano0 = cpu_seconds([p["nano_pid"]]) if "nano_pid" in p else None
                    up0 = cpu_seconds([bench.upstream_pid])
                    try:
                        out = p["agent"].run(f"throughput --target {target(bench)} "
                                             f"--up {up * amount} --down {down * amount}",
                                             timeout=300)[0]
                    except RuntimeError as e:
                        # A failed transfer is recorded, not fatal: the path stays in the run,
                        # and the trial is tried once more at half the size (bookworm's pasta
                        # resets most uploads of about 1 GiB; it survives 512 MiB).
                        failures[n].append(f"{mode} {size(amount)}: {e}")
                        log(f"{n}: throughput {mode} ({size(amount)}) failed: {e}")
                        if p["agent"].proc.poll() is not None:
                            p["error"] = f"agent died during throughput {mode}"
                        if amount < nbytes or amount // 2 < 64 * MIB:
                            break
                        amount //= 2
                        continue
                    moved = out["up_bytes"] + out["down_bytes"]
                    runs[n][mode].append({
                        "seconds": out["seconds"], "gib_per_s": moved / GIB / out["seconds"],
                        "stack_cpu_s": (cpu_seconds(pids) - cpu0) if pids else None,
                        "nano_init_cpu_s": (cpu_seconds([p["nano_pid"]]) - nano0)
                        if nano0 is not None else None,
                        "upstream_cpu_s": cpu_seconds([bench.upstream_pid]) - up0,
                        "client_cpu_s": out["cpu_s"], "bytes": moved})
                    break
    result = {}
    for n in names:
        result[n] = {"failures": failures[n]} if failures[n] else {}
        for mode, _, _ in MODES:
            r = runs[n][mode]
            if not r:
                continue
            rates = [x["gib_per_s"] for x in r]

            def per_gib(key, r=r):
                v = [x[key] / (x["bytes"] / GIB) for x in r if x[key] is not None]
                return median(v) if v else None

            result[n][mode] = {"gib_per_s": median(rates), "min": min(rates), "max": max(rates),
                               "trials": len(r), "stack_cpu_s_per_gib": per_gib("stack_cpu_s"),
                               "nano_init_cpu_s_per_gib": per_gib("nano_init_cpu_s"),
                               "client_cpu_s_per_gib": per_gib("client_cpu_s"),
                               "upstream_cpu_s_per_gib": per_gib("upstream_cpu_s"), "runs": r}
    return result, skipped


def hold(bench, path, count):
    """Holds `count` connections open through `path`; memory of its stack processes while
    held (nano-init alone for a nano-init path)."""
    agent = path["agent"]
    agent.send(f"hold --target {target(bench)} --count {count}\n")
    first = read_json_line(agent.proc, 180)
    if "open" not in first:
        agent.collect(30)
        raise RuntimeError(first.get("error", f"hold: {first}"))
    time.sleep(0.3)  # let the stack finish its side of the last connect
    mem = {"stack": memory(path["stack_pids"]()), "open_s": first["seconds"]}
    if "nano_pid" in path:
        mem["nano_init"] = memory([path["nano_pid"]])
    agent.send("\n")
    agent.collect(120)
    return mem


def nano_counters(logpath):
    """nano-init's own counters from its exit log line ("netstack stopped")."""
    try:
        for line in reversed(logpath.read_text(errors="replace").splitlines()):
            if '"netstack stopped"' in line:
                d = json.loads(line)
                return {k: v for k, v in d.items() if isinstance(v, int)}
    except (OSError, ValueError):
        pass
    return None


# ---------------------------------------------------------------------------------------
# Report


def targets(lat, thr, mem, nano_paths, flows):
    rows = []

    def row(name, value, ok):
        rows.append({"target": name, "value": value,
                     "verdict": "n/a" if ok is None else ("PASS" if ok else "MISS")})

    def ratio(a, b):
        return a / b if a is not None and b else None

    d = lat.get("direct")
    for n in nano_paths:
        s = lat.get(n)
        r = ratio(s and s["median_us"], d and d["median_us"])
        row(f"{n}: connect ≤ {TARGET_CONNECT_RATIO:g}× direct (median)",
            f"{r:.2f}×" if r else "n/a", None if r is None else r <= TARGET_CONNECT_RATIO)
        r99 = ratio(s and s["p99_us"], d and d["p99_us"])
        rows.append({"target": f"{n}: connect p99 / direct p99 (for information)",
                     "value": f"{r99:.2f}×" if r99 else "n/a", "verdict": "info"})
        for mode, _, _ in MODES:
            mine = thr.get(n, {}).get(mode, {})
            theirs = thr.get("pasta", {}).get(mode, {})
            q = ratio(mine.get("gib_per_s"), theirs.get("gib_per_s"))
            sizes = {r["bytes"] for r in mine.get("runs", []) + theirs.get("runs", [])}
            note = " (not all runs the same size: see throughput)" if len(sizes) > 1 else ""
            failed = sum(1 for f in thr.get("pasta", {}).get("failures", [])
                         if f.startswith(mode + " "))
            if failed:
                note += f" (pasta itself failed {failed} transfer(s) this way: see throughput)"
            row(f"{n}: throughput ≥ pasta's ({mode})",
                f"{q:.2f}× pasta's{note}" if q else "n/a", None if q is None else q >= 1.0)
            q = ratio(mine.get("gib_per_s"),
                      thr.get("slirp4netns", {}).get(mode, {}).get("gib_per_s"))
            if q:
                rows.append({"target": f"{n}: throughput / slirp4netns' ({mode}, for information)",
                             "value": f"{q:.2f}×", "verdict": "info"})
        many = mem.get(n, {}).get("many", {}).get("nano_init")
        mib = many["rss_kib"] / 1024 if many else None
        note = "" if flows >= TARGET_RSS_FLOWS else f" (only {flows} flows: not the target's)"
        row(f"{n}: nano-init VmRSS ≤ {TARGET_RSS_MIB:g} MiB with {TARGET_RSS_FLOWS} flows",
            (f"{mib:.1f} MiB with {flows}" + note) if mib else "n/a",
            None if mib is None or flows < TARGET_RSS_FLOWS else mib <= TARGET_RSS_MIB)
    return rows


def print_report(res):
    m, lat, thr, mem = res["meta"], res["latency"], res["throughput"], res["memory"]
    w = max(len(n) for n in res["paths"]) + 1
    out = [f"nano-init benchmark  {m['date']}  repo {m['git']}  {m['cpus']} CPUs "
           f"({m['cpu_model']})  Linux {m['kernel']}",
           f"nano-init: {m['nano_init_binary']}",
           f"sam-box:   {m['sam_box_binary']}",
           f"pasta {m['versions']['passt']}, slirp4netns {m['versions']['slirp4netns']}",
           f"load average at start {m['loadavg_start']}, at end {m['loadavg_end']}"
           + ("   <- other work on this machine: expect noise" if
              max(m["loadavg_start"][0], m["loadavg_end"][0]) > 0.5 * m["cpus"] else ""),
           f"upstream {UP_ADDR}:{m['upstream_port']} ({NAME}) in netns {m['netns']['up']}, "
           f"over a veth (MTU {m['veth_mtu']}) from {m['netns']['host']}",
           "", "Paths (the same client binary and sizes everywhere):"]
    for n, p in res["paths"].items():
        out.append(f"  {n:<{w}} MTU {fmt(p.get('mtu'), '>5')}  {p['description']}")
        if p.get("error"):
            out.append(f"  {'':<{w}} ! {p['error']}")
    out += ["", f"Connect latency, µs (connect → 1 byte → 1 byte echoed; {m['setups']} "
                f"sequential connects per path, name resolved once per block)",
            f"  {'path':<{w}} {'median':>8} {'p90':>8} {'p99':>8} {'mean':>8} {'×direct':>8}"
            f" {'p99×dir':>8} {'resolve':>8}  CPU µs/connect: {'stack':>6} {'nano-init':>9}"]
    d = lat.get("direct")
    for n, v in lat.items():
        out.append(f"  {n:<{w}} {v['median_us']:>8.1f} {v['p90_us']:>8.1f} {v['p99_us']:>8.1f}"
                   f" {v['mean_us']:>8.1f} {fmt(d and v['median_us'] / d['median_us'], '>8.2f')}"
                   f" {fmt(d and v['p99_us'] / d['p99_us'], '>8.2f')}"
                   f" {fmt(v['resolve_us_median'], '>8.0f')}"
                   f"  {'':15}{fmt(v['stack_cpu_us_per_connect'], '>6.0f')}"
                   f" {fmt(v['nano_init_cpu_us_per_connect'], '>9.0f')}")
    out += ["", f"Throughput, GiB/s ({size(m['bytes'])} per direction, one connection; median "
                f"of {m['trials']} run(s))",
            f"  {'path':<{w}} {'dir':<5} {'GiB/s':>6} {'×direct':>8} {'×pasta':>7} "
            f"{'min–max':>11}   CPU s per GiB: {'client':>6} {'stack':>6} {'nano-init':>9}"
            f" {'upstream':>8}"]
    dt, pt = thr.get("direct", {}), thr.get("pasta", {})
    for n, v in thr.items():
        for k, _, _ in MODES:
            x = v.get(k)
            if not x:
                continue
            rel = x["gib_per_s"] / dt[k]["gib_per_s"] if dt.get(k) else None
            relp = x["gib_per_s"] / pt[k]["gib_per_s"] if pt.get(k) else None
            out.append(f"  {n:<{w}} {k:<5} {x['gib_per_s']:>6.2f} {fmt(rel, '>8.0%')}"
                       f" {fmt(relp, '>7.2f')} {x['min']:>5.2f}–{x['max']:<5.2f}   {'':15}"
                       f"{fmt(x['client_cpu_s_per_gib'], '>6.2f')}"
                       f" {fmt(x['stack_cpu_s_per_gib'], '>6.2f')}"
                       f" {fmt(x['nano_init_cpu_s_per_gib'], '>9.2f')}"
                       f" {fmt(x['upstream_cpu_s_per_gib'], '>8.2f')}")
            if x and any(r["bytes"] < m["bytes"] for r in x["runs"]):
                sizes = ", ".join(size(r["bytes"]) for r in x["runs"])
                out.append(f"  {n:<{w}} {k:<5} ! runs at {sizes}: see the failed transfers")
        for f in v.get("failures", []):
            out.append(f"  {n:<{w}} ! failed transfer: {f}")
    if res.get("throughput_trials_skipped"):
        out.append(f"  ({res['throughput_trials_skipped']} trial(s) skipped: over the budget)")
    out += ["", f"Memory, VmRSS MiB [anonymous]: idle at start, 1 open flow, {m['flows']} open "
                f"flows, idle after; 'stack' = nano-init + sam-box, pasta, slirp4netns"]
    for n, v in mem.items():
        for who in ("nano_init", "stack"):
            cells = []
            for k in ("idle", "one", "many", "idle_after"):
                x = v.get(k, {}).get(who)
                cells.append(f"{x['rss_kib'] / 1024:6.1f} [{x['anon_kib'] / 1024:5.1f}]" if x
                             else f"{'-':>14}")
            if any(c.strip() != "-" for c in cells):
                label = "nano-init" if who == "nano_init" else "stack"
                out.append(f"  {n:<{w}} {label:<9} " + "  ".join(cells))
    for n, c in res.get("nano_init_counters", {}).items():
        if c:
            keys = ("tcp_accepted", "tcp_refused", "dns_queries", "tun_write_errors",
                    "malformed_packets", "cap_tcp_flows", "cap_pending_syns")
            out.append(f"  {n} counters at exit: " + ", ".join(f"{k} {c.get(k, 0)}"
                                                               for k in keys))
    out += ["", "Targets (issue 3)"]
    for t in res["targets"]:
        out.append(f"  {t['verdict']:<5} {t['target']:<58} {t['value']}")
    out += ["", f"elapsed {m['elapsed_s']:.0f}s; JSON: {res['json_path']}"]
    print("\n".join(out), flush=True)


# ---------------------------------------------------------------------------------------


def run(args, procs, nss, wd, logs):
    bench = Bench(args, procs, nss, wd, logs)
    host, up, vh = nss.wire()
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "git": git_describe(REPO, ("src/netstack", "src/nano-init", "src/vdns", "src/sam-box")), "cpus": os.cpu_count(), "cpu_model": cpu_model(),
            "kernel": platform.release(), "loadavg_start": loadavg(), "setups": args.setups,
            "bytes": args.bytes, "trials": args.trials, "flows": args.flows,
            "netns": {"host": host, "up": up}, "veth_mtu": link_mtu(host, vh),
            "nano_init_binary": args.nano_init_id, "sam_box_binary": args.sam_box_id,
            "nano_init_static": is_static(args.nano_init),
            "versions": {"passt": deb_version("passt"), "slirp4netns": deb_version("slirp4netns"),
                         "kernel": platform.release()},
            "nofile": list(resource.getrlimit(resource.RLIMIT_NOFILE))}
    bench.upstream(up)
    meta["upstream_port"] = bench.port
    log(f"upstream on {UP_ADDR}:{bench.port} in {up}")

    wanted = {"nano-init", "pasta", "slirp4netns"}
    if args.only:
        wanted &= {x.strip() for x in args.only.split(",")}
    starters = [("direct", lambda: bench.direct(host, vh))]
    nano_paths = []
    if "nano-init" in wanted:
        starters.append(("nano-init", lambda: bench.nano_init(host, "nano-init", None)))
        nano_paths.append("nano-init")
        if args.tun_mtu:
            label = f"nano-init-m{args.tun_mtu}"
            starters.append((label, lambda: bench.nano_init(host, label, args.tun_mtu)))
            nano_paths.append(label)
    if "pasta" in wanted:
        starters.append(("pasta", lambda: bench.pasta(host)))
    if "slirp4netns" in wanted:
        starters.append(("slirp4netns", lambda: bench.slirp4netns(host)))
    paths, mem = {}, {}
    for name, start in starters:
        try:
            paths[name] = start()
            time.sleep(0.3)
            if paths[name]["stack_pids"]():
                mem[name] = {"idle": {"stack": memory(paths[name]["stack_pids"]())}}
            if "nano_pid" in paths[name]:
                mem[name]["idle"]["nano_init"] = memory([paths[name]["nano_pid"]])
            # One connect proves the path before anything is timed.
            paths[name]["agent"].run(f"latency --target {NAME}:{bench.port} --count 1 "
                                     "--warmup 0", timeout=30)
            log(f"{name} ready")
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            paths[name] = {"error": f"start: {e}", "description": "-",
                           "stack_pids": lambda: []}
            log(f"{name}: {paths[name]['error']}")
    if paths["direct"].get("error"):
        raise RuntimeError(f"the direct baseline does not work: {paths['direct']['error']}")

    phases = {"start": bench.elapsed()}
    log(f"connect latency: {args.setups} per path")
    lat = measure_latency(bench, paths, args.setups)
    phases["latency"] = bench.elapsed()
    log(f"throughput: {size(args.bytes)} per direction, {args.trials} trial(s)")
    thr, skipped = measure_throughput(bench, paths, args.bytes, args.trials, args.budget)
    phases["throughput"] = bench.elapsed()
    log(f"memory: 1 and {args.flows} open flows")
    for name, p in paths.items():
        if name == "direct" or p.get("error"):
            continue
        try:
            mem[name]["one"] = hold(bench, p, 1)
            mem[name]["many"] = hold(bench, p, args.flows)
            time.sleep(0.5)
            mem[name]["idle_after"] = {"stack": memory(p["stack_pids"]())}
            if "nano_pid" in p:
                mem[name]["idle_after"]["nano_init"] = memory([p["nano_pid"]])
        except RuntimeError as e:
            p["error"] = f"memory: {e}"
            log(f"{name}: {p['error']}")
    phases["memory"] = bench.elapsed()

    # nano-init writes its counters when its agent exits: close each nano-init agent's stdin.
    counters = {}
    for name in nano_paths:
        p = paths.get(name, {})
        if p.get("agent"):
            p["agent"].proc.stdin.close()
            try:
                p["proc"].wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            counters[name] = nano_counters(p["log"])

    meta["phases_end_s"] = {k: round(v, 1) for k, v in phases.items()}
    meta["loadavg_end"] = loadavg()
    meta["elapsed_s"] = bench.elapsed()
    res = {"meta": meta,
           "paths": {n: {k: v for k, v in p.items()
                         if k in ("description", "mtu", "error", "address_seen")}
                     for n, p in paths.items()},
           "latency": lat, "throughput": thr, "throughput_trials_skipped": skipped,
           "memory": mem, "nano_init_counters": counters}
    res["targets"] = targets(lat, thr, mem, nano_paths, args.flows)
    out = pathlib.Path(args.out) if args.out else RESULTS / (
        "nano-init-" + meta["date"].replace(":", "").replace("-", "") + ".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    res["json_path"] = str(out)
    out.write_text(json.dumps(res, indent=2) + "\n")
    print_report(res)
    return 0


def main(argv):
    args = parse_args(argv)
    if os.geteuid() != 0:
        sys.exit("bench: needs root (it creates network namespaces); run it with sudo")
    missing = [t for t in ("ip", "unshare", "nsenter") if not shutil.which(t)]
    if missing:
        sys.exit(f"bench: not found: {', '.join(missing)}")
    only = {x.strip() for x in args.only.split(",")} if args.only else {
        "nano-init", "pasta", "slirp4netns"}
    for tool, package in (("pasta", "passt"), ("slirp4netns", "slirp4netns")):
        if tool in only and not shutil.which(tool):
            log(f"{tool} not found (Debian package {package}; scripts/install-deps --bench): "
                "skipped")
            args.only = ",".join(sorted(only - {tool}))
            only.discard(tool)
    for which in ("nano_init", "sam_box"):
        path = pathlib.Path(getattr(args, which)).resolve()
        if not os.access(path, os.X_OK):
            sys.exit(f"bench: no {which.replace('_', '-')} at {path}; build it with "
                     "`bash scripts/build`")
        setattr(args, which, path)
    args.load = find_load_tool(args.load)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGALRM):
        signal.signal(signum, raise_interrupt)
    signal.alarm(HARD_CAP_SECONDS)
    resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
    sweep_stale()
    wd = pathlib.Path(tempfile.mkdtemp(prefix=f"nano-init-bench-{os.getpid()}-"))
    os.chmod(wd, 0o755)
    logs = pathlib.Path(args.logs).resolve() if args.logs else wd / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    nss = Namespaces(wd)
    procs = Procs()
    rc = 1
    try:
        # Snapshots: a rebuild during the run must not change what is measured.
        for which in ("nano_init", "sam_box", "load"):
            src = getattr(args, which)
            if which != "load":
                setattr(args, which + "_id", binary_id(src))
            dst = wd / src.name
            shutil.copy2(src, dst)
            setattr(args, which, str(dst))
        rc = run(args, procs, nss, wd, logs)
    except KeyboardInterrupt as e:
        log(f"interrupted ({e}): cleaning up")
        rc = 130
    except RuntimeError as e:
        log(f"cannot measure: {e}")
        for f in sorted(logs.glob("*.log")):
            tail = f.read_text(errors="replace").splitlines()[-5:]
            if tail:
                log(f"--- {f.name}\n" + "\n".join(tail))
        rc = 1
    finally:
        signal.alarm(0)
        procs.stop_all()
        nss.remove()
        shutil.rmtree(wd, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
