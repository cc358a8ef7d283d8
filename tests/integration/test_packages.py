""".deb packages of the four programs (issue 7, "Operators' tools"; cmake/Packaging.cmake,
docs/packages.md), made with the real `cpack -G DEB` from the build tree and installed in a
throwaway container of the local image `localhost/compass-agent:latest` (never on this host),
with no network:

- `dpkg -i` of the four packages on the bare image: sam-box, nano-init and compass-runner
  install and answer `--version`; sam-node is refused by dpkg, naming the libraries the image
  lacks (libsecret, libyaml-cpp): its Depends are real.
- `apt-get install /debs/*.deb` (an operator's `apt install ./*.deb`) with this host's apt
  lists and package cache overlaid read-only, so the libraries the Depends name come from
  the cache instead of the network: all four install, every binary answers `--version`,
  the `compass` user, units, conffiles and completions are in place; `apt-get purge`
  removes them again. The example configurations they ship are accepted by the programs.
- The units pass `systemd-analyze verify` (in a root made of the unpacked packages and this
  host's systemd units) and the hardening keeps `systemd-analyze security` low.
- systemd is not PID 1 on this machine, so the units run in a container whose PID 1 is
  systemd (installed there from the cache too): `systemctl start` of sam-node.service and
  sam-box@researcher.service with the packaged example configuration, a real tunnel through
  the agent socket to the node and a refused name, a box without credential settings failing
  closed, and `systemctl stop` removing the socket.

Build tree: COMPASS_BUILD_DIR (default build/), configured by CMake (CPackConfig.cmake) with
the four programs built. The image is built by `compass-runner image build` if missing.
"""

import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import tempfile

import pytest

import nodelib
from boxlib import wait_for
from cli_programs import PROGRAMS, binary, build_dir, project_version

DEB_VERSION = f"{project_version()}-1"
IMAGE = "localhost/compass-agent:latest"
# Root on this host lacks CAP_SYS_RESOURCE (podman's default ulimits cannot be set) and crun
# fails on its cgroup layout: the same settings compass-runner's own containers.conf makes.
PODMAN = ["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs"]
PODMAN_RUN = [*PODMAN, "run", "--rm", "--network", "none", "--ulimit", "nofile=1024:1024",
              "--ulimit", "nproc=4096:4096", "--user", "0:0"]  # the image's default user is 1000
UNITS = {"sam-box": ["sam-box@.service"], "sam-node": ["sam-node.service"]}
NO_NETWORK_HINT = ("\n(the container has no network: apt there takes packages from this "
                   "host's cache, which scripts/install-deps fills)")
BINARIES = {"sam-box": ["sam-box", "sam-box-verify"], "nano-init": ["nano-init"],
            "compass-runner": ["compass-runner"], "sam-node": ["sam-node"]}


def sh(*cmd, timeout=300, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, **kw)


