"""Real clients inside a nano-init sandbox (issue 3 "Tests (real clients, real boundary)").

nano-init runs as PID 1 of fresh PID + network namespaces (nano_fixtures.run_nano) and carries
every flow to a real sam-box in the BOX namespace, which dials the test hosts in UP
(conftest.py: 198.18.0.2 / 2001:db8::2). The command nano-init runs is an ordinary client a
user would run: curl, python's urllib, node's fetch, git. An allowed name must work and give
the exact content; a denied name must fail the way a refused connection fails, quickly.
Nothing is sent anywhere but loopback and the test namespaces.
"""

import hashlib
import pathlib
import re
import shlex
import shutil
import subprocess

import pytest

from nano_fixtures import (dummy_boundary, nano, nano_has_netstack,  # noqa: F401
                           nano_tmp, run_nano)

PY = "/usr/bin/python3"
ALLOWED = "api.example.com"
DENIED = "denied.example.org"  # not in STD_ALLOW: the virtual DNS answers it, sam-box refuses
SMALL = "hello from upstream\n"
REFUSAL_MS = 1000


@pytest.fixture
def box(nano, std_box):
    assert std_box.alive, f"sam-box died:\n{std_box.stderr_text()[-3000:]}"
    return std_box


def sandbox(box, script, timeout=60):
    """Runs `sh -c script` as the agent of nano-init, wired to `box`."""
    return run_nano(box.socket_path, ["sh", "-c", script], timeout=timeout)


def timed(cmd):
    """Shell text that runs cmd, then prints `@@rc=N ms=M` on stdout."""
    return (f"s=$(date +%s%N); {cmd}; rc=$?; e=$(date +%s%N); "
            "echo \"@@rc=$rc ms=$(( (e - s) / 1000000 ))\"")


def outcome(r):
    m = re.search(r"@@rc=(\d+) ms=(\d+)", r.stdout)
    assert m, f"no outcome line\nstdout: {r.stdout}\nstderr: {r.stderr}"
    return int(m.group(1)), int(m.group(2))


def require_tool(name):
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"`{name}` is not installed: the real-client tests need it "
                    "(scripts/install-deps installs it)")
    return path


# ---------------------------------------------------------------------------------------
# curl over HTTPS with the test CA


def test_curl_https_allowed_name(box, topo):
    r = sandbox(box, f"curl -sS --max-time 10 --cacert {topo.ca} https://{ALLOWED}/small.txt")
    assert r.returncode == 0, r.stderr
    assert r.stdout == SMALL


def test_curl_https_big_file_is_byte_exact(box, topo):
    r = sandbox(box, f"curl -sS --max-time 30 --cacert {topo.ca} https://{ALLOWED}/big.bin "
                     "| sha256sum")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == topo.big_sha256


def test_curl_https_upload_is_byte_exact(box, topo, nano_tmp):
    blob = nano_tmp / "upload.bin"
    data = bytes(range(256)) * (8 << 10) + b"tail"  # 2 MiB and a bit
    blob.write_bytes(data)
    r = sandbox(box, f"curl -sS --max-time 30 --cacert {topo.ca} --data-binary @{blob} "
                     f"-H 'Content-Type: application/octet-stream' https://{ALLOWED}/sha256")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == hashlib.sha256(data).hexdigest()


def test_curl_https_ipv6_only_host(box, topo):
    """v6only.example.com has only 2001:db8::2 beyond sam-box: the agent still sees one name."""
    r = sandbox(box, f"curl -sS --max-time 10 --cacert {topo.ca} "
                     "https://v6only.example.com/peer")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "2001:db8::1\n"  # the server sees sam-box's side of the veth


def test_curl_https_denied_name_is_refused_quickly(box, topo):
    r = sandbox(box, timed(f"curl -sSv --max-time 5 --cacert {topo.ca} https://{DENIED}/ 2>&1"))
    rc, ms = outcome(r)
    assert rc == 7, r.stdout
    assert "Connection refused" in r.stdout, r.stdout
    assert "timed out" not in r.stdout
    assert ms < REFUSAL_MS, f"refusal took {ms} ms"


# ---------------------------------------------------------------------------------------
# python urllib.request

URLLIB = r"""
import ssl, sys, time, urllib.request, urllib.error
url, ca = sys.argv[1], sys.argv[2]
ctx = ssl.create_default_context(cafile=ca)
t = time.monotonic()
try:
    with urllib.request.urlopen(url, timeout=10, context=ctx) as resp:
        body = resp.read()
    print("status", resp.status, "len", len(body))
    sys.stdout.flush()
    sys.stdout.buffer.write(body)
except urllib.error.URLError as e:
    r = e.reason
    print("error", type(r).__name__, getattr(r, "errno", None),
          "ms", int((time.monotonic() - t) * 1000))
    sys.exit(3)
"""


def urllib_cmd(url, ca):
    return f"{PY} -c {shlex.quote(URLLIB)} {shlex.quote(url)} {ca}"


def test_python_urllib_https_allowed_name(box, topo):
    r = sandbox(box, urllib_cmd(f"https://{ALLOWED}/small.txt", topo.ca))
    assert r.returncode == 0, r.stdout + r.stderr
    head, body = r.stdout.split("\n", 1)
    assert head == f"status 200 len {len(SMALL)}"
    assert body == SMALL


