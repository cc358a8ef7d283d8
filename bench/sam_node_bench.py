#!/usr/bin/python3
"""sam-node benchmark: request latency and streaming throughput of /v1/chat/completions
through sandbox → sam-box → sam-node → model server, against the client calling the model
server directly, in one run (issue 6, "Benchmark"; target ≤ 1.3 × direct latency).

    sudo /usr/bin/python3 bench/sam_node_bench.py            # full run, about a minute
    sudo /usr/bin/python3 bench/sam_node_bench.py --quick    # smoke run, about 15 seconds

Four paths, one client (this file with --client, Python's http.client on one keep-alive
connection, as an SDK keeps one), one model server (tests/integration/model_server.py):

- direct:  the client → 127.0.0.1:<model server>
- nginx:   the client → nginx on a Unix socket → model server (upstream keep-alive, unbuffered,
           the upstream key set by nginx): what any reverse proxy in the node's place costs on
           this machine; skipped when nginx is not installed (scripts/install-deps --bench)
- node:    the client → sam-node's API socket (X-Sam-Agent set by the client) → model server;
           what the node alone costs
- sandbox: the client runs as nano-init's agent in fresh PID + network namespaces and calls
           http://mesh.sam.alt; nano-init → sam-box → sam-node → model server: what an agent
           pays

Paths are measured in interleaved rounds (direct, nginx, node, sandbox, direct, ...) so that
drift of the machine hits them alike; the report takes the median of the per-round medians.
Latency: a small non-streamed completion, timed from sending the request to the last byte of
the answer. Streaming: one `"stream": true` completion of N content chunks of B bytes
(model_server.py's x_bench), timed to the first byte and to [DONE]; throughput counts the SSE
body bytes. Only loopback and Unix sockets are used: the sandbox's only way out is sam-box,
and sam-node's upstream is 127.0.0.1.

A benchmark, not a test: it prints PASS/MISS per target and exits 0 either way (non-zero only
when it could not measure at all). Results also go to bench/results/ as JSON (git-ignored).
"""

import argparse
import datetime
import http.client
import json
import os
import pathlib
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from benchlib import die_with_parent

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench/results"
MODEL_SERVER = REPO / "tests/integration/model_server.py"
AGENT = "bench-agent.bench.example"
MODEL_KEY = "bench-upstream-key"
TARGET_LATENCY_RATIO = 1.3  # sandbox median latency ≤ 1.3 × direct (issue 6)
START_TIMEOUT = 20.0
def log(msg):
    print(f"[sam-node-bench] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------
# The client (--client): runs on the host or inside the sandbox; prints one JSON line.


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("mesh.sam.alt", timeout=60)
        self.unix_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


def _connection(base):
    """base: http://HOST[:PORT] or unix:PATH (the node's socket, the client sets X-Sam-Agent)."""
    if base.startswith("unix:"):
        return _UnixConnection(base[5:]), {"X-Sam-Agent": AGENT, "Host": "mesh.sam.alt"}
    host = base.split("://", 1)[1].rstrip("/")
    return http.client.HTTPConnection(host, timeout=60), {}


def client(base, requests, warmup, chunks, chunk_bytes, api_key):
    conn, extra = _connection(base)
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {api_key}", **extra}
    small = json.dumps({"model": "chat", "messages": [{"role": "user", "content": "hi"}]})

    def one(body):
        t0 = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"status {resp.status}: {data[:300]!r}")
        return time.perf_counter() - t0

    for _ in range(warmup):
        one(small)
    lat = sorted(one(small) for _ in range(requests))

    body = json.dumps({"model": "chat", "stream": True,
                       "messages": [{"role": "user", "content": "stream"}],
                       "x_bench": {"chunks": chunks, "bytes": chunk_bytes}})
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body=body, headers=headers)
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"stream status {resp.status}: {resp.read()[:300]!r}")
    first = resp.read1(65536)
    ttfb = time.perf_counter() - t0
    got, tail = len(first), first[-64:]
    while True:
        piece = resp.read1(1 << 20)
        if not piece:
            break
        got += len(piece)
        tail = (tail + piece)[-64:]
    total = time.perf_counter() - t0
    if b"[DONE]" not in tail:
        raise RuntimeError("stream ended without [DONE]")
    conn.close()
    print(json.dumps({"latency_s": lat, "stream": {"bytes": got, "ttfb_s": ttfb,
                                                   "total_s": total}}), flush=True)