@pytest.fixture(scope="module")
def debs():
    """The four .deb files, made by cpack from the build tree into a temporary directory."""
    build = build_dir()
    config = build / "CPackConfig.cmake"
    if not config.exists():
        pytest.fail(f"{config} missing: configure the build tree with CMake first")
    for p in PROGRAMS:
        if not (build / "src" / p / p).exists():
            pytest.fail(f"{p} is not built in {build} (cmake --build {build})")
    out = pathlib.Path(tempfile.mkdtemp(prefix="compass-debs-"))
    try:
        r = sh("cpack", "--config", str(config), "-G", "DEB", "-B", str(out), timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        files = {p.name: p for p in out.glob("*.deb")}
        yield files
    finally:
        shutil.rmtree(out, ignore_errors=True)


def deb_of(debs, package):
    arch = sh("dpkg", "--print-architecture").stdout.strip()
    name = f"{package}_{DEB_VERSION}_{arch}.deb"
    assert name in debs, f"{name} not made; cpack made {sorted(debs)}"
    return debs[name]


def field(deb, name):
    return sh("dpkg-deb", "-f", str(deb), name).stdout.strip()


def test_one_package_per_program_with_its_files(debs):
    assert len(debs) == 4, sorted(debs)
    for package in PROGRAMS:
        deb = deb_of(debs, package)
        assert field(deb, "Package") == package
        assert field(deb, "Version") == DEB_VERSION
        listing = sh("dpkg-deb", "-c", str(deb)).stdout
        paths = {line.split()[-1].lstrip(".") for line in listing.splitlines()}
        expected = {f"/usr/bin/{b}" for b in BINARIES[package]}
        expected |= {f"/usr/share/bash-completion/completions/{package}",
                     f"/usr/share/doc/{package}/copyright",
                     f"/usr/share/doc/{package}/packages.md",
                     f"/usr/share/doc/{package}/{package}.md"}
        expected |= {f"/lib/systemd/system/{u}" for u in UNITS.get(package, [])}
        if package in UNITS:
            expected.add(f"/etc/default/{package}")
        assert expected <= paths, f"{package}: missing {sorted(expected - paths)}"
        if package in UNITS:
            mode = next(line.split()[0] for line in listing.splitlines()
                        if line.endswith(f"./etc/default/{package}"))
            assert mode == "-rw-------", (package, mode)  # may hold env:// secrets
        for b in BINARIES[package]:
            mode = next(line.split()[0] for line in listing.splitlines()
                        if line.endswith(f"./usr/bin/{b}"))
            assert mode == "-rwxr-xr-x", (b, mode)


def _needed_packages(path):
    """Debian packages holding the shared libraries `path` links (DT_NEEDED), on this host."""
    out = sh("readelf", "-d", str(path)).stdout
    sonames = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)
    ldcache = sh("ldconfig", "-p").stdout
    packages = set()
    for so in sonames:
        m = re.search(r"^\s*" + re.escape(so) + r" \(libc6,x86-64\) => (\S+)$", ldcache, re.M)
        assert m, f"{path}: {so} not in the linker cache"
        real = os.path.realpath(m.group(1))
        owner = None
        candidates = []
        for path_ in (m.group(1), real):
            candidates += [path_, re.sub(r"^/usr/lib/", "/lib/", path_),
                           re.sub(r"^/lib/", "/usr/lib/", path_)]
        for candidate in candidates:
            r = sh("dpkg", "-S", candidate)
            if r.returncode == 0:
                owner = r.stdout.split(":")[0]
                break
        assert owner, f"{path}: no package owns {so}"
        packages.add(owner)
    return packages


def test_depends_name_every_shared_library_and_the_static_nano_init_needs_none(debs):
    for package in PROGRAMS:
        depends = field(deb_of(debs, package), "Depends")
        names = {re.split(r"[ (]", d.strip())[0] for d in depends.split(",") if d.strip()}
        for b in BINARIES[package]:
            exe = build_dir() / "src" / package / b
            needed = _needed_packages(exe)
            assert needed <= names, f"{package}: {b} links {sorted(needed - names)}, " \
                                    f"not in Depends: {depends}"
    assert field(deb_of(debs, "nano-init"), "Depends") == ""
    runner_depends = field(deb_of(debs, "compass-runner"), "Depends")
    for companion in ("sam-box", "nano-init"):
        assert f"{companion} (= {DEB_VERSION})" in runner_depends, runner_depends


# ---------------------------------------------------------------------------------------
# Installing in a throwaway container


@pytest.fixture(scope="module")
def image():
    if os.geteuid() != 0:
        pytest.fail("the package tests run rootful podman: run as root")
    if sh(*PODMAN, "image", "exists", IMAGE).returncode != 0:
        runner = binary("compass-runner")
        r = sh(str(runner), "image", "build", timeout=1800)
        assert r.returncode == 0, r.stderr
    return IMAGE


def in_container(debs, script, extra=()):
    debdir = next(iter(debs.values())).parent
    return sh(*PODMAN_RUN, "-v", f"{debdir}:/debs:ro", *extra, IMAGE, "sh", "-c", script,
              timeout=300)


VERSIONS = " && ".join(f"{b} --version" for p in PROGRAMS for b in BINARIES[p]
                       if b != "sam-box-verify")