def test_python_urllib_http_allowed_name(box, topo):
    r = sandbox(box, urllib_cmd(f"http://{ALLOWED}:8080/port", topo.ca))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split("\n", 1)[1] == "8080\n"


def test_python_urllib_denied_name_is_refused_quickly(box, topo):
    r = sandbox(box, urllib_cmd(f"https://{DENIED}/", topo.ca))
    assert r.returncode == 3, r.stdout + r.stderr
    m = re.match(r"error (\w+) (\S+) ms (\d+)", r.stdout)
    assert m, r.stdout
    assert m.group(1) == "ConnectionRefusedError" and m.group(2) == "111", r.stdout
    assert int(m.group(3)) < REFUSAL_MS, r.stdout


# ---------------------------------------------------------------------------------------
# node fetch

FETCH = r"""
const [url] = process.argv.slice(-1);
const t = Date.now();
fetch(url).then(async (resp) => {
  const body = await resp.text();
  process.stdout.write(`status ${resp.status}\n${body}`);
}, (e) => {
  const c = e.cause || {};
  const codes = [c.code, ...((c.errors || []).map((x) => x.code))].filter(Boolean);
  process.stdout.write(`error ${e.name} ${[...new Set(codes)].join(",")} ms ${Date.now() - t}\n`);
  process.exitCode = 3;
});
"""


def fetch_cmd(node, url, ca):
    return f"NODE_EXTRA_CA_CERTS={ca} {node} -e {shlex.quote(FETCH)} {shlex.quote(url)}"


@pytest.fixture(scope="module")
def node():
    return require_tool("node")


def test_node_fetch_https_allowed_name(box, topo, node):
    r = sandbox(box, fetch_cmd(node, f"https://{ALLOWED}/small.txt", topo.ca))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout == f"status 200\n{SMALL}"


def test_node_fetch_denied_name_is_refused_quickly(box, topo, node):
    r = sandbox(box, fetch_cmd(node, f"https://{DENIED}/", topo.ca))
    assert r.returncode == 3, r.stdout + r.stderr
    m = re.match(r"error (\w+) (\S+) ms (\d+)", r.stdout)
    assert m, r.stdout
    assert m.group(1) == "TypeError" and m.group(2) == "ECONNREFUSED", r.stdout
    assert int(m.group(3)) < REFUSAL_MS, r.stdout


# ---------------------------------------------------------------------------------------
# git clone over (dumb) HTTP from the test host


@pytest.fixture(scope="module")
def git_repo(topo):
    """A bare repository under UP's web root, served by its static HTTP server as git's dumb
    HTTP protocol (`git update-server-info`)."""
    git = require_tool("git")
    www = pathlib.Path(topo.tmp) / "www"
    work = pathlib.Path(topo.tmp) / "git-work"
    bare = www / "repo.git"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(topo.tmp), "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com",
           "GIT_AUTHOR_DATE": "2020-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2020-01-01T00:00:00Z"}

    def g(*args, cwd=None):
        return subprocess.run([git, *args], cwd=cwd, env=env, check=True, capture_output=True,
                              text=True).stdout.strip()

    work.mkdir()
    g("init", "-q", "-b", "main", str(work))
    (work / "README").write_text("cloned through nano-init\n")
    (work / "data.bin").write_bytes(bytes(range(256)) * 64)
    g("add", ".", cwd=work)
    g("commit", "-q", "-m", "first", cwd=work)
    (work / "second.txt").write_text("second commit\n")
    g("add", ".", cwd=work)
    g("commit", "-q", "-m", "second", cwd=work)
    head = g("rev-parse", "HEAD", cwd=work)
    g("clone", "-q", "--bare", str(work), str(bare))
    g("update-server-info", cwd=bare)
    return git, head


def git_clone_cmd(git, url, dest, trace=False):
    # GIT_TRACE_CURL: git sums a refusal up as "Couldn't connect to server"; libcurl's trace
    # shows the error of each connect() underneath.
    return (f"HOME={dest.parent} GIT_CONFIG_NOSYSTEM=1 GIT_TERMINAL_PROMPT=0 "
            f"{'GIT_TRACE_CURL=1 ' if trace else ''}"
            f"{git} clone -q {url} {dest} 2>&1")


def test_git_clone_over_http_allowed_name(box, git_repo, nano_tmp):
    git, head = git_repo
    dest = nano_tmp / "clone-ok"
    r = sandbox(box, git_clone_cmd(git, f"http://{ALLOWED}/repo.git", dest)
                + f" && {git} -C {dest} rev-parse HEAD && {git} -C {dest} fsck --strict"
                " && echo fsck-ok")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split() == [head, "fsck-ok"], r.stdout
    assert (dest / "README").read_text() == "cloned through nano-init\n"
    assert (dest / "data.bin").read_bytes() == bytes(range(256)) * 64
    assert (dest / "second.txt").read_text() == "second commit\n"


def test_git_clone_denied_name_is_refused_quickly(box, git_repo, nano_tmp):
    git, _ = git_repo
    dest = nano_tmp / "clone-denied"
    r = sandbox(box, timed(git_clone_cmd(git, f"http://{DENIED}/repo.git", dest, trace=True)))
    rc, ms = outcome(r)
    assert rc == 128, r.stdout
    assert "fatal: unable to access" in r.stdout, r.stdout
    assert "Connection refused" in r.stdout, r.stdout
    assert "timed out" not in r.stdout
    assert ms < REFUSAL_MS, f"refusal took {ms} ms"
    assert not dest.exists()
