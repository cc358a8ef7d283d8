"""Running a command from a test helper: one place for the rule every helper follows."""

import signal
import subprocess


def sh(*cmd, check=True):
    """Runs cmd (argv words, no shell) and returns the CompletedProcess with text stdout and
    stderr captured. With check, a non-zero exit raises RuntimeError naming the command, its
    status and its stderr, so a failed set-up step says which step it was."""
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def sigterm_once_started(argv, env, await_started, timeout=120):
    """Starts argv (stdin closed, stdout and stderr captured as text), waits with
    await_started() for the point the caller names (for a runner: its container exists),
    sends SIGTERM and returns (the finished Popen, for its pid and returncode; stdout;
    stderr). The process is killed and reaped whatever happens, so a failed wait leaves
    nothing running."""
    p = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        await_started()
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=timeout)
    finally:
        p.kill()
        p.wait()
    return p, out, err