def test_dpkg_on_the_bare_image_refuses_only_what_lacks_libraries(debs, image):
    """Plain `dpkg -i` of the four: a package is configured exactly when the libraries its
    Depends name are in the image, and a refused one is refused naming them. On the local
    image (curl, no libsecret/libyaml-cpp) sam-box, nano-init and compass-runner install and
    run; sam-node is refused. nano-init, being static, installs anywhere."""
    names = " ".join(PROGRAMS)
    script = ("dpkg -i /debs/*.deb; echo dpkg=$?; "
              f"dpkg-query -W -f='status ${{Package}} ${{Status}}\\n' {names}; "
              f"for p in {names}; do $p --version; done 2>&1")
    r = in_container(debs, script)
    out = r.stdout + r.stderr
    status = dict(re.findall(r"^status (\S+) (.+)$", r.stdout, re.M))
    refused = [p for p in PROGRAMS if status.get(p) != "install ok installed"]
    assert ("dpkg=0" in out) == (refused == []), out
    for p in PROGRAMS:
        if p in refused:
            assert re.search(rf"^ {re.escape(p)} depends on \S+ .*; however:$", out, re.M), out
            assert field(deb_of(debs, p), "Depends"), f"{p} refused without any Depends"
            # ...and rightly: its binary cannot run there.
            assert f"{p}: error while loading shared libraries" in out, out
        else:
            assert f"{p} {project_version()}\n" in r.stdout, out
    assert "nano-init" not in refused, out


@pytest.fixture(scope="module")
def apt_installed(debs, image):
    """The four packages installed by apt in one container, then inspected and purged there;
    returns the container's output (markers `== name` before each step)."""
    if not any(pathlib.Path("/var/lib/apt/lists").glob("*_Packages*")):
        pytest.fail("this host has no apt lists (/var/lib/apt/lists): run apt-get update")
    script = f"""
set -e
echo '== apt'
# What docs/packages.md tells the operator, without the network: every dependency comes
# from the overlaid cache (apt would fail to fetch one that is not there).
apt-get install -y -q --no-install-recommends /debs/*.deb >/tmp/apt.log 2>&1 ||
  {{ cat /tmp/apt.log; exit 1; }}
dpkg-query -W -f='${{Package}} ${{Status}}\n' sam-box nano-init compass-runner sam-node
echo '== versions'
{VERSIONS}
echo '== user'
getent passwd compass
echo '== node user'
getent passwd compass-node
echo '== files'
ls /lib/systemd/system/sam-node.service /lib/systemd/system/sam-box@.service \
   /etc/default/sam-node /etc/default/sam-box
echo '== conffiles'
dpkg-query -W -f='${{Conffiles}}\\n' sam-node sam-box
echo '== completion'
for p in sam-box nano-init compass-runner sam-node; do
  bash -c ". /usr/share/bash-completion/completions/$p && complete -p $p"
done
echo '== verify helper'
ls -l /usr/bin/sam-box-verify
echo '== purge'
apt-get purge -y -q sam-node sam-box compass-runner nano-init >/dev/null 2>&1
ls /usr/bin/sam-box /usr/bin/sam-node /usr/bin/nano-init /usr/bin/compass-runner \
   /lib/systemd/system/sam-node.service /etc/default/sam-node 2>&1 || true
echo '== end'
"""
    # This host's lists and package cache, overlaid (`:O`: the container's writes are
    # discarded), with its apt sources: apt resolves the Depends as on any Debian box and
    # takes the .debs from the cache instead of downloading them.
    r = in_container(debs, script, extra=(
        "-v", "/etc/apt:/etc/apt:ro",
        "-v", "/var/lib/apt/lists:/var/lib/apt/lists:O",
        "-v", "/var/cache/apt/archives:/var/cache/apt/archives:O"))
    assert r.returncode == 0 and "== end" in r.stdout, r.stdout + r.stderr + NO_NETWORK_HINT
    return dict(re.findall(r"^== (\S+(?: \S+)?)\n(.*?)(?=^== )", r.stdout, re.M | re.S))


