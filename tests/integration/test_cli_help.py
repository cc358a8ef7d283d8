"""The four programs' command lines as an operator meets them (issue 7, "Operators' tools"):
`--version` prints "PROG X.Y.Z" with the version CMake's project() gives, every subcommand's
`--help` states the default of every option that takes a value, and the bash completion in
deploy/completion/bash offers exactly the subcommands and flags the program's help lists, with
value completions that the help names. The real binaries and a real bash are run; the help is
parsed, so a flag added to a program without its completion (or the reverse) fails here.
"""

import os
import re
import shutil
import subprocess
import tempfile

import pytest

from cli_programs import (COMPLETION_DIR, PROGRAMS, binary, command_paths, help_of,
                          project_version, run)

BASH = shutil.which("bash")


@pytest.fixture(scope="module", params=PROGRAMS)
def prog(request):
    if not binary(request.param).exists():
        pytest.fail(f"{request.param} not built at {binary(request.param)} "
                    "(cmake --build build, or set COMPASS_BUILD_DIR)")
    return request.param


def test_version_is_the_project_version(prog):
    r = run(prog, "--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{prog} {project_version()}\n"


def _options_without_default(h):
    missing = []
    for e in h.options:
        if not e.takes_value or "REQUIRED" in e.opts.split():
            continue
        if re.search(r"=\S", e.opts) or "(default:" in e.desc:
            continue
        missing.append(e.long)
    return missing


def test_a_misspelt_flag_or_command_is_named_in_the_refusal(prog):
    """A typo is what the operator must read about, even where a required option is also
    missing (CLI11 checks those first): one line that starts with the program's name and
    names the word it did not take, exit 2."""
    for args, word in ((("run", "--no-such-flag"), "--no-such-flag"), (("runn",), "runn"),
                       (("--no-such-flag",), "--no-such-flag")):
        r = run(prog, *args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        first = r.stderr.splitlines()[0] if r.stderr else ""
        assert first.startswith(f"{prog}: ") and word in first, (args, r.stderr)


def test_every_subcommand_help_states_every_default(prog):
    paths = command_paths(prog)
    assert len(paths) > 1, f"{prog} --help lists no subcommand"
    for path in paths:
        h = help_of(prog, path)
        assert any(e.long == "--help" for e in h.options), path
        assert _options_without_default(h) == [], \
            f"{prog} {' '.join(path)} --help: options without a stated default"


def test_help_parser_sees_a_missing_default():
    """The check above can fail: an option with neither =DEFAULT nor "(default: …)"."""
    from cli_programs import parse_help
    h = parse_help("Options:\n  -h,--help                   Print this help message and exit\n"
                   "  --thing TEXT                Some thing\n"
                   "  --other TEXT=5              Other\n")
    assert _options_without_default(h) == ["--thing"]


# ---------------------------------------------------------------------------------------
# bash completion


def complete(prog, words, cwd):
    """Runs the completion function of deploy/completion/bash/PROG for the command line
    `words` (the last word is the one being completed) and returns COMPREPLY as a list.
    PATH holds nothing, so completions that ask a program (podman images, agent ids) give
    nothing and the answer depends only on the script."""
    script = COMPLETION_DIR / prog
    assert script.exists(), f"no bash completion for {prog} at {script}"
    words_sh = " ".join("'" + w.replace("'", "'\\''") + "'" for w in words)
    code = f"""
source {script}
spec=$(complete -p {prog}) || exit 3
fn=${{spec#*-F }}; fn=${{fn%% *}}
COMP_WORDS=({words_sh}); COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ))
COMP_LINE="${{COMP_WORDS[*]}}"; COMP_POINT=${{#COMP_LINE}}
COMPREPLY=()
"$fn" {prog} "${{COMP_WORDS[COMP_CWORD]}}" "${{COMP_WORDS[COMP_CWORD-1]}}"
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    r = subprocess.run([BASH, "--norc", "--noprofile", "-c", code], capture_output=True,
                       text=True, cwd=cwd, env={"PATH": cwd, "HOME": cwd}, timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stderr == "", r.stderr
    return [w for w in r.stdout.split("\n") if w]


@pytest.fixture(scope="module")
def empty_dir():
    d = tempfile.mkdtemp(prefix="cli-compl-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_completion_offers_exactly_the_subcommands_and_flags_of_the_help(prog, empty_dir):
    for path in command_paths(prog):
        h = help_of(prog, path)
        where = f"{prog} {' '.join(path)}".strip()
        subs = sorted(complete(prog, [prog, *path, ""], empty_dir)) if h.subcommands else None
        if h.subcommands:
            assert subs == sorted(e.names[0] for e in h.subcommands), where
        flags = set(complete(prog, [prog, *path, "-"], empty_dir)) - {"--"}
        in_help = {n for e in h.options for n in e.names if n.startswith("--")}
        assert flags == in_help, (f"{where}: completion offers {sorted(flags - in_help)} "
                                  f"that --help does not list; --help lists "
                                  f"{sorted(in_help - flags)} that completion does not offer")


def test_value_completions_are_values_the_help_names(prog, empty_dir):
    checked = 0
    for path in command_paths(prog):
        for e in help_of(prog, path).options:
            if not e.takes_value:
                continue
            values = complete(prog, [prog, *path, e.long, ""], empty_dir)
            for v in values:
                checked += 1
                assert re.search(r"(?<![\w-])" + re.escape(v) + r"(?![\w-])",
                                 e.opts + " " + e.desc), \
                    f"{prog} {' '.join(path)} {e.long}: completion offers {v!r}, " \
                    f"which its help does not name: {e.opts} {e.desc}"
    if prog in ("sam-box", "compass-runner", "sam-node"):
        assert checked > 0, f"{prog}: no fixed-value completion at all"


@pytest.mark.parametrize("prog_,words,expect", [
    ("compass-runner", ["run", "--backend"], ["host", "microvm", "podman"]),
    ("compass-runner", ["run", "--egress"], ["boundary", "firewall"]),
    ("compass-runner", ["run", "--accel"], ["kvm", "tcg"]),
    ("sam-box", ["run", "--log-level"], ["debug", "error", "info", "warn"]),
    ("sam-node", ["run", "--log-level"], ["debug", "error", "info", "warn"]),
])
def test_fixed_sets_complete_to_their_values(prog_, words, expect, empty_dir):
    assert sorted(complete(prog_, [prog_, *words, ""], empty_dir)) == expect


def test_completion_after_the_agent_command_separator_is_the_agents(empty_dir):
    """After `--` (compass-runner), BOUNDARY (nano-init run) or CMD's first word (nano-init
    supervise) the words are the agent's: no runner flag is offered there."""
    os.symlink("/bin/true", os.path.join(empty_dir, "some-agent-cmd"))
    try:
        assert complete("compass-runner", ["compass-runner", "run", "--", "some-agent"],
                        empty_dir) == ["some-agent-cmd"]
        assert complete("nano-init", ["nano-init", "run", "/run/b.sock", "some-agent"],
                        empty_dir) == ["some-agent-cmd"]
        assert complete("nano-init", ["nano-init", "supervise", "--user", "1:1", "some-agent"],
                        empty_dir) == ["some-agent-cmd"]
        assert "--user" not in complete(
            "nano-init", ["nano-init", "supervise", "sh", "--"], empty_dir)
        assert "--backend" not in complete(
            "compass-runner", ["compass-runner", "run", "--", "curl", "--"], empty_dir)
    finally:
        os.unlink(os.path.join(empty_dir, "some-agent-cmd"))
