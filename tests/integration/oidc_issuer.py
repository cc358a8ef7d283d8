#!/usr/bin/python3
"""A real, local OpenID Connect issuer for tests (Debian python3 + python3-cryptography only).

It plays the platform's credential issuer (seed 003: the Kubernetes API server that mints
projected service account tokens): a throwaway CA, an HTTPS server on 127.0.0.1 with a
discovery document and a JWKS holding one RSA and one EC P-256 key, and a minting function
for good and hostile tokens.

In-process (pytest fixtures):

    issuer = TestIssuer(tmp_path)   # keys and certificates are written into tmp_path
    issuer.start()                  # serves https://127.0.0.1:<port>
    token = issuer.mint(sub="system:serviceaccount:agents:researcher", aud="compass")
    ... pass issuer.ca_path and issuer.issuer_url to the program under test ...
    issuer.stop()

As a process:

    python3 oidc_issuer.py --dir D --port 0     # prints the issuer URL, serves until killed
    python3 oidc_issuer.py mint --dir D --sub S --aud A [--alg RS256 --alg ES256] [--ttl 600]
"""

import argparse
import base64
import datetime
import hashlib
import hmac
import http.server
import ipaddress
import json
import os
import pathlib
import signal
import ssl
import sys
import threading
import time

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID

RSA_KID = "rsa-1"
EC_KID = "ec-1"
DEFAULT_TTL = 600

_DEFAULT = object()  # "argument not given", so that None can mean "leave it out"


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _uint_bytes(n: int, length: int = 0) -> bytes:
    length = max(length, (n.bit_length() + 7) // 8)
    return n.to_bytes(length, "big")


def rsa_jwk(public_key, kid):
    nums = public_key.public_numbers()
    return {"kty": "RSA", "use": "sig", "alg": "RS256", "kid": kid,
            "n": b64url(_uint_bytes(nums.n)), "e": b64url(_uint_bytes(nums.e))}


def ec_jwk(public_key, kid):
    nums = public_key.public_numbers()
    return {"kty": "EC", "use": "sig", "alg": "ES256", "kid": kid, "crv": "P-256",
            "x": b64url(_uint_bytes(nums.x, 32)), "y": b64url(_uint_bytes(nums.y, 32))}


def sign(alg, key, signing_input: bytes, ecdsa_der=False) -> bytes:
    """Signs like a JWS producer. ES256 is raw r||s (RFC 7518 §3.4) unless ecdsa_der asks for
    the (invalid in JWS) DER encoding. HS256 keys are bytes; "none" signs nothing."""
    if alg == "none":
        return b""
    if alg == "HS256":
        return hmac.new(key, signing_input, hashlib.sha256).digest()
    if alg == "RS256":
        return key.sign(signing_input, padding.PKCS1v15(), hashes.SHA256())
    if alg == "ES256":
        der = key.sign(signing_input, ec.ECDSA(hashes.SHA256()))
        if ecdsa_der:
            return der
        r, s = decode_dss_signature(der)
        return r.to_bytes(32, "big") + s.to_bytes(32, "big")
    raise ValueError(f"cannot sign with alg {alg!r}")


def _load_or_make_key(path: pathlib.Path, given, make):
    if given is None and path.exists():
        return serialization.load_pem_private_key(path.read_bytes(), password=None)
    key = given or make()
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    os.chmod(path, 0o600)
    return key


def _make_ca(common_name):
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False,
                                         decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))
    return key, cert