# ---------------------------------------------------------------------------------------
# The orchestrator


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sam-node", default=os.environ.get(
        "SAM_NODE", str(REPO / "build/src/sam-node/sam-node")))
    p.add_argument("--sam-box", default=os.environ.get(
        "SAM_BOX", str(REPO / "build/src/sam-box/sam-box")))
    p.add_argument("--nano-init", default=os.environ.get(
        "NANO_INIT", str(REPO / "build/src/nano-init/nano-init")))
    p.add_argument("--rounds", type=int, help="interleaved rounds per path (default 5)")
    p.add_argument("--requests", type=int, help="timed requests per round (default 400)")
    p.add_argument("--chunks", type=int, help="streamed chunks per round (default 20000)")
    p.add_argument("--chunk-bytes", type=int, default=256, help="bytes per chunk (default 256)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 2 rounds, 100 requests, 4000 chunks (explicit flags win)")
    p.add_argument("--out", default="", help="JSON result path (default bench/results/…)")
    p.add_argument("--logs", default="",
                   help="directory for sam-node's, sam-box's and nginx's logs")
    p.add_argument("--client", default="", help=argparse.SUPPRESS)
    p.add_argument("--warmup", type=int, default=20, help=argparse.SUPPRESS)
    p.add_argument("--key", default="unused", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    defaults = {"rounds": 2, "requests": 100, "chunks": 4000} if a.quick \
        else {"rounds": 5, "requests": 400, "chunks": 20000}
    for k, v in defaults.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
        if getattr(a, k) < 1:
            p.error(f"--{k.replace('_', '-')} must be at least 1")
    return a


class Procs:
    def __init__(self):
        self.live = []

    def start(self, cmd, **kw):
        kw.setdefault("stdout", subprocess.DEVNULL)
        kw.setdefault("stderr", subprocess.DEVNULL)
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent,
                                **kw)
        self.live.append(proc)
        return proc

    def stop_all(self):
        for proc in reversed(self.live):
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(self.live):
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_unix(proc, path, what):
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} (rerun with --logs DIR)")
        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.connect(path)
                return
            except OSError:
                pass
        time.sleep(0.02)
    raise RuntimeError(f"{what} not accepting on {path} after {START_TIMEOUT}s")


def logfile(args, wd, name):
    d = pathlib.Path(args.logs) if args.logs else None
    if d is None:
        return subprocess.DEVNULL
    d.mkdir(parents=True, exist_ok=True)
    return open(d / f"{name}.log", "w")


def start_all(args, procs, wd):
    model = procs.start([sys.executable, str(MODEL_SERVER), "--api-key", MODEL_KEY],
                        stdout=subprocess.PIPE)
    line = model.stdout.readline().decode()
    if not line.startswith("ready "):
        raise RuntimeError(f"model server did not start: {line!r}")
    model_port = int(line.split()[1])
    cfg = wd / "node.yaml"
    cfg.write_text(f"""version: v1
services:
  - name: chat
    type: openai
    target_url: http://127.0.0.1:{model_port}/v1
    api_key: env://SAM_BENCH_MODEL_KEY
roles:
  - name: bench
    allowed_agents: [{AGENT}]
    services: [chat]
""")
    node_sock = str(wd / "node.sock")
    env = {**os.environ, "SAM_BENCH_MODEL_KEY": MODEL_KEY}
    node = procs.start([args.sam_node, "run", "--socket-path", node_sock, "--config", str(cfg),
                        "--data-dir", str(wd), "--log-level", "warn"],
                       stderr=logfile(args, wd, "sam-node"), env=env)
    wait_unix(node, node_sock, "sam-node")
    bundle = wd / "bundle.yaml"
    bundle.write_text(f"version: v1\nagent:\n  id: {AGENT}\n")
    box_sock = str(wd / "agent.sock")
    box = procs.start([args.sam_box, "run", "--socket", box_sock, "--bundle", str(bundle),
                       "--insecure-unverified-bundle", "--sidecar-socket", node_sock,
                       "--log-level", "warn"], stderr=logfile(args, wd, "sam-box"))
    wait_unix(box, box_sock, "sam-box")
    return model_port, node_sock, box_sock


