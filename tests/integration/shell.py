"""Running a command from a test helper: one place for the rule every helper follows."""

import subprocess


def sh(*cmd, check=True):
    """Runs cmd (argv words, no shell) and returns the CompletedProcess with text stdout and
    stderr captured. With check, a non-zero exit raises RuntimeError naming the command, its
    status and its stderr, so a failed set-up step says which step it was."""
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")
    return r
