"""Start-up: sam-box refuses a bad configuration with a non-zero exit and a message naming the
field or flag; it stops cleanly on SIGTERM."""

import os
import re
import socket

import pytest

import boxlib
from boxlib import SamBox, bundle_yaml, error_text, expect_refusal_to_start

INSECURE = ["--insecure-unverified-bundle"]

BAD_BUNDLES = {
    # id: (bundle text, regex the refusal must match)
    "unknown-top-level-key": (bundle_yaml(allow=["api.example.com"], extra="colour: red\n"),
                              r"colour"),
    "unknown-agent-key": (bundle_yaml(allow=["api.example.com"]).replace(
        "agent:\n", "agent:\n  colour: red\n"), r"colour"),
    "unknown-egress-key": (bundle_yaml(allow=["api.example.com"]).replace(
        "egress:\n", "egress:\n  deny: [pypi.org]\n"), r"deny"),
    "version-v2": (bundle_yaml(version="v2"), r"version"),
    "version-missing": (bundle_yaml().replace("version: v1\n", ""), r"version"),
    "serves-port-70000": (bundle_yaml(serves=("code-reviewer", 70000)), r"serves\.port|port"),
    "serves-port-0": (bundle_yaml(serves=("code-reviewer", 0)), r"serves\.port|port"),
    "serves-port-text": (bundle_yaml(serves=("code-reviewer", "http")), r"serves\.port|port"),
    "egress-port-70000": (bundle_yaml(allow=["api.example.com:70000"]), r"egress"),
    "egress-bad-name": (bundle_yaml(allow=["bad_name!.example.com"]), r"egress"),
    "egress-non-ascii": (bundle_yaml(allow=["bücher.example.com"]), r"egress"),
    "egress-wildcard-inside": (bundle_yaml(allow=["api.*.example.com"]), r"egress"),
    "egress-not-a-list": (bundle_yaml().replace("agent:", "egress:\n  allow: api.example.com\n"
                                                "agent:"), r"egress"),
    "agent-id-bad-name": (bundle_yaml(agent_id="Not A Name!"), r"agent\.id|\bid\b"),
    "agent-id-missing": (bundle_yaml().replace(f"  id: {boxlib.AGENT_ID}\n", ""),
                         r"agent\.id|\bid\b"),
    "serves-name-missing": (bundle_yaml() + "serves:\n  port: 8080\n",
                            r"serves"),
    "duplicate-key": (bundle_yaml() + "version: v1\n", r"version|duplicate"),
    "not-yaml": ("{[}: nope\x00", r"bundle|yaml|parse"),
}


@pytest.mark.parametrize("case", list(BAD_BUNDLES), ids=list(BAD_BUNDLES))
def test_bad_bundle_refuses_to_start(topo, case):
    text, pattern = BAD_BUNDLES[case]
    args = list(INSECURE)
    if "serves:" in text:  # so that the only thing wrong is the bundle field
        args += ["--agent-ingress-socket", os.path.join(topo.tmp, "ingress.sock")]
    rc, err = expect_refusal_to_start(topo, bundle=text, args=args)
    assert re.search(pattern, error_text(err)), \
        f"refusal does not name the field ({pattern}):\n{err}"


def test_serves_without_agent_ingress_socket_refuses(topo):
    rc, err = expect_refusal_to_start(
        topo, bundle=bundle_yaml(serves=("code-reviewer", 8080)), args=INSECURE)
    assert "agent-ingress-socket" in error_text(err), err


def test_missing_bundle_file_refuses(topo):
    missing = os.path.join(topo.tmp, "no-such-bundle.yaml")
    rc, err = expect_refusal_to_start(topo, args=["--bundle", missing] + INSECURE)
    assert "no-such-bundle.yaml" in err or "bundle" in error_text(err), err


