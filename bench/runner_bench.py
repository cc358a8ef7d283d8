#!/usr/bin/python3
"""compass-runner benchmark: how long from "start the agent" to "the agent's command runs",
per tier, against the baseline each tier is built on (issue 4, "Benchmark").

    sudo /usr/bin/python3 bench/runner_bench.py            # full run (20 starts per case)
    sudo /usr/bin/python3 bench/runner_bench.py --quick    # smoke run (5 starts per case)
    sudo /usr/bin/python3 bench/runner_bench.py --rounds 60  # tighter medians on a noisy box

The agent command is `date +%s%N`: it prints the wall-clock time at which it ran. Latency is
that time minus the time taken just before the launcher was started (same host clock, so
containers can be compared too). Cases, measured in one run and interleaved round by round
so that drift on the machine hits every case alike:

- bare:            `setpriv --reuid 65534 … date`       (fork/exec, the host tier's baseline)
- host:            `setpriv --reuid 65534 … compass-runner run --backend host -- date`
- podman-plain:    `podman run --rm --network none IMAGE date` (the podman tiers' baseline: a
                   container with no network at all, so the ratio counts every millisecond
                   the tiers' egress set-up and user namespace add)
- podman-isolated: `podman run --rm --network none` with the tiers' own isolation flags (the
                   agent's user namespace --uidmap/--gidmap, --user 1000:1000, --cap-drop all,
                   no-new-privileges, --pids-limit): what podman itself costs for the isolation
                   the issue requires, so the ratio against it is what the runner adds; shown
                   for context
- podman-default:  `podman run --rm IMAGE date`         (podman's defaults: its bridge network
                   with NAT, the container a networked one as the tiers' are; shown for context)
- podman-boundary: `compass-runner run --backend podman --egress-allow x -- date`
- podman-firewall: `compass-runner run --backend podman --egress firewall --egress-allow x -- date`

Targets: host ≤ bare + 5 ms (median); each podman tier ≤ 1.1 × podman-plain (median). The
ratios against podman-isolated and podman-default are printed beside it, not judged. It
prints PASS/MISS and exits 0 either way; non-zero only if a case could not run at all. The
results also go to bench/results/runner-<time>.json. Needs root (podman is rootful here),
the local image (`compass-runner image build`) and a build in build/ (or --build DIR). No
traffic leaves the machine: the agents only print the time.
"""

import argparse
import datetime
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
IMAGE = "localhost/compass-agent:latest"
TARGET_HOST_EXTRA_MS = 5.0
TARGET_PODMAN_RATIO = 1.1
NOBODY = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
# The podman CLI reads this; compass-runner writes its own and points podman at it, so the
# plain baseline uses the same file (same runtime, same ulimits) to compare like with like.
CONTAINERS_CONF = "/run/compass-runner/containers.conf"


def run_case(argv, env):
    """Starts argv, returns (latency_ms to the agent's exec, total_ms to exit). Raises if the
    command fails or prints no timestamp."""
    t0 = time.time_ns()
    p = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                       text=True, timeout=120, check=False)
    t_end = time.time_ns()
    stamps = [line for line in p.stdout.split() if line.isdigit() and len(line) >= 18]
    if p.returncode != 0 or not stamps:
        raise RuntimeError(f"{argv[:6]}… exit {p.returncode}: {p.stderr.strip()[-400:]}")
    return (int(stamps[-1]) - t0) / 1e6, (t_end - t0) / 1e6


