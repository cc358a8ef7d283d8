"""Helpers shared by the benchmarks in bench/ (process care, statistics, the report header).

Imported by the bench scripts, which Python runs with bench/ first on sys.path.
"""

import ctypes
import os
import platform
import signal
import subprocess
import sys

GIB = 1 << 30
MIB = 1 << 20
PR_SET_PDEATHSIG = 1

_libc = ctypes.CDLL(None, use_errno=True)


def die_with_parent():
    """preexec_fn: the child is SIGKILLed when the process that started it dies."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def raise_interrupt(signum, frame):
    """Signal handler: turns SIGTERM/SIGHUP into KeyboardInterrupt so cleanup runs."""
    raise KeyboardInterrupt(f"signal {signum}")


def log(msg):
    """One progress line on stderr."""
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def size(n):
    """`n` bytes as "x GiB" or "x MiB"."""
    return f"{n / GIB:g} GiB" if n >= GIB else f"{n / MIB:g} MiB"


def descendants(pid):
    """`pid` and every process below it (from /proc/PID/task/*/children), depth first."""
    out = [pid]
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                for child in f.read().split():
                    out += descendants(int(child))
    except OSError:
        pass
    return out


def loadavg():
    """The 1-, 5- and 15-minute load averages, as /proc/loadavg gives them."""
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def percentile(sorted_values, q):
    """Nearest-rank percentile (q in 0..100) of an already sorted list; None if empty."""
    if not sorted_values:
        return None
    k = max(0, min(len(sorted_values) - 1, int(-(-q * len(sorted_values) // 100)) - 1))
    return sorted_values[k]


def median(values):
    """The median of `values`; None if empty."""
    v = sorted(values)
    n = len(v)
    if n == 0:
        return None
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def fmt(v, spec):
    """format(v, spec), or a "-" padded to the same width when there is no value."""
    if v is not None:
        return format(v, spec)
    width = "".join(c for c in spec.split(".")[0] if c.isdigit())
    return format("-", ">" + width) if width else "-"


def git_describe(repo, paths=("src",)):
    """The checkout's short revision, with "+dirty-src" if `paths` have uncommitted changes."""
    try:
        rev = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short=12", "HEAD"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--", *paths],
                               capture_output=True, text=True, timeout=10).stdout
        return rev + ("+dirty-src" if dirty.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def cpu_model():
    """The CPU's model name from /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