def test_apt_installs_all_four_and_every_binary_answers(apt_installed):
    for p in PROGRAMS:
        assert f"{p} install ok installed" in apt_installed["apt"], apt_installed["apt"]
    versions = apt_installed["versions"]
    for p in PROGRAMS:
        assert f"{p} {project_version()}\n" in versions, versions


def test_install_creates_the_service_user_units_conffiles_and_completions(apt_installed):
    user = apt_installed["user"].split(":")
    assert user[0] == "compass" and user[6].strip() == "/usr/sbin/nologin", user
    assert int(user[2]) < 1000, "compass must be a system user"
    node = apt_installed["node user"].split(":")
    assert node[0] == "compass-node" and node[3] == user[3], (node, user)  # primary group compass
    assert int(node[2]) < 1000 and node[2] != user[2], (node, user)
    assert "No such file" not in apt_installed["files"], apt_installed["files"]
    conffiles = apt_installed["conffiles"]
    assert "/etc/default/sam-node" in conffiles and "/etc/default/sam-box" in conffiles
    completion = apt_installed["completion"]
    for p in PROGRAMS:
        assert re.search(rf"complete -F _\S+ {re.escape(p)}$", completion, re.M), completion
    assert "-rwxr-xr-x" in apt_installed["verify helper"]


def test_purge_removes_binaries_units_and_conffiles(apt_installed):
    left = apt_installed["purge"]
    for path in ("/usr/bin/sam-box", "/usr/bin/sam-node", "/usr/bin/nano-init",
                 "/usr/bin/compass-runner", "/lib/systemd/system/sam-node.service",
                 "/etc/default/sam-node"):
        assert f"cannot access '{path}': No such file" in left, left


# ---------------------------------------------------------------------------------------
# systemd units


@pytest.fixture(scope="module")
def unit_root(debs):
    """A root holding the unpacked packages and this host's own units (the targets the
    packaged units name), for systemd-analyze --root."""
    if shutil.which("systemd-analyze") is None:
        pytest.fail("systemd-analyze missing (Debian package systemd)")
    root = pathlib.Path(tempfile.mkdtemp(prefix="compass-units-"))
    try:
        for deb in debs.values():
            r = sh("dpkg-deb", "-x", str(deb), str(root))
            assert r.returncode == 0, r.stderr
        host_units = pathlib.Path("/lib/systemd/system")
        for unit in host_units.iterdir():
            dest = root / "lib/systemd/system" / unit.name
            if not dest.exists() and not unit.is_dir():
                shutil.copy2(unit, dest, follow_symlinks=False)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def analyze(root, *args):
    return sh("systemd-analyze", *args, f"--root={root}", timeout=60)


def test_units_pass_systemd_analyze_verify_without_a_warning(unit_root):
    r = analyze(unit_root, "verify", "--man=no", "--generators=no", "sam-node.service",
                "sam-box@researcher-1.service")
    assert r.returncode == 0 and r.stderr.strip() == "" and r.stdout.strip() == "", \
        r.stdout + r.stderr


def test_units_name_what_the_packages_install(unit_root):
    """The binaries a unit runs and the docs it points to are in the packages, and the
    example configurations are the files the units read, under the names they read."""
    for unit in ("sam-node.service", "sam-box@.service"):
        text = (unit_root / "lib/systemd/system" / unit).read_text()
        exec_start = re.search(r"^ExecStart=(\S+)", text, re.M).group(1)
        assert (unit_root / exec_start.lstrip("/")).is_file(), exec_start
        for doc in re.findall(r"file://(\S+)", text):
            assert (unit_root / doc.lstrip("/")).is_file(), f"{unit}: {doc}"
    node = (unit_root / "lib/systemd/system/sam-node.service").read_text()
    assert "--config /etc/compass/sam-node.yaml" in node
    assert "--socket-path /run/compass/sam-node.sock" in node
    box = (unit_root / "lib/systemd/system/sam-box@.service").read_text()
    assert "--bundle /etc/compass/agents/%i.yaml" in box
    assert "--socket /run/compass/agents/%i.sock" in box
    assert "--sidecar-socket /run/compass/sam-node.sock" in box


