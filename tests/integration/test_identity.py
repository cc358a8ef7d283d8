"""Identity: sam-box accepts a bundle only when the platform credential verifies against the
issuer given by flag (OIDC discovery + JWKS over HTTPS with --credential-ca) and its subject
is the bundle's agent.external_id. The issuer (oidc_issuer.TestIssuer) serves on 127.0.0.1
inside the BOX namespace, where sam-box runs."""

import re
import time

import pytest

import boxlib
from boxlib import AGENT_ID, EXTERNAL_ID, SamBox, bundle_yaml, error_text, \
    expect_refusal_to_start, run_in_netns
from oidc_issuer import TestIssuer

AUD = "compass"


def _start_in_box(topo, issuer):
    # The listening socket is created by start() in a thread inside BOX's namespace.
    run_in_netns(topo.box, issuer.start)
    return issuer


@pytest.fixture(scope="module")
def issuer(topo, tmp_path_factory):
    i = _start_in_box(topo, TestIssuer(tmp_path_factory.mktemp("oidc")))
    yield i
    i.stop()


def cred_args(issuer, token_path, ca=None, audience=AUD):
    return ["--credential-issuer", issuer.issuer_url, "--credential-audience", audience,
            "--credential-path", str(token_path), "--credential-ca", ca or issuer.ca_path]


def write_token(tmp_path, token):
    p = tmp_path / "token"
    p.write_text(token)
    return p


def std_bundle():
    return bundle_yaml(allow=["api.example.com"])


@pytest.mark.parametrize("kw", [
    {},
    {"alg": "ES256"},
    {"aud": ["other", AUD]},
    {"nbf": int(time.time()) - 60},
], ids=["rs256", "es256", "aud-array", "nbf-past"])
def test_valid_credential_starts(sam_box, issuer, tmp_path, kw):
    n = len(issuer.requests)
    token = write_token(tmp_path, issuer.mint(sub=EXTERNAL_ID, **kw))
    b = sam_box(bundle=std_bundle(), args=cred_args(issuer, token))
    seen = issuer.requests[n:]
    assert "/.well-known/openid-configuration" in seen, seen
    assert "/jwks" in seen, seen
    # The verified identity is the one asserted on the mesh.
    assert "insecure" not in b.stderr_text().lower()
    resp, c = b.tunnel("api.example.com:80")
    assert resp.status == 200, resp
    c.close()
    b.wait_flow_log(agent=AGENT_ID, outcome="allowed")


def test_token_file_with_trailing_newline_starts(sam_box, issuer, tmp_path):
    token = write_token(tmp_path, issuer.mint(sub=EXTERNAL_ID) + "\n")
    sam_box(bundle=std_bundle(), args=cred_args(issuer, token))


def _now():
    return int(time.time())


BAD_TOKENS = {
    # id: (mint kwargs (or a callable issuer -> kwargs), regex the refusal must match)
    "aud-string": ({"aud": "not-compass"}, r"\baud\b|audience"),
    "aud-array": ({"aud": ["a", "b"]}, r"\baud\b|audience"),
    "aud-missing": ({"aud": None}, r"\baud\b|audience"),
    "alg-none": ({"alg": "none"}, r"\balg\b|algorithm|none"),
    "alg-hs256-key-confusion": ({"alg": "HS256"}, r"\balg\b|algorithm|hs256"),
    "expired": ({"exp": "past"}, r"\bexp\b|expired"),
    "exp-missing": ({"exp": None}, r"\bexp\b|expir"),
    "exp-string": ({"exp": "9999999999"}, r"\bexp\b|expir"),
    "nbf-future": ({"nbf": "future"}, r"\bnbf\b|not before|not yet"),
    "sub-mismatch": ({"sub": "system:serviceaccount:agents:intruder"},
                     r"\bsub\b|subject|external_id"),
    "sub-missing": ({"sub": None}, r"\bsub\b|subject|external_id"),
    "kid-unknown": ({"kid": "no-such-kid"}, r"\bkid\b|key id|key"),
    "wrong-key-same-kid": ({"sign_with": "other"}, r"signature"),
    "es256-der-signature": ({"alg": "ES256", "ecdsa_der": True}, r"signature"),
    "iss-mismatch": ({"iss": "https://127.0.0.1:1"}, r"\biss\b|issuer"),
    "garbage": (None, r"token|jwt|credential|malformed|invalid"),
}


