"""The four programs' command lines as a user sees them: where the binaries are, the version
CMake gives them, and their CLI11 `--help` parsed into subcommands and options. Shared by
test_cli_help.py (help, version, shell completion) and test_packages.py (.deb packages).

Binaries: each program's own variable (SAM_BOX, NANO_INIT, COMPASS_RUNNER, SAM_NODE, as the
other tests use them), else COMPASS_BUILD_DIR/src/<p>/<p>, else build/src/<p>/<p>.
"""

import dataclasses
import os
import pathlib
import re
import subprocess

REPO = pathlib.Path(__file__).resolve().parents[2]
PROGRAMS = ("sam-box", "nano-init", "compass-runner", "sam-node")
ENV = {"sam-box": "SAM_BOX", "nano-init": "NANO_INIT", "compass-runner": "COMPASS_RUNNER",
       "sam-node": "SAM_NODE"}
COMPLETION_DIR = REPO / "deploy/completion/bash"
# CLI11 puts an option's description at this column (Formatter's default column width).
_DESC_COLUMN = 30


def build_dir():
    """The build tree the binaries come from (absolute)."""
    d = pathlib.Path(os.environ.get("COMPASS_BUILD_DIR", REPO / "build"))
    return d if d.is_absolute() else REPO / d


def binary(prog):
    """Path of `prog` (one of PROGRAMS)."""
    env = os.environ.get(ENV[prog])
    p = pathlib.Path(env) if env else build_dir() / "src" / prog / prog
    return p if p.is_absolute() else REPO / p


def project_version():
    """X.Y.Z from the top-level CMakeLists.txt's project(... VERSION X.Y.Z ...)."""
    text = (REPO / "CMakeLists.txt").read_text()
    m = re.search(r"^project\([^)]*\bVERSION\s+(\d+\.\d+\.\d+)", text, re.M)
    assert m, "no project(... VERSION X.Y.Z) in CMakeLists.txt"
    return m.group(1)


def run(prog, *args, timeout=30):
    return subprocess.run([str(binary(prog)), *args], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=timeout)


@dataclasses.dataclass
class Entry:
    """One line of a help section: `names` (e.g. ["-h", "--help"]), `opts` (what follows the
    names before the description: type, =default, REQUIRED, ...), `desc`."""
    names: list
    opts: str
    desc: str

    @property
    def takes_value(self):
        return self.opts != ""

    @property
    def long(self):
        return next((n for n in self.names if n.startswith("--")), self.names[0])


@dataclasses.dataclass
class Help:
    text: str
    options: list      # [Entry], the "Options:" section
    positionals: list  # [Entry]
    subcommands: list  # [Entry], names only


def parse_help(text):
    """Parses CLI11 2.x `--help` output into its sections."""
    sections = {}
    current = None
    for line in text.splitlines():
        if re.fullmatch(r"[A-Z][A-Za-z]*:", line):
            current = sections.setdefault(line[:-1], [])
        elif current is not None and line.startswith("  "):
            current.append(line)
        elif not line.strip():
            current = None
        else:
            current = None
    parsed = {}
    for name, lines in sections.items():
        entries = []
        i = 0
        while i < len(lines):
            line = lines[i]
            assert line[2] != " ", f"continuation line without an entry: {line!r}"
            continuation = (i + 1 < len(lines)
                            and lines[i + 1].startswith(" " * _DESC_COLUMN))
            if continuation:
                head, desc = line.strip(), lines[i + 1].strip()
                i += 2
            else:
                head, desc = line[:_DESC_COLUMN].strip(), line[_DESC_COLUMN:].strip()
                i += 1
            words = head.split(None, 1)
            entries.append(Entry(words[0].split(","), words[1] if len(words) > 1 else "", desc))
        parsed[name] = entries
    return Help(text, parsed.get("Options", []), parsed.get("Positionals", []),
                parsed.get("Subcommands", []))


def help_of(prog, path=()):
    r = run(prog, *path, "--help")
    assert r.returncode == 0, f"{prog} {' '.join(path)} --help exited {r.returncode}: {r.stderr}"
    return parse_help(r.stdout)


def command_paths(prog):
    """Every subcommand path of `prog`, found from its help: [(), ("run",), ("image", "build")…]
    (the root first)."""
    paths, todo = [], [()]
    while todo:
        path = todo.pop(0)
        paths.append(path)
        todo += [path + (e.names[0],) for e in help_of(prog, path).subcommands]
    return paths
