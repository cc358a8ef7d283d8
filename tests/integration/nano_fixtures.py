"""Helpers for the nano-init integration tests: the binary, a throw-away boundary socket, and
running nano-init as PID 1 of fresh PID + network namespaces (`unshare`), so that nothing it
configures (tun0, routes, mounts) can touch the host's.
"""

import os
import pathlib
import shutil
import socket
import subprocess
import tempfile
import threading

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
NANO_INIT = pathlib.Path(os.environ.get("NANO_INIT", REPO / "build/src/nano-init/nano-init"))
if not NANO_INIT.is_absolute():
    NANO_INIT = REPO / NANO_INIT

NOT_BUILT = "built without its network stack"


def require_nano():
    if not NANO_INIT.exists():
        pytest.fail(f"nano-init not found at {NANO_INIT} (cmake --build build --target nano-init)")


class DummyBoundary:
    """A Unix socket that accepts and closes: enough for tests that make no flow."""

    def __init__(self, path):
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(16)
        self.stopped = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stopped:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.close()

    def stop(self):
        self.stopped = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def nano_command(boundary, cmd, flags=(), pidns=True, netns=True, prefix=()):
    """argv that runs nano-init (as PID 1 if pidns) in fresh namespaces. The tests run as root
    of the machine, where nano-init runs the agent only as the --user it is given: root
    (--user 0:0) unless `flags` name one."""
    if os.geteuid() == 0 and "--user" not in flags:
        flags = ("--user", "0:0", *flags)
    wrap = ["unshare"]
    if netns:
        wrap.append("--net")
    if pidns:
        wrap += ["--pid", "--fork", "--mount-proc", "--kill-child"]
    else:
        wrap.append("--mount")
    return [*prefix, *wrap, str(NANO_INIT), "run", *flags, str(boundary), *cmd]


def run_nano(boundary, cmd, flags=(), timeout=30, **kw):
    return subprocess.run(nano_command(boundary, cmd, flags, **kw), capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def nano_tmp():
    d = tempfile.mkdtemp(prefix="nanoinit-", dir="/tmp")
    os.chmod(d, 0o755)
    yield pathlib.Path(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def dummy_boundary(nano_tmp):
    b = DummyBoundary(nano_tmp / "boundary.sock")
    yield b
    b.stop()


@pytest.fixture(scope="module")
def nano_has_netstack(dummy_boundary):
    """True if this nano-init has its network stack; a build without it must refuse `run`."""
    require_nano()
    r = run_nano(dummy_boundary.path, ["true"])
    if NOT_BUILT in r.stderr:
        assert r.returncode != 0, "a nano-init without its netstack must not run the agent"
        return False
    return True


@pytest.fixture
def nano(nano_has_netstack):
    if not nano_has_netstack:
        pytest.skip("nano-init was built without src/netstack: `run` refuses (as it must)")