def _mint_bad(issuer, kw):
    if kw is None:
        return "not.a.jwt"
    kw = dict(kw)
    if kw.get("exp") == "past":
        kw["exp"] = _now() - 120
    if kw.get("nbf") == "future":
        kw["nbf"] = _now() + 3600
    kw.setdefault("sub", EXTERNAL_ID)
    return issuer.mint(**kw)


@pytest.mark.parametrize("case", list(BAD_TOKENS), ids=list(BAD_TOKENS))
def test_bad_credential_refuses_to_start(topo, issuer, tmp_path, case):
    kw, pattern = BAD_TOKENS[case]
    token = write_token(tmp_path, _mint_bad(issuer, kw))
    rc, err = expect_refusal_to_start(topo, bundle=std_bundle(),
                                      args=cred_args(issuer, token))
    assert re.search(pattern, error_text(err)), \
        f"refusal does not name the reason ({pattern}):\n{err}"


def test_wrong_audience_flag_refuses(topo, issuer, tmp_path):
    token = write_token(tmp_path, issuer.mint(sub=EXTERNAL_ID))
    rc, err = expect_refusal_to_start(topo, bundle=std_bundle(),
                                      args=cred_args(issuer, token, audience="someone-else"))
    assert re.search(r"\baud\b|audience", error_text(err)), err


def test_issuer_certificate_from_another_ca_refuses(topo, issuer, tmp_path):
    token = write_token(tmp_path, issuer.mint(sub=EXTERNAL_ID))
    rc, err = expect_refusal_to_start(topo, bundle=std_bundle(),
                                      args=cred_args(issuer, token, ca=issuer.other_ca_path))
    assert re.search(r"certificate|tls|ssl|x509|verif|handshake", error_text(err)), err


def test_discovery_naming_another_issuer_refuses(topo, tmp_path):
    liar = _start_in_box(topo, TestIssuer(tmp_path / "liar",
                                          advertise_issuer="https://issuer.invalid"))
    try:
        token = write_token(tmp_path, liar.mint(sub=EXTERNAL_ID))
        rc, err = expect_refusal_to_start(topo, bundle=std_bundle(),
                                          args=cred_args(liar, token))
        assert re.search(r"\biss\b|issuer", error_text(err)), err
    finally:
        liar.stop()


def test_missing_token_file_refuses(topo, issuer, tmp_path):
    missing = tmp_path / "no-token"
    rc, err = expect_refusal_to_start(topo, bundle=std_bundle(),
                                      args=cred_args(issuer, missing))
    assert "no-token" in err or "credential-path" in err.lower(), err


def test_unreachable_issuer_refuses(topo, issuer, tmp_path):
    token = write_token(tmp_path, issuer.mint(sub=EXTERNAL_ID))
    port = boxlib.netns_free_port(topo.box)
    args = cred_args(issuer, token)
    args[1] = f"https://127.0.0.1:{port}"
    rc, err = expect_refusal_to_start(topo, bundle=std_bundle(), args=args)
    assert re.search(r"issuer|discovery|connect|oidc", error_text(err)), err


def test_jwks_failure_refuses(topo, tmp_path):
    broken = _start_in_box(topo, TestIssuer(tmp_path / "broken"))
    try:
        broken.set_response("/jwks", "oops", status=500, content_type="text/plain")
        token = write_token(tmp_path, broken.mint(sub=EXTERNAL_ID))
        rc, err = expect_refusal_to_start(topo, bundle=std_bundle(),
                                          args=cred_args(broken, token))
        assert re.search(r"jwks|500|key", error_text(err)), err
    finally:
        broken.stop()


def test_bundle_without_credential_flags_or_insecure_refuses(topo):
    rc, err = expect_refusal_to_start(topo, bundle=std_bundle())
    assert re.search(r"credential|insecure-unverified-bundle", error_text(err)), err


def test_bundle_to_verify_needs_external_id(topo, issuer, tmp_path):
    token = write_token(tmp_path, issuer.mint(sub=EXTERNAL_ID))
    rc, err = expect_refusal_to_start(
        topo, bundle=bundle_yaml(external_id=None, allow=["api.example.com"]),
        args=cred_args(issuer, token))
    assert "external_id" in error_text(err), err