def start_nginx(args, procs, wd, model_port):
    """nginx as a plain reverse proxy in the node's place: a Unix socket in, HTTP/1.1 with
    upstream keep-alive out to the same model server, responses unbuffered (sam-node streams
    them), the agent's key replaced by the upstream key (as the node does). One foreground
    process (no daemon, no master), so Procs stops it and die_with_parent covers it.
    Returns (socket path, facts for the JSON); RuntimeError if it is missing or fails."""
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.access(binary, os.X_OK):
        raise RuntimeError("nginx is not installed (scripts/install-deps --bench)")
    version = subprocess.run([binary, "-v"], capture_output=True, text=True, timeout=10,
                             stdin=subprocess.DEVNULL).stderr.strip()
    d = wd / "nginx"
    d.mkdir()
    sock = str(wd / "nginx.sock")
    errlog = pathlib.Path(args.logs) / "nginx-error.log" if args.logs else d / "error.log"
    errlog.parent.mkdir(parents=True, exist_ok=True)
    conf = d / "nginx.conf"
    conf.write_text(f"""\
# sam-node bench: nginx in the node's place (Unix socket in, the model server out).
daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {errlog} warn;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    upstream model {{
        server 127.0.0.1:{model_port};
        keepalive 16;
    }}
    server {{
        listen unix:{sock};
        location / {{
            proxy_pass http://model;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Authorization "Bearer {MODEL_KEY}";
            proxy_buffering off;
        }}
    }}
}}
""")
    cmd = [binary, "-p", str(d), "-c", str(conf), "-e", str(errlog)]
    proc = procs.start(cmd)
    wait_unix(proc, sock, "nginx")
    return sock, {"version": version, "command": cmd, "config": conf.read_text()}


def run_client(args, base, sandbox_boundary=None):
    # Only the direct client holds the upstream key; through the node (and nginx) the agent's
    # placeholder is dropped and the proxy attaches the key.
    key = MODEL_KEY if base.startswith("http://127.") else "unused"
    cmd = [sys.executable, str(pathlib.Path(__file__).resolve()), "--client", base, "--key", key,
           "--requests", str(args.requests), "--chunks", str(args.chunks),
           "--chunk-bytes", str(args.chunk_bytes), "--warmup", str(args.warmup)]
    if sandbox_boundary:
        cmd = ["unshare", "--net", "--pid", "--fork", "--mount-proc", "--kill-child",
               args.nano_init, "run", "--user", "0:0", sandbox_boundary, *cmd]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                       stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
    lines = [x for x in r.stdout.splitlines() if x.startswith("{")]
    if r.returncode != 0 or not lines:
        raise RuntimeError(f"client on {base} failed ({r.returncode}): {r.stderr[-2000:]}")
    return json.loads(lines[-1])


def summarize(rounds):
    lat_med = [statistics.median(r["latency_s"]) for r in rounds]
    p99 = [r["latency_s"][min(len(r["latency_s"]) - 1, int(0.99 * len(r["latency_s"])))]
           for r in rounds]
    mibs = [r["stream"]["bytes"] / r["stream"]["total_s"] / (1 << 20) for r in rounds]
    ttfb = [r["stream"]["ttfb_s"] for r in rounds]
    return {"latency_p50_ms": statistics.median(lat_med) * 1e3,
            "latency_p99_ms": statistics.median(p99) * 1e3,
            "stream_mib_per_s": statistics.median(mibs),
            "stream_ttfb_ms": statistics.median(ttfb) * 1e3,
            "stream_bytes": rounds[0]["stream"]["bytes"]}


def report(res):
    s = res["paths"]
    skipped = res.get("skipped", {})
    print(f"\nsam-node bench ({res['when']}, {res['host']}): {res['rounds']} rounds × "
          f"{res['requests']} requests; stream {res['chunks']} × {res['chunk_bytes']} B; "
          f"load average {res['loadavg']['before'][0]:.2f} before, "
          f"{res['loadavg']['after'][0]:.2f} after")
    print(f"{'path':<9}{'p50 ms':>9}{'p99 ms':>9}{'×direct':>9}{'MiB/s':>9}{'×direct':>9}"
          f"{'TTFB ms':>9}")
    d = s["direct"]
    for name in ("direct", "nginx", "node", "sandbox"):
        if name in skipped:
            print(f"{name:<9}skipped: {skipped[name]}")
            continue
        v = s[name]
        print(f"{name:<9}{v['latency_p50_ms']:>9.3f}{v['latency_p99_ms']:>9.3f}"
              f"{v['latency_p50_ms'] / d['latency_p50_ms']:>9.2f}"
              f"{v['stream_mib_per_s']:>9.1f}{v['stream_mib_per_s'] / d['stream_mib_per_s']:>9.2f}"
              f"{v['stream_ttfb_ms']:>9.3f}")
    c = res["comparisons"]
    if "node_vs_nginx" in c:
        print(f"node: {c['node_vs_direct']:.2f}× direct, {c['node_vs_nginx']:.2f}× nginx in the "
              f"same place (p50 over direct: nginx +{c['nginx_minus_direct_ms']:.3f} ms, "
              f"node +{c['node_minus_direct_ms']:.3f} ms)")
    else:
        print(f"node: {c['node_vs_direct']:.2f}× direct (no nginx reference: skipped)")
    for t in res["targets"]:
        print(f"{'PASS' if t['pass'] else 'MISS'}  {t['what']}: {t['value']:.2f} "
              f"(target {t['target']})")