def _make_server_cert(ca_key, ca_cert):
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([
                x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return key, cert


def _pem(cert):
    return cert.public_bytes(serialization.Encoding.PEM)


class _Handler(http.server.BaseHTTPRequestHandler):
    server_version = "test-oidc-issuer"
    protocol_version = "HTTP/1.1"

    def do_GET(self):  # noqa: N802 (http.server's naming)
        issuer = self.server.test_issuer
        issuer.requests.append(self.path)
        status, body, headers, announce_length = issuer._respond(self.path)
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        if announce_length:
            self.send_header("Content-Length", str(len(body)))
        else:
            # The body ends when the connection closes, so a client cannot size-check it up
            # front and must cap it while reading.
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt, *args):
        if self.server.test_issuer.verbose:
            sys.stderr.write("oidc_issuer: " + (fmt % args) + "\n")


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        # Clients that refuse our certificate (wrong-CA tests) abort the handshake; that is
        # expected, not worth a traceback.
        if self.test_issuer.verbose:
            super().handle_error(request, client_address)


class TestIssuer:
    """A local HTTPS OIDC issuer. See the module docstring for a usage sketch.

    Attributes (valid after the constructor unless noted):
      dir            pathlib.Path holding ca.pem, other-ca.pem, server.pem, server-key.pem,
                     rsa-key.pem, ec-key.pem and, once started, issuer.txt
      ca_path        str, PEM of the CA that signed the server certificate (trust this)
      other_ca_path  str, PEM of an unrelated CA (trusting it must fail TLS)
      rsa_key, ec_key              the signing keys published in /jwks (kids RSA_KID, EC_KID)
      other_rsa_key, other_ec_key  unpublished keys, for "same kid, wrong key" tokens
      port, issuer_url             set by start(); issuer_url is "https://127.0.0.1:<port>"
      advertised_issuer            "issuer" in discovery; None = issuer_url (set to lie)
      jwks_uri                     "jwks_uri" in discovery; None = issuer_url + "/jwks"
      requests                     list of request paths served, in order
    """

    __test__ = False  # not a pytest test class despite the name

    def __init__(self, directory, port=0, advertise_issuer=None, jwks_uri=None, verbose=False,
                 rsa_key=None, ec_key=None):
        self.dir = pathlib.Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.requested_port = port
        self.advertised_issuer = advertise_issuer
        self.jwks_uri = jwks_uri
        self.verbose = verbose
        self.port = None
        self.issuer_url = None
        self.requests = []
        self._overrides = {}
        self._server = None
        self._thread = None

        # Signing keys: given, else loaded from the directory, else generated; saved there for
        # the mint subcommand. RSA generation costs up to a second on a busy machine, so
        # a test session may generate one key and hand it to every issuer.
        self.rsa_key = _load_or_make_key(
            self.dir / "rsa-key.pem", rsa_key, lambda: rsa.generate_private_key(65537, 2048))
        self.ec_key = _load_or_make_key(
            self.dir / "ec-key.pem", ec_key, lambda: ec.generate_private_key(ec.SECP256R1()))
        self._other_rsa_key = None
        self.other_ec_key = ec.generate_private_key(ec.SECP256R1())

        self.ca_path = str(self.dir / "ca.pem")
        self.other_ca_path = str(self.dir / "other-ca.pem")
        self.cert_path = str(self.dir / "server.pem")
        self.key_path = str(self.dir / "server-key.pem")
        ca_key, ca_cert = _make_ca("compass test OIDC CA")
        server_key, server_cert = _make_server_cert(ca_key, ca_cert)
        _, other_ca_cert = _make_ca("compass unrelated CA")
        pathlib.Path(self.ca_path).write_bytes(_pem(ca_cert))
        pathlib.Path(self.other_ca_path).write_bytes(_pem(other_ca_cert))
        pathlib.Path(self.cert_path).write_bytes(_pem(server_cert))
        pathlib.Path(self.key_path).write_bytes(server_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
        os.chmod(self.key_path, 0o600)

    @property
    def other_rsa_key(self):
        # Generated lazily: RSA key generation is the slowest step and most tests never need it.
        if self._other_rsa_key is None:
            self._other_rsa_key = rsa.generate_private_key(65537, 2048)
        return self._other_rsa_key

    # --- documents ---

    def jwks(self):
        """The JWKS served at /jwks, as a dict."""
        return {"keys": [rsa_jwk(self.rsa_key.public_key(), RSA_KID),
                         ec_jwk(self.ec_key.public_key(), EC_KID)]}

    def discovery(self):
        """The discovery document served at /.well-known/openid-configuration, as a dict."""
        return {"issuer": self.advertised_issuer or self.issuer_url,
                "jwks_uri": self.jwks_uri or self.issuer_url + "/jwks",
                "response_types_supported": ["id_token"],
                "subject_types_supported": ["public"],
                "id_token_signing_alg_values_supported": ["RS256", "ES256"]}

    def set_response(self, path, body, status=200, content_type="application/json",
                     headers=None, content_length=True):
        """Serves `body` (bytes, str, or a JSON-able dict/list) with `status` at `path` instead
        of the normal document, e.g. a 500 for /jwks, a huge JWKS, or a 302 with a Location.
        content_length=False leaves out Content-Length (the body ends at connection close)."""
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        hdrs = {"Content-Type": content_type}
        hdrs.update(headers or {})
        self._overrides[path] = (status, body, hdrs, content_length)

    def clear_responses(self):
        self._overrides.clear()

    def _respond(self, path):
        if path in self._overrides:
            return self._overrides[path]
        json_headers = {"Content-Type": "application/json"}
        if path == "/.well-known/openid-configuration":
            return 200, json.dumps(self.discovery()).encode(), json_headers, True
        if path == "/jwks":
            return 200, json.dumps(self.jwks()).encode(), json_headers, True
        return 404, b"not found\n", {"Content-Type": "text/plain"}, True

    # --- serving ---

    def start(self):
        """Starts serving HTTPS on 127.0.0.1 in a daemon thread; returns issuer_url."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert_path, self.key_path)
        server = _Server(("127.0.0.1", self.requested_port), _Handler)
        # The handshake runs in the per-connection thread (on first read), so a client that
        # stalls or aborts it cannot block accept().
        server.socket = ctx.wrap_socket(server.socket, server_side=True,
                                        do_handshake_on_connect=False)
        server.test_issuer = self
        self._server = server
        self.port = server.server_address[1]
        self.issuer_url = f"https://127.0.0.1:{self.port}"
        (self.dir / "issuer.txt").write_text(self.issuer_url + "\n")
        # A short poll interval keeps stop() (and so every test teardown) quick.
        self._thread = threading.Thread(target=server.serve_forever, args=(0.05,),
                                        name="oidc-issuer", daemon=True)
        self._thread.start()
        return self.issuer_url

    def stop(self):
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
            self._server = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    # --- tokens ---

    def mint(self, sub="system:serviceaccount:agents:researcher", aud="compass",
             exp=_DEFAULT, nbf=_DEFAULT, iat=_DEFAULT, iss=_DEFAULT, alg="RS256", kid=_DEFAULT,
             omit=(), sign_with=None, claims=None, header=None, ecdsa_der=False):
        """Returns a compact JWS.

        sub, aud      claim values (aud may be a str or a list); None leaves the claim out
        exp           NumericDate, default now + DEFAULT_TTL; any JSON value is written as is
                      (e.g. a string, for hostile tests); None leaves it out
        nbf           default absent; iat default now
        iss           default issuer_url (start() first, or pass iss)
        alg           "RS256" | "ES256" (signed with the published key of that type),
                      "HS256" (HMAC keyed, by default, with the PEM of the published RSA public
                      key: the key-confusion attack), "none" (empty signature), or any other
                      string (written to the header; sign_with must then give a usable key)
        kid           default RSA_KID / EC_KID by alg (absent for HS256 and none); None omits
        omit          claim names to leave out of the payload
        sign_with     a cryptography private key, bytes (HMAC secret), or "other" for the
                      unpublished key of the same type (kid unchanged: same kid, wrong key)
        claims        extra or replacement payload claims (dict)
        header        extra or replacement header members (dict)
        ecdsa_der     ES256 signature in DER instead of raw r||s (must be refused)
        """
        now = int(time.time())
        payload = {}
        if iss is _DEFAULT:
            if self.issuer_url is None:
                raise RuntimeError("mint before start(): pass iss= explicitly")
            iss = self.issuer_url
        for name, value, default in (("iss", iss, None), ("sub", sub, None), ("aud", aud, None),
                                     ("exp", exp, now + DEFAULT_TTL), ("nbf", nbf, None),
                                     ("iat", iat, now)):
            if value is _DEFAULT:
                value = default
            if value is not None:
                payload[name] = value
        payload.update(claims or {})
        for name in omit:
            payload.pop(name, None)

        if kid is _DEFAULT:
            kid = {"RS256": RSA_KID, "ES256": EC_KID}.get(alg)
        hdr = {"alg": alg, "typ": "JWT"}
        if kid is not None:
            hdr["kid"] = kid
        hdr.update(header or {})

        key = sign_with
        if isinstance(key, str) and key == "other":
            key = {"RS256": self.other_rsa_key, "ES256": self.other_ec_key}[alg]
        if key is None:
            if alg == "HS256":
                key = self.rsa_key.public_key().public_bytes(
                    serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
            else:
                key = {"RS256": self.rsa_key, "ES256": self.ec_key}.get(alg)
        signing_input = (b64url(json.dumps(hdr, separators=(",", ":")).encode()) + "." +
                         b64url(json.dumps(payload, separators=(",", ":")).encode()))
        sign_alg = alg
        if alg not in ("none", "HS256", "RS256", "ES256"):
            # An unsupported alg name signed with whatever key type was supplied.
            sign_alg = "RS256" if isinstance(key, rsa.RSAPrivateKey) else (
                "ES256" if isinstance(key, ec.EllipticCurvePrivateKey) else "HS256")
            key = key if key is not None else b"secret"
        sig = sign(sign_alg, key, signing_input.encode(), ecdsa_der=ecdsa_der)
        return signing_input + "." + b64url(sig)


def _serve(args):
    issuer = TestIssuer(args.dir, port=args.port, advertise_issuer=args.advertise_issuer,
                        jwks_uri=args.jwks_uri, verbose=args.verbose)
    if args.pad_jwks:
        doc = json.dumps(issuer.jwks())
        issuer.set_response("/jwks", doc + " " * max(0, args.pad_jwks - len(doc)),
                            content_length=args.pad_jwks_announced)
    url = issuer.start()
    print(url, flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    issuer.stop()


def _mint(args):
    issuer_url = (pathlib.Path(args.dir) / "issuer.txt").read_text().strip()
    rsa_key = serialization.load_pem_private_key(
        (pathlib.Path(args.dir) / "rsa-key.pem").read_bytes(), password=None)
    ec_key = serialization.load_pem_private_key(
        (pathlib.Path(args.dir) / "ec-key.pem").read_bytes(), password=None)
    now = int(time.time())
    payload = {"iss": args.iss or issuer_url, "sub": args.sub, "aud": args.aud,
               "iat": now, "exp": now + args.ttl}
    for alg in args.alg or ["RS256"]:
        hdr = {"alg": alg, "typ": "JWT", "kid": RSA_KID if alg == "RS256" else EC_KID}
        signing_input = (b64url(json.dumps(hdr, separators=(",", ":")).encode()) + "." +
                         b64url(json.dumps(payload, separators=(",", ":")).encode()))
        key = rsa_key if alg == "RS256" else ec_key
        print(signing_input + "." + b64url(sign(alg, key, signing_input.encode())))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "mint":
        p = argparse.ArgumentParser(prog="oidc_issuer.py mint",
                                    description="Mint a token with the keys in --dir.")
        p.add_argument("--dir", required=True)
        p.add_argument("--sub", required=True)
        p.add_argument("--aud", required=True)
        p.add_argument("--alg", choices=["RS256", "ES256"], action="append",
                       help="repeatable: one token per line, in order (default RS256)")
        p.add_argument("--ttl", type=int, default=DEFAULT_TTL, help="seconds until exp")
        p.add_argument("--iss", help="default: the URL in <dir>/issuer.txt")
        _mint(p.parse_args(argv[1:]))
        return
    p = argparse.ArgumentParser(description="Serve a local HTTPS OIDC issuer for tests.")
    p.add_argument("--dir", required=True, help="where keys and certificates are written")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port")
    p.add_argument("--advertise-issuer", help="lie: put this issuer in the discovery document")
    p.add_argument("--jwks-uri", help="lie: put this jwks_uri in the discovery document")
    p.add_argument("--pad-jwks", type=int, default=0, metavar="BYTES",
                   help="pad the served JWKS with spaces up to BYTES (size-cap tests); sent "
                   "without Content-Length unless --pad-jwks-announced")
    p.add_argument("--pad-jwks-announced", action="store_true",
                   help="send the padded JWKS with its Content-Length")
    p.add_argument("--verbose", action="store_true", help="log requests to stderr")
    _serve(p.parse_args(argv))


if __name__ == "__main__":
    main()