def test_insecure_flag_starts_and_says_what_it_means(sam_box):
    b = sam_box(bundle=std_bundle(), args=["--insecure-unverified-bundle"])
    warnings = [e for e in b.logs() if str(e.get("level", "")).lower() in ("warn", "warning")]
    text = " ".join(str(e) for e in warnings).lower()
    assert "bundle" in text and "write" in text and "decide" in text, \
        f"no warning saying whoever can write the bundle decides the agent:\n{b.stderr_text()}"
    assert isinstance(b, SamBox)


def test_the_verifier_dies_with_a_killed_sam_box(issuer, tmp_path):
    """sam-box killed with SIGKILL while its verifier (sam-box-verify) waits on an issuer that
    never answers: the verifier must go with it (PR_SET_PDEATHSIG), not fetch on for the rest
    of its 10 s timeout. On loopback."""
    import os
    import signal
    import socket
    import subprocess
    bundle = tmp_path / "bundle.yaml"
    bundle.write_text(std_bundle())
    token = write_token(tmp_path, issuer.mint(sub=EXTERNAL_ID))
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # connections complete in the backlog and are never answered
        args = cred_args(issuer, token)
        args[1] = f"https://127.0.0.1:{silent.getsockname()[1]}"
        box = subprocess.Popen([str(boxlib.SAM_BOX_RUN or boxlib.SAM_BOX), "run", "--socket",
                                str(tmp_path / "box.sock"), "--bundle", str(bundle), *args],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        try:
            def verifier():
                # A child seen between fork and the end of its execve shows the parent's
                # command line or an empty one: wait until it reads as the verifier.
                try:
                    kids = open(f"/proc/{box.pid}/task/{box.pid}/children").read().split()
                    if kids and "sam-box-verify" in open(f"/proc/{kids[0]}/cmdline").read():
                        return int(kids[0])
                except OSError:
                    pass
                return None

            pid = boxlib.wait_for(verifier, timeout=5, what="sam-box to start its verifier")
            box.send_signal(signal.SIGKILL)
            box.wait()

            def gone():
                try:
                    return open(f"/proc/{pid}/stat").read().split(") ")[1][0] == "Z"
                except OSError:
                    return True

            # Well inside the verifier's own 10 s fetch timeout, which would end it anyway.
            boxlib.wait_for(gone, timeout=5, what="the verifier to die with sam-box")
        finally:
            box.kill()
            box.wait()


# The identity after start (src/sam-box/credential_watch.h): the token file is re-read every
# 2 s (kCredentialRecheck); a changed token is verified again; past the "exp" of the last
# accepted one, mesh requests are refused with credential-expired.
RECHECK_S = 2


def _mesh_request(path):
    return (f"GET {path} HTTP/1.1\r\nHost: mesh.sam.alt\r\n"
            "X-Sam-Agent: evil.prod.acme.example\r\n\r\n").encode()


def _mesh_get(box, path):
    """One request on a new mesh tunnel: (CONNECT response, response to the request or None)."""
    resp, c = box.tunnel("mesh.sam.alt:80")
    try:
        if resp.status != 200:
            return resp, None
        c.send(_mesh_request(path))
        return resp, c.read_http_response()
    finally:
        c.close()


def _short_lived_box(sam_box, issuer, sidecar, tmp_path, ttl):
    token = write_token(tmp_path, issuer.mint(sub=EXTERNAL_ID, exp=_now() + ttl))
    box = sam_box(bundle=std_bundle(),
                  args=cred_args(issuer, token) + ["--sidecar-socket", sidecar.path])
    return box, token


def _wait_past(exp):
    time.sleep(max(0.0, exp - time.time()) + 1.2)


def test_an_expired_credential_stops_mesh_requests_until_a_renewed_one_verifies(
        sam_box, issuer, sidecar, tmp_path):
    """A projected token is short-lived and rotated in place: the identity it proved must not
    be asserted past its exp, and a rotated token must bring it back without a restart."""
    exp = _now() + 6
    box, token = _short_lived_box(sam_box, issuer, sidecar, tmp_path, 6)
    resp, (answer, _) = _mesh_get(box, "/before")
    assert answer.status == 200, answer
    records = len(sidecar.records)
    kept_resp, kept = box.tunnel("mesh.sam.alt:80")  # a keep-alive tunnel opened in time
    assert kept_resp.status == 200, kept_resp
    kept.send(_mesh_request("/kept-before"))
    assert kept.read_http_response()[0].status == 200
    _wait_past(exp)

    resp, _ = _mesh_get(box, "/after-expiry")
    assert resp.status == 403 and resp.reason == "credential-expired", resp
    kept.send(_mesh_request("/kept-after-expiry"))
    assert kept.is_closed(), "an open mesh tunnel passed a request after the credential expired"
    kept.close()
    assert [r["path"] for r in sidecar.records[records:]] == ["/kept-before"]
    assert any(str(e.get("msg", "")).startswith("credential expired") for e in box.logs())
    assert box.metrics().get("sam_box_refusals_total", reason="credential-expired") >= 2
    # External egress asserts no identity and is not affected.
    resp, c = box.tunnel("api.example.com:80")
    c.close()
    assert resp.status == 200, resp

    token.write_text(issuer.mint(sub=EXTERNAL_ID))  # the platform rotates the token
    boxlib.wait_for(lambda: _mesh_get(box, "/renewed")[0].status == 200,
                    timeout=RECHECK_S + 10, interval=0.5, what="the renewed credential")
    assert sidecar.records[-1]["path"] == "/renewed"
    sent = [v for k, v in sidecar.records[-1]["headers"] if k.lower() == "x-sam-agent"]
    assert sent == [boxlib.AGENT_ID], sidecar.records[-1]


def test_a_rotated_token_that_does_not_verify_extends_nothing(sam_box, issuer, sidecar,
                                                              tmp_path):
    """A token for another subject put in place of the file: refused and logged, the identity
    keeps the accepted token's exp and then lapses; a later good token restores it."""
    exp = _now() + 6
    box, token = _short_lived_box(sam_box, issuer, sidecar, tmp_path, 6)
    token.write_text(issuer.mint(sub="system:serviceaccount:agents:intruder"))
    boxlib.wait_for(lambda: any("not accepted" in str(e) for e in box.logs()),
                    timeout=RECHECK_S + 10, what="the rotated token's refusal in the log")
    refusal = next(e for e in box.logs() if "not accepted" in str(e))
    assert re.search(r"sub|subject", str(refusal.get("reason", ""))), refusal
    if time.time() < exp - 0.5:
        assert _mesh_get(box, "/still-valid")[1][0].status == 200
    _wait_past(exp)
    assert _mesh_get(box, "/lapsed")[0].reason == "credential-expired"
    token.write_text(issuer.mint(sub=EXTERNAL_ID))
    boxlib.wait_for(lambda: _mesh_get(box, "/back")[0].status == 200,
                    timeout=RECHECK_S + 10, interval=0.5, what="the good token to be accepted")


def test_an_expired_credential_stops_mesh_streams_over_http2(sam_box, issuer, sidecar,
                                                             tmp_path):
    """The same over HTTP/2 (the microvm tier's transport): a new mesh stream is refused 403
    credential-expired, and an open one is reset at its next bytes, which never reach the
    node."""
    from test_h2_tunnels import H2Client
    exp = _now() + 6
    box, _ = _short_lived_box(sam_box, issuer, sidecar, tmp_path, 6)
    c = H2Client(box)
    try:
        sid = c.connect("mesh.sam.alt:80")
        assert c.response(sid)[":status"] == "200"
        c.send(sid, _mesh_request("/h2-before"))
        c.wait(lambda: b"\r\n\r\n" in bytes(c.data[sid]), "the first answer")
        records = len(sidecar.records)
        _wait_past(exp)
        late = c.connect("mesh.sam.alt:80")
        head = c.response(late)
        assert head[":status"] == "403" and head.get("boundary-reason") == "credential-expired", \
            head
        c.send(sid, _mesh_request("/h2-after-expiry"))
        c.wait(lambda: sid in c.reset or sid in c.ended, "the open stream to end")
        assert sid in c.reset, "the open mesh stream should be reset, not answered"
        assert len(sidecar.records) == records, sidecar.records[records:]
    finally:
        c.close()