def main(argv):
    args = parse_args(argv)
    if args.client:
        client(args.client, args.requests, args.warmup, args.chunks, args.chunk_bytes, args.key)
        return 0
    if os.geteuid() != 0:
        print("sam_node_bench: must run as root (the sandbox needs new namespaces)",
              file=sys.stderr)
        return 1
    for name, path in (("sam-node", args.sam_node), ("sam-box", args.sam_box),
                       ("nano-init", args.nano_init)):
        if not os.access(path, os.X_OK):
            print(f"sam_node_bench: {name} not found at {path} (build it, or pass --{name})",
                  file=sys.stderr)
            return 1
    procs = Procs()
    wd = pathlib.Path(tempfile.mkdtemp(prefix="samnodebench-", dir="/tmp"))
    os.chmod(wd, 0o755)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    skipped, nginx_facts, load_before = {}, None, os.getloadavg()
    try:
        model_port, node_sock, box_sock = start_all(args, procs, wd)
        paths = {"direct": (f"http://127.0.0.1:{model_port}", None)}
        try:  # a reference only: without it the bench goes on
            nginx_sock, nginx_facts = start_nginx(args, procs, wd, model_port)
            paths["nginx"] = (f"unix:{nginx_sock}", None)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            skipped["nginx"] = str(e)
            log(f"nginx skipped: {e}")
        paths["node"] = (f"unix:{node_sock}", None)
        paths["sandbox"] = ("http://mesh.sam.alt", box_sock)
        rounds = {name: [] for name in paths}
        for i in range(args.rounds):
            for name, (base, boundary) in list(paths.items()):
                log(f"round {i + 1}/{args.rounds}: {name}")
                try:
                    rounds[name].append(run_client(args, base, boundary))
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    if name != "nginx":
                        raise
                    skipped["nginx"] = f"client failed: {e}"
                    log(f"nginx skipped: {skipped['nginx']}")
                    del paths["nginx"], rounds["nginx"]
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        print(f"sam_node_bench: could not measure: {e}", file=sys.stderr)
        return 1
    finally:
        procs.stop_all()
        shutil.rmtree(wd, ignore_errors=True)
    summary = {name: summarize(r) for name, r in rounds.items()}
    ratio = summary["sandbox"]["latency_p50_ms"] / summary["direct"]["latency_p50_ms"]
    p50 = {name: v["latency_p50_ms"] for name, v in summary.items()}
    comparisons = {"node_vs_direct": p50["node"] / p50["direct"],
                   "sandbox_vs_direct": ratio,
                   "node_minus_direct_ms": p50["node"] - p50["direct"]}
    if "nginx" in p50:
        comparisons.update({"nginx_vs_direct": p50["nginx"] / p50["direct"],
                            "node_vs_nginx": p50["node"] / p50["nginx"],
                            "sandbox_vs_nginx": p50["sandbox"] / p50["nginx"],
                            "nginx_minus_direct_ms": p50["nginx"] - p50["direct"],
                            "node_minus_nginx_ms": p50["node"] - p50["nginx"]})
    res = {"bench": "sam-node", "when": datetime.datetime.now(datetime.timezone.utc)
           .strftime("%Y-%m-%dT%H:%M:%SZ"), "host": platform.node(), "rounds": args.rounds,
           "requests": args.requests, "chunks": args.chunks, "chunk_bytes": args.chunk_bytes,
           "cpus": os.cpu_count(), "loadavg": {"before": load_before, "after": os.getloadavg()},
           "paths": summary,
           "skipped": skipped, "nginx": nginx_facts, "comparisons": comparisons, "raw": rounds,
           "targets": [{"what": "sandbox p50 latency / direct", "value": ratio,
                        "target": f"≤ {TARGET_LATENCY_RATIO}",
                        "pass": ratio <= TARGET_LATENCY_RATIO}]}
    report(res)
    out = pathlib.Path(args.out) if args.out else RESULTS / (
        "sam-node-" + res["when"].replace("-", "").replace(":", "") + ".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