@pytest.mark.parametrize("args,pattern", [
    (["--egress-allow", "bad_name!.example.com"], r"egress-allow"),
    (["--egress-allow", "api.example.com:70000"], r"egress-allow"),
    (["--allow-destination", "10.0.0.0/33"], r"allow-destination"),
    (["--allow-destination", "not-a-cidr"], r"allow-destination"),
    (["--metrics-addr", "nonsense"], r"metrics-addr"),
    (["--metrics-addr", "127.0.0.1:99999"], r"metrics-addr"),
    (["--log-level", "chatty"], r"log.level"),
    (["--resolve-cache-ttl", "-1"], r"resolve-cache-ttl"),
    (["--resolve-cache-ttl", "3601"], r"resolve-cache-ttl"),
    (["--no-such-flag"], r"no-such-flag"),
], ids=["egress-bad-name", "egress-bad-port", "cidr-prefix", "cidr-text", "metrics-text",
        "metrics-port", "log-level", "cache-ttl-negative", "cache-ttl-too-long", "unknown-flag"])
def test_bad_flag_refuses_to_start(topo, args, pattern):
    rc, err = expect_refusal_to_start(topo, args=args)
    assert re.search(pattern, err.lower()), f"refusal does not name {pattern}:\n{err}"


def test_sigterm_exits_zero_and_removes_the_socket(sam_box):
    b = sam_box(args=["--egress-allow", "api.example.com"])
    assert os.path.exists(b.socket_path)
    rc = b.stop()
    assert rc == 0, f"exit code {rc} on SIGTERM:\n{b.stderr_text()}"
    assert not os.path.exists(b.socket_path), "the Unix socket was left behind"
    with pytest.raises(OSError):
        boxlib.netns_connect(b.topo.box, ("127.0.0.1", b.metrics_port), timeout=1)


def test_sigterm_with_open_tunnels_exits_zero(sam_box):
    b = sam_box(args=["--egress-allow", "api.example.com"])
    open_conns = []
    for _ in range(3):
        resp, c = b.tunnel("api.example.com:80")
        assert resp.status == 200, resp
        open_conns.append(c)
    idle = b.connect()  # a client that never sends its head
    open_conns.append(idle)
    try:
        rc = b.stop(timeout=15)
        assert rc == 0, f"exit code {rc}:\n{b.stderr_text()}"
        assert not os.path.exists(b.socket_path)
    finally:
        for c in open_conns:
            c.close()


def test_socket_path_in_use_by_a_live_server_is_not_stolen(topo, sam_box):
    b = sam_box(args=["--egress-allow", "api.example.com"])
    # A second box on the same socket path must refuse (or at least not take it over).
    second = SamBox(topo, args=["--egress-allow", "api.example.com"],
                    socket_path=b.socket_path).spawn()
    try:
        rc = second.wait_exit(timeout=10)
        assert rc != 0, f"a second sam-box started on a live socket:\n{second.stderr_text()}"
        assert re.search(r"socket|in use|address", error_text(second.stderr_text())), \
            second.stderr_text()
    finally:
        second.kill()
    # The first box still serves its socket.
    resp, c = b.tunnel("api.example.com:80")
    assert resp.status == 200, resp
    c.close()


def test_stale_socket_file_is_replaced(topo, sam_box, tmp_path):
    path = str(tmp_path / "stale.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.close()  # a socket file with nobody listening, as a crash leaves behind
    b = sam_box(args=["--egress-allow", "api.example.com"], socket_path=path)
    resp, c = b.tunnel("api.example.com:80")
    assert resp.status == 200, resp
    c.close()


def test_egress_allow_flag_adds_to_the_bundle_list(sam_box):
    b = sam_box(bundle=bundle_yaml(allow=["api.example.com"]),
                args=["--insecure-unverified-bundle", "--egress-allow", "files.pypi.org",
                      "--egress-allow", "dual.example.com:80"])
    for authority in ("api.example.com:80", "files.pypi.org:80", "dual.example.com:80"):
        resp, c = b.tunnel(authority)
        assert resp.status == 200, f"{authority}: {resp}"
        c.close()
    for authority in ("a.b.pypi.org:80", "dual.example.com:8080"):
        resp = b.refused(authority)
        assert resp.status == 403 and resp.reason == "not-allowlisted", resp


def test_log_level_debug_starts(sam_box):
    b = sam_box(args=["--egress-allow", "api.example.com", "--log-level", "debug"])
    assert b.alive