class _Exited(BaseException):
    """Ends a wait_for() at once (it retries on Exception): an exited process stays down."""


def test_the_packaged_examples_are_accepted(unit_root, tmp_path, monkeypatch):
    """sam-node serves with the packaged example configuration, and sam-box starts with the
    packaged example bundle (as a unit would, with --insecure-unverified-bundle since there
    is no issuer here): both reach the point where their socket accepts, then stop on
    SIGTERM with status 0."""
    examples = unit_root / "usr/share/doc"
    monkeypatch.setattr(nodelib, "SAM_NODE", binary("sam-node"))
    node = nodelib.SamNode({}, metrics=False)
    node.config_path.write_text((examples / "sam-node/examples/sam-node.yaml.example")
                                .read_text())
    try:
        node.start()
        assert node.stop() == 0, node.stderr_text()
    finally:
        node.close()
    sock = tmp_path / "agent.sock"
    box = subprocess.Popen(
        [str(binary("sam-box")), "run", "--socket", str(sock), "--bundle",
         str(examples / "sam-box/examples/agent.yaml.example"), "--insecure-unverified-bundle"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        def accepting():
            if box.poll() is not None:
                raise _Exited(f"sam-box exited with {box.returncode}: "
                                     f"{box.stderr.read().decode(errors='replace')}")
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(str(sock))
                return True
            except OSError:
                return False
            finally:
                s.close()
        wait_for(accepting, timeout=20, what="sam-box's socket")
        box.send_signal(signal.SIGTERM)
        assert box.wait(timeout=10) == 0
    finally:
        if box.poll() is None:
            box.kill()
            box.wait(timeout=5)


def test_verify_fails_on_a_bad_unit(unit_root):
    """The check above can fail: a typo in a directive is reported."""
    unit = unit_root / "lib/systemd/system/sam-node.service"
    good = unit.read_text()
    try:
        unit.write_text(good.replace("ProtectSystem=strict", "ProtectSytem=strict"))
        r = analyze(unit_root, "verify", "--man=no", "--generators=no", "sam-node.service")
        assert "Unknown key" in r.stderr, r.stderr
    finally:
        unit.write_text(good)


def test_the_spawn_drop_in_example_verifies(unit_root):
    dropin = unit_root / "etc/systemd/system/sam-node.service.d"
    dropin.mkdir(parents=True)
    try:
        shutil.copy(unit_root / "usr/share/doc/sam-node/examples/sam-node-spawn.conf.example",
                    dropin / "spawn.conf")
        r = analyze(unit_root, "verify", "--man=no", "--generators=no", "sam-node.service")
        assert r.returncode == 0 and r.stderr.strip() == "", r.stderr
    finally:
        shutil.rmtree(dropin)


@pytest.mark.parametrize("unit", ["sam-node.service", "sam-box@researcher-1.service"])
def test_units_are_hardened(unit_root, unit):
    """systemd's own exposure score (0 best .. 10): both units need no capability and see a
    read-only system; the score must stay in systemd's "OK" band (below 2.0)."""
    r = analyze(unit_root, "security", "--offline=yes", "--no-pager", unit)
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", r.stdout + r.stderr)
    assert m, r.stdout + r.stderr
    assert float(m.group(1)) < 2.0, r.stdout


# ---------------------------------------------------------------------------------------
# The units under a real systemd: PID 1 of a throwaway container

# Installs systemd and the packages (from the host's cache: no network), puts the example
# configuration where the units read it, then becomes systemd.
ENTRY = """#!/bin/sh
set -e
if ! apt-get install -y -q --no-install-recommends systemd /debs/*.deb >/tmp/apt.log 2>&1; then
  cat /tmp/apt.log
  exit 1
fi
mkdir -p /etc/compass/agents
cp /usr/share/doc/sam-node/examples/sam-node.yaml.example /etc/compass/sam-node.yaml
cp /usr/share/doc/sam-box/examples/agent.yaml.example /etc/compass/agents/researcher.yaml
cp /usr/share/doc/sam-box/examples/agent.yaml.example /etc/compass/agents/unverified.yaml
cat >/etc/compass/agents/researcher.env <<'END'
SAM_BOX_ARGS="--insecure-unverified-bundle --egress-allow allowed.example:8080 --allow-destination 127.0.0.0/8"
END
exec /lib/systemd/systemd
"""

# What a sandbox's nano-init does on the agent socket: one CONNECT per flow. The allowed
# name (podman --add-host: 127.0.0.1) is served by a small HTTP server started here.
CLIENT = """
import http.server, socket, threading
class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"hello through the boundary"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
server = http.server.HTTPServer(("127.0.0.1", 8080), Hello)
threading.Thread(target=server.serve_forever, daemon=True).start()
def tunnel(target, request=None):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect("/run/compass/agents/researcher.sock")
    s.sendall(f"CONNECT {target} HTTP/1.1\\r\\nHost: {target}\\r\\n\\r\\n".encode())
    head = b""
    while b"\\r\\n\\r\\n" not in head:
        chunk = s.recv(4096)
        if not chunk:
            break
        head += chunk
    print(target, head.split(b"\\r\\n\\r\\n")[0].decode())
    if request and head.startswith(b"HTTP/1.1 200"):
        s.sendall(request.encode())
        body = b""
        while chunk := s.recv(65536):
            body += chunk
        print(body.decode(errors="replace"))
tunnel("mesh.sam.alt:80", "GET /v1/models HTTP/1.1\\r\\nHost: mesh.sam.alt\\r\\n"
       "Connection: close\\r\\n\\r\\n")
tunnel("allowed.example:8080", "GET / HTTP/1.1\\r\\nHost: allowed.example\\r\\n"
       "Connection: close\\r\\n\\r\\n")
tunnel("denied.example:443")
"""


@pytest.fixture(scope="module")
def systemd_box(debs, image):
    """The name of a running container whose PID 1 is systemd, with the packages installed.
    Removed at the end of the module."""
    work = pathlib.Path(tempfile.mkdtemp(prefix="compass-systemd-"))
    (work / "entry.sh").write_text(ENTRY)
    (work / "entry.sh").chmod(0o755)
    (work / "client.py").write_text(CLIENT)
    name = "compass-pkg-" + os.urandom(4).hex()
    debdir = next(iter(debs.values())).parent
    r = sh(*PODMAN, "run", "-d", "--name", name, "--network", "none", "--user", "0:0",
           "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096", "--systemd=always",
           "--add-host", "allowed.example:127.0.0.1",
           "-v", f"{work}:/work:ro", "-v", f"{debdir}:/debs:ro",
           "-v", "/etc/apt:/etc/apt:ro",
           "-v", "/var/lib/apt/lists:/var/lib/apt/lists:O",
           "-v", "/var/cache/apt/archives:/var/cache/apt/archives:O",
           IMAGE, "/work/entry.sh")
    try:
        assert r.returncode == 0, r.stderr

        def manager_up():
            if sh(*PODMAN, "exec", name, "test", "-S", "/run/systemd/private").returncode == 0:
                return True
            state = sh(*PODMAN, "inspect", "-f", "{{.State.Running}}", name).stdout.strip()
            if state != "true":
                raise _Exited("the container stopped before systemd ran:\n"
                              + sh(*PODMAN, "logs", name).stdout[-3000:] + NO_NETWORK_HINT)
            return False
        wait_for(manager_up, timeout=120, what="systemd in the container")
        # Blocks until start-up is over ("degraded" in a container: units that need hardware).
        boot = exec_in(name, "systemctl is-system-running --wait")
        assert boot.stdout.strip() in ("running", "degraded"), boot.stdout + boot.stderr
        yield name
    finally:
        sh(*PODMAN, "rm", "-f", "-t", "0", name)
        shutil.rmtree(work, ignore_errors=True)


def exec_in(name, script):
    return sh(*PODMAN, "exec", name, "sh", "-c", script, timeout=120)


def test_units_start_as_compass_and_serve_the_agent(systemd_box):
    """`systemctl start` of both units, with the hardening of the packaged files: they run
    as `compass-node` and `compass`, the node's socket is 0660 of group `compass` and the
    box's 0600 `compass`, the box cannot read the node's environment (another user), and
    through the agent's socket the
    node answers mesh.sam.alt for the bundle's agent, an allowed name is relayed (resolved
    from /etc/hosts, connected over TCP under the unit's restrictions), and a name off the
    allowlist is refused by the boundary."""
    sockets = "/run/compass/sam-node.sock /run/compass/agents/researcher.sock"
    start = exec_in(systemd_box, "systemctl start sam-node.service sam-box@researcher.service")
    assert start.returncode == 0, start.stderr
    # Type=exec: `start` returns once the programs run; each is ready when its socket is.
    wait_for(lambda: exec_in(systemd_box, " && ".join(f"test -S {p}" for p in sockets.split()))
             .returncode == 0, timeout=30, what=sockets)
    r = exec_in(systemd_box, "systemctl is-active sam-node sam-box@researcher && "
                             "ps -o user:16= -C sam-node,sam-box && "
                             f"stat -c '%n %U %G %a' {sockets} && python3 /work/client.py && "
                             "setpriv --reuid compass --regid compass --clear-groups "
                             "cat /proc/$(pgrep -x sam-node)/environ >/dev/null 2>&1 "
                             "|| echo node-environ-unreadable")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out + exec_in(systemd_box, "journalctl --no-pager -n 50").stdout
    assert out.count("active\n") == 2, out + exec_in(systemd_box, "journalctl --no-pager -n 50").stdout
    assert sorted(r.stdout.split("\n")[2:4]) == ["compass", "compass-node"], out
    assert "/run/compass/sam-node.sock compass-node compass 660" in out
    assert "/run/compass/agents/researcher.sock compass compass 600" in out
    assert "node-environ-unreadable" in out, out
    assert "mesh.sam.alt:80 HTTP/1.1 200" in out, out
    assert '"id":"chat"' in out.replace(" ", ""), out
    assert "allowed.example:8080 HTTP/1.1 200" in out and "hello through the boundary" in out
    assert re.search(r"denied.example:443 HTTP/1.1 403.*Boundary-Reason: not-allowlisted", out,
                     re.S | re.I), out


def test_a_box_without_credential_settings_refuses_to_start(systemd_box):
    """sam-box@unverified has a bundle but neither credential flags nor
    --insecure-unverified-bundle: sam-box exits 2, the unit ends `failed` without restarting
    (RestartPreventExitStatus=2), no socket appears, and the journal names the missing flag.
    Nothing runs unverified."""
    unit = "sam-box@unverified.service"
    try:
        exec_in(systemd_box, f"systemctl start {unit}")
        wait_for(lambda: exec_in(systemd_box, f"systemctl is-active {unit}").stdout.strip()
                 == "failed", timeout=30, what=f"{unit} failed")
        show = exec_in(systemd_box, f"systemctl show -p ExecMainStatus -p NRestarts {unit}")
        assert sorted(show.stdout.split()) == ["ExecMainStatus=2", "NRestarts=0"], show.stdout
        journal = exec_in(systemd_box, f"journalctl --no-pager -u {unit}").stdout
        assert "--credential-issuer is required to verify the bundle" in journal, journal
        assert exec_in(systemd_box, "test -e /run/compass/agents/unverified.sock").returncode
    finally:
        exec_in(systemd_box, f"systemctl reset-failed {unit}")


def test_stopping_a_box_removes_its_socket(systemd_box):
    sock = "/run/compass/agents/researcher.sock"
    assert exec_in(systemd_box, "systemctl start sam-box@researcher").returncode == 0
    wait_for(lambda: exec_in(systemd_box, f"test -S {sock}").returncode == 0, timeout=30,
             what=sock)
    # `stop` returns once sam-box has exited (SIGTERM: it removes its socket first).
    r = exec_in(systemd_box, "systemctl stop sam-box@researcher && ls /run/compass/agents/")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "researcher.sock" not in r.stdout, r.stdout