def summarize(samples):
    lat = sorted(s[0] for s in samples)
    tot = sorted(s[1] for s in samples)
    return {
        "n": len(lat),
        "exec_median_ms": round(statistics.median(lat), 2),
        "exec_p90_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.9))], 2),
        "exit_median_ms": round(statistics.median(tot), 2),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="5 starts per case instead of 20")
    ap.add_argument("--rounds", type=int, default=0,
                    help="starts per case (default 20, or 5 with --quick); more rounds narrow "
                         "the medians' spread on a noisy machine")
    ap.add_argument("--build", default=str(REPO / "build"), help="build dir (default build/)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("runner_bench: needs root (podman is rootful on this host)")
    runner = pathlib.Path(args.build) / "src" / "compass-runner" / "compass-runner"
    if not runner.exists():
        sys.exit(f"runner_bench: no {runner}: run scripts/build first")
    if args.rounds < 0:
        sys.exit("runner_bench: --rounds must be a positive number")
    rounds = args.rounds if args.rounds > 0 else (5 if args.quick else 20)

    subprocess.run([str(runner), "image", "build"], check=True, stdin=subprocess.DEVNULL)
    host_tmp = tempfile.mkdtemp(prefix="runner-bench-")
    os.chown(host_tmp, 65534, 65534)
    os.chmod(host_tmp, 0o700)
    env_host = dict(os.environ, TMPDIR=host_tmp)
    env_host.pop("COMPASS_RUNTIME_BACKEND", None)
    env_podman = dict(os.environ)
    env_podman.pop("COMPASS_RUNTIME_BACKEND", None)
    env_plain = dict(env_podman)
    if pathlib.Path(CONTAINERS_CONF).exists():
        env_plain["CONTAINERS_CONF"] = CONTAINERS_CONF
    date = ["date", "+%s%N"]
    cases = {
        "bare": (NOBODY + date, env_host),
        "host": (NOBODY + [str(runner), "run", "--backend", "host", "--"] + date, env_host),
        "podman-plain": (["podman", "run", "--rm", "--network", "none", IMAGE] + date,
                         env_plain),
        "podman-isolated": (["podman", "run", "--rm", "--network", "none", "--uidmap",
                             "0:1879048192:65536", "--gidmap", "0:1879048192:65536", "--user",
                             "1000:1000", "--cap-drop", "all", "--security-opt",
                             "no-new-privileges", "--pids-limit", "2048", IMAGE] + date,
                            env_plain),
        "podman-default": (["podman", "run", "--rm", IMAGE] + date, env_plain),
        "podman-boundary": ([str(runner), "run", "--backend", "podman", "--egress-allow",
                             "bench.invalid", "--"] + date, env_podman),
        "podman-firewall": ([str(runner), "run", "--backend", "podman", "--egress",
                             "firewall", "--egress-allow", "bench.invalid", "--"] + date,
                            env_podman),
    }
    # One warm-up start each (image layers, page cache), not counted.
    for name, (argv, env) in cases.items():
        run_case(argv, env)
    samples = {name: [] for name in cases}
    for _ in range(rounds):
        for name, (argv, env) in cases.items():
            samples[name].append(run_case(argv, env))

    res = {name: summarize(s) for name, s in samples.items()}
    med = {name: r["exec_median_ms"] for name, r in res.items()}
    verdicts = {
        "host_extra_ms": round(med["host"] - med["bare"], 2),
        "podman_boundary_ratio": round(med["podman-boundary"] / med["podman-plain"], 3),
        "podman_firewall_ratio": round(med["podman-firewall"] / med["podman-plain"], 3),
        "podman_boundary_ratio_to_isolated": round(
            med["podman-boundary"] / med["podman-isolated"], 3),
        "podman_firewall_ratio_to_isolated": round(
            med["podman-firewall"] / med["podman-isolated"], 3),
        "podman_boundary_ratio_to_default": round(
            med["podman-boundary"] / med["podman-default"], 3),
        "podman_firewall_ratio_to_default": round(
            med["podman-firewall"] / med["podman-default"], 3),
    }
    print(f"{'case':18} {'exec p50 ms':>12} {'exec p90 ms':>12} {'to exit p50 ms':>15}")
    for name, r in res.items():
        print(f"{name:18} {r['exec_median_ms']:12.2f} {r['exec_p90_ms']:12.2f} "
              f"{r['exit_median_ms']:15.2f}")

    def verdict(ok):
        return "PASS" if ok else "MISS"

    print(f"host tier: +{verdicts['host_extra_ms']} ms over bare fork/exec (target ≤ "
          f"+{TARGET_HOST_EXTRA_MS} ms): {verdict(verdicts['host_extra_ms'] <= TARGET_HOST_EXTRA_MS)}")
    for mode in ("boundary", "firewall"):
        ratio = verdicts[f"podman_{mode}_ratio"]
        print(f"podman tier, egress {mode}: {ratio}× plain podman run --network none (target ≤ "
              f"{TARGET_PODMAN_RATIO}×): {verdict(ratio <= TARGET_PODMAN_RATIO)}; "
              f"{verdicts[f'podman_{mode}_ratio_to_isolated']}× podman run with the same "
              f"isolation flags; {verdicts[f'podman_{mode}_ratio_to_default']}× podman run "
              f"with its default network")

    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = RESULTS / f"runner-{stamp}.json"
    out.write_text(json.dumps({"rounds": rounds, "loadavg": os.getloadavg(), "cases": res,
                               "verdicts": verdicts}, indent=2) + "\n")
    print(f"results: {out}")
    subprocess.run(["rm", "-rf", host_tmp], check=False)


if __name__ == "__main__":
    main()
