"""sam-node's OpenAI-compatible route, end to end (issue 6; docs/sam-node.md): the sandbox side
speaks to http://mesh.sam.alt through a real sam-box (CONNECT mesh.sam.alt:80 on its agent
socket), sam-box forwards to sam-node's socket with X-Sam-Agent set, and sam-node proxies to a
scripted model server on loopback. Also the a2a directory against a python card server.
"""

import http.client
import http.server
import grp
import json
import os
import pathlib
import secrets
import signal
import subprocess
import threading
import time

import pytest

from boxlib import AGENT_ID, SamBox, bundle_yaml, wait_for
from nodelib import SamNode, free_port, header_values
from nodelib import model_server, sam_node  # noqa: F401 (fixtures used by name)

OTHER = "x.other.example"        # role others (*.other.example): chat2 only
STRANGER = "nobody.test.example"  # no role
KEY = "sk-node-" + secrets.token_hex(8)


def node_config(model):
    return {"version": "v1",
            "services": [{"name": "chat", "type": "openai", "target_url": model.base(),
                          "api_key": "env://SAM_TEST_MODEL_KEY"},
                         {"name": "chat2", "type": "openai", "target_url": model.base("/alt")}],
            "roles": [{"name": "researchers", "allowed_agents": [AGENT_ID],
                       "services": ["chat", "chat2"]},
                      {"name": "others", "allowed_agents": ["*.other.example"],
                       "services": ["chat2"]}]}


def one_service(service, **top):
    """A config with one service, granted to AGENT_ID; top: more top-level fields."""
    return {"version": "v1", **top, "services": [service],
            "roles": [{"name": "r", "allowed_agents": [AGENT_ID],
                       "services": [service["name"]]}]}


@pytest.fixture(scope="module")
def node(model_server):  # noqa: F811 (pytest fixture)
    n = SamNode(node_config(model_server), env={"SAM_TEST_MODEL_KEY": KEY}).start()
    yield n
    n.close()


@pytest.fixture(scope="module")
def agent_box(topo, node):
    b = SamBox(topo, bundle=bundle_yaml(allow=["api.example.com"]),
               args=["--insecure-unverified-bundle", "--sidecar-socket", node.socket_path])
    b.start()
    yield b
    b.kill()


def mesh(box):
    """An http.client connection to http://mesh.sam.alt from the sandbox side of `box`."""
    resp, c = box.tunnel("mesh.sam.alt:80")
    assert resp.status == 200, resp
    assert c.buf == b""
    conn = http.client.HTTPConnection("mesh.sam.alt", timeout=10)
    conn.sock = c.sock
    return conn


def call(box, method, target, headers=None, body=None):
    conn = mesh(box)
    try:
        headers = dict(headers or {})
        if body is not None:
            body = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn.request(method, target, body=body, headers=headers)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def model_ids(body):
    return sorted(m["id"] for m in json.loads(body)["data"])


def test_models_are_listed_per_grants(node, agent_box):
    status, _, body = call(agent_box, "GET", "/v1/models")
    assert status == 200, body
    assert model_ids(body) == ["chat", "chat2"]
    assert model_ids(node.request("GET", "/v1/models", agent=OTHER)[2]) == ["chat2"]
    assert model_ids(node.request("GET", "/v1/models", agent=STRANGER)[2]) == []


def test_chat_completion_goes_upstream_with_the_node_key(node, agent_box, model_server):  # noqa: F811
    n = len(model_server.records())
    status, headers, body = call(
        agent_box, "POST", "/v1/chat/completions",
        headers={"Authorization": "Bearer unused", "X-Sam-Debug": "1"},
        body={"model": "chat", "messages": [{"role": "user", "content": "hi"}]})
    assert status == 200, body
    answer = json.loads(body)
    assert answer["choices"][0]["message"]["content"] == "FINAL []"  # model_server.py's answer
    rec = model_server.records()[n]
    assert rec["path"] == "/v1/chat/completions"
    assert rec["body"]["messages"] == [{"role": "user", "content": "hi"}]
    # The agent's placeholder never reaches the model server; the node's key does.
    assert header_values(rec, "authorization") == [f"Bearer {KEY}"]
    assert not [k for k, _ in rec["headers"] if k.lower().startswith("x-sam-")], rec["headers"]


def test_model_field_selects_the_service(node, agent_box, model_server):  # noqa: F811
    n = len(model_server.records())
    status, _, body = call(agent_box, "POST", "/v1/chat/completions",
                           headers={"Authorization": "Bearer unused"},
                           body={"model": "chat2", "messages": []})
    assert status == 200, body
    rec = model_server.records()[n]
    assert rec["path"] == "/alt/v1/chat/completions"
    assert header_values(rec, "authorization") == []  # chat2 has no api_key


def test_streamed_chunks_arrive_while_the_upstream_still_answers(agent_box, model_server):  # noqa: F811
    model_server.hold()
    n = len(model_server.records())
    conn = mesh(agent_box)
    try:
        conn.request("POST", "/v1/chat/completions",
                     body=json.dumps({"model": "chat", "stream": True, "messages": []}),
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200
        assert r.getheader("Content-Type") == "text/event-stream"
        first = r.readline()
        assert first.startswith(b"data: ") and b'"chat.completion.chunk"' in first, first
        assert b"FINAL" not in first, first
        # The model server is still holding its answer open: the chunk was not buffered.
        held = model_server.records()[n:]
        assert len(held) == 1 and not held[0]["done"], held
        model_server.release()
        rest = r.read()
        assert b'"FINAL []"' in rest and rest.rstrip().endswith(b"data: [DONE]"), rest
    finally:
        model_server.release()
        conn.close()


def test_spoofed_identity_from_the_sandbox_is_replaced(node, agent_box, model_server):  # noqa: F811
    # OTHER may only use chat2; the box's own identity may use both.
    status, _, body = call(agent_box, "GET", "/v1/models", headers={"X-Sam-Agent": OTHER})
    assert status == 200 and model_ids(body) == ["chat", "chat2"], body
    n = len(model_server.records())
    status, _, _ = call(agent_box, "POST", "/v1/chat/completions",
                        headers={"X-Sam-Agent": OTHER}, body={"model": "chat", "messages": []})
    assert status == 200
    assert header_values(model_server.records()[n], "authorization") == [f"Bearer {KEY}"]


def test_missing_identity_is_401_and_counted(node):
    before = node.metric('sam_node_refusals_total{reason="missing-agent-identity"}')
    status, headers, body = node.request("GET", "/v1/models")
    assert status == 401, body
    assert headers["sam-node-reason"] == "missing-agent-identity"
    err = json.loads(body)["error"]
    assert err["type"] == "sam_node_refusal" and err["code"] == "missing-agent-identity"
    assert node.metric('sam_node_refusals_total{reason="missing-agent-identity"}') == before + 1
    log = wait_for(lambda: [e for e in node.logs() if e.get("reason") == "missing-agent-identity"],
                   what="refusal log")[0]
    assert log["decision"] == "denied" and log["route"] == "openai", log


def test_agent_without_a_model_grant_is_refused(node, model_server):  # noqa: F811
    n = len(model_server.records())
    status, headers, body = node.request("POST", "/v1/chat/completions", agent=STRANGER,
                                         body={"model": "chat", "messages": []})
    assert status == 403 and headers["sam-node-reason"] == "not-granted", body
    # The refusal names the id the node saw (a typo in agent.id is then plain to see), and the
    # log says once that this id matches no role.
    assert STRANGER in json.loads(body)["error"]["message"], body
    node.request("GET", "/v1/models", agent=STRANGER)
    no_role = [line for line in node.logs() if line.get("msg", "").startswith("agent matches no role")]
    assert [line["caller"] for line in no_role] == [STRANGER], no_role
    status, headers, _ = node.request("POST", "/v1/chat/completions", agent=OTHER,
                                      body={"model": "chat", "messages": []})
    # OTHER has exactly one model service: an unknown "model" goes to it, not to chat.
    assert status == 200
    assert [r["path"] for r in model_server.records()[n:]] == ["/alt/v1/chat/completions"]
    assert node.metric('sam_node_refusals_total{reason="not-granted"}') >= 1
    text = node.metrics_text()
    assert STRANGER not in text and AGENT_ID not in text


def test_unknown_route_is_404(node):
    status, headers, _ = node.request("GET", "/nope", agent=AGENT_ID)
    assert status == 404 and headers["sam-node-reason"] == "unknown-route"


def test_bad_config_exits_2_naming_the_field(sam_node):  # noqa: F811
    n = sam_node({"version": "v1", "services": [
        {"name": "chat", "type": "openai", "target_url": "ftp://x"}]}, start=False).spawn()
    assert n.wait_exit() == 2
    assert "services[0].target_url" in n.stderr_text()


def test_the_seeds_pod_command_line_runs(sam_node, model_server):  # noqa: F811
    """Seed 003's pod runs `sam-node run --jwt-path=… --bind-addr= --socket-path=…`: no
    --config (it defaults to DATA_DIR/sam-node.yaml), an empty --bind-addr in the `=` form, and
    a token file the node says it does not use (no mesh)."""
    n = sam_node(node_config(model_server), start=False, env={"SAM_TEST_MODEL_KEY": KEY})
    (n.dir / "sam-node.yaml").write_text(n.config_path.read_text())
    token = n.dir / "sam-token"
    token.write_text("header.payload.signature\n")
    n.args = ["run", f"--jwt-path={token}", "--bind-addr=", f"--socket-path={n.socket_path}",
              f"--data-dir={n.dir}"]
    n.start()
    status, _, body = n.request("GET", "/v1/models", agent=AGENT_ID)
    assert status == 200, body
    assert any("--jwt-path is not used" in line.get("msg", "") for line in n.logs())


@pytest.mark.parametrize("flags,said", [
    (["--bind-addr=0.0.0.0:7070"], "--bind-addr: only"),
    (["--jwt-path=/nonexistent/sam-token"], "--jwt-path: cannot read '/nonexistent/sam-token'"),
    (["--jwt-path", "/tmp"], "--jwt-path: cannot read '/tmp': is a directory"),
    (["--jwt-path", ""], "--jwt-path: cannot read '': empty path"),
])
def test_mesh_flags_it_cannot_honour_exit_2(sam_node, flags, said):  # noqa: F811
    n = sam_node({"version": "v1", "services": [], "roles": []}, start=False)
    n.args += flags
    n.spawn()
    assert n.wait_exit() == 2
    assert said in n.stderr_text()


@pytest.mark.parametrize("kind,said", [("fifo", "is not a regular file"),
                                        ("zero", "is not a regular file"),
                                        ("dir", "is a directory")])
def test_config_that_is_not_a_file_exits_2_without_waiting(sam_node, kind, said):  # noqa: F811
    """A FIFO must not hang the node (nothing will ever write it), nor /dev/zero exhaust it."""
    n = sam_node({"version": "v1", "services": [], "roles": []}, start=False)
    odd = n.dir / "odd"
    if kind == "fifo":
        os.mkfifo(odd)
    elif kind == "zero":
        odd = pathlib.Path("/dev/zero")
    else:
        odd.mkdir()
    n.args = ["run", f"--socket-path={n.socket_path}", f"--config={odd}"]
    n.spawn()
    assert n.wait_exit() == 2
    assert f"config: cannot read {odd}: {said}" in n.stderr_text()


def _connects_as_nobody(path):
    probe = ("import socket,sys\ns=socket.socket(socket.AF_UNIX)\n"
             "try:\n s.connect(sys.argv[1]); print('connected')\n"
             "except OSError as e:\n print(type(e).__name__)\n")
    r = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                        "/usr/bin/python3", "-c", probe, path],
                       capture_output=True, text=True, timeout=30)
    return r.stdout.strip()


def test_socket_group_lets_that_group_connect_and_no_one_else(sam_node):  # noqa: F811
    """sam-node under its own user, boxes in a group: --socket-group makes the socket 0660 of
    that group. Without it the socket is 0600: reaching it is a credential."""
    n = sam_node({"version": "v1", "services": [], "roles": []}, metrics=False)
    os.chmod(n.dir, 0o711)
    st = os.stat(n.socket_path)
    assert oct(st.st_mode & 0o777) == "0o600"
    assert _connects_as_nobody(n.socket_path) == "PermissionError"
    n.close()
    group = grp.getgrgid(65534).gr_name  # nobody's own group
    n = sam_node({"version": "v1", "services": [], "roles": []}, metrics=False,
                 args=["--socket-group", group])
    os.chmod(n.dir, 0o711)
    st = os.stat(n.socket_path)
    assert oct(st.st_mode & 0o777) == "0o660" and st.st_gid == 65534
    assert _connects_as_nobody(n.socket_path) == "connected"
    n2 = sam_node({"version": "v1", "services": [], "roles": []}, start=False,
                  args=["--socket-group", "no-such-group-here"])
    n2.spawn()
    assert n2.wait_exit() == 2
    assert "--socket-group: no such group 'no-such-group-here'" in n2.stderr_text()


def test_a_live_nodes_socket_is_not_taken_and_a_stopped_node_removes_its_own(sam_node):  # noqa: F811,E501
    first = sam_node({"version": "v1", "services": [], "roles": []}, metrics=False)
    second = sam_node({"version": "v1", "services": [], "roles": []}, start=False,
                      metrics=False)
    second.args[second.args.index("--socket-path") + 1] = first.socket_path
    second.spawn()
    assert second.wait_exit() == 2 or second.proc.returncode != 0
    assert "in use by another process" in second.stderr_text()
    status, _, _ = first.request("GET", "/v1/models", agent="nobody.example")
    assert status in (200, 403), status  # the first node still answers on its socket
    assert first.stop() == 0
    assert not os.path.exists(first.socket_path)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP])
def test_sigint_and_sighup_stop_the_node_cleanly_too(sam_node, sig):  # noqa: F811
    # There is no reload: SIGHUP (a closed terminal) stops like SIGTERM, socket removed.
    n = sam_node({"version": "v1", "services": [], "roles": []}, metrics=False)
    assert n.stop(sig=sig) == 0
    assert not os.path.exists(n.socket_path)
    assert any(line.get("msg") == "sam-node stopping" for line in n.logs())


def test_missing_default_config_is_named(sam_node):  # noqa: F811
    n = sam_node({"version": "v1", "services": [], "roles": []}, start=False)
    n.args = ["run", f"--socket-path={n.socket_path}", f"--data-dir={n.dir}"]
    n.spawn()
    assert n.wait_exit() == 2
    assert f"cannot read {n.dir}/sam-node.yaml" in n.stderr_text()


def test_unreadable_secret_is_a_startup_warning_and_a_502_when_used(sam_node):  # noqa: F811
    """A secret reference with good syntax but no value yet (values are read when used) starts
    the node, says so at once naming the field, and fails only the requests that need it."""
    n = sam_node(one_service({"name": "chat", "type": "openai",
                              "target_url": f"http://127.0.0.1:{free_port()}/v1",
                              "api_key": "env://COMPASS_TEST_UNSET_KEY"}))
    warned = [line for line in n.logs() if line.get("msg", "").startswith("secret not readable")]
    assert [line["field"] for line in warned] == ["services[0].api_key"], warned
    status, headers, body = n.request("POST", "/v1/chat/completions", agent=AGENT_ID,
                                      body={"model": "chat"})
    assert status == 502 and headers["sam-node-reason"] == "secret-unavailable", body
    # The agent is not told the reference (an operator may have written the key itself there).
    assert b"COMPASS_TEST_UNSET_KEY" not in body, body
    assert json.loads(body)["error"]["type"] == "sam_node_error", body


def test_unreachable_model_server_is_502(sam_node):  # noqa: F811
    n = sam_node(one_service({"name": "chat", "type": "openai",
                              "target_url": f"http://127.0.0.1:{free_port()}/v1"}))
    status, headers, body = n.request("POST", "/v1/chat/completions", agent=AGENT_ID,
                                      body={"model": "chat"})
    assert status == 502 and headers["sam-node-reason"] == "upstream-unreachable", body
    # Which peer serves the name is not the agent's to learn (seed 003): no address or port.
    message = json.loads(body)["error"]["message"]
    assert message.startswith("chat: its upstream failed (upstream-unreachable"), message
    assert "127.0.0.1" not in message and "port" not in message, message
    assert n.stop() == 0


# ---------------------------------------------------------------------------------------
# a2a: a python stand-in serving an agent card


class CardServer:
    def __init__(self):
        self.callers = []
        card_server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                card_server.callers.append(self.headers.get("X-Sam-Caller"))
                if self.path == "/.well-known/agent-card.json":
                    body = json.dumps({"name": "reviewer", "url": "http://127.0.0.1:1/",
                                       "additionalInterfaces": [
                                           {"url": "http://127.0.0.1:1/", "transport": "JSONRPC"}]})
                else:
                    body = json.dumps({"path": self.path})
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def test_a2a_is_advertised_only_while_its_card_answers(sam_node):  # noqa: F811
    card = CardServer()
    n = sam_node(one_service({"name": "reviewer", "type": "a2a",
                              "target_url": f"http://127.0.0.1:{card.port}"},
                             probe_interval_ms=100))

    def listed(agent=AGENT_ID):
        return json.loads(n.request("GET", "/a2a", agent=agent)[2])["agents"]

    wait_for(lambda: listed(), what="reviewer listed")
    assert listed() == [{"name": "reviewer", "card_url":
                         "http://mesh.sam.alt/a2a/reviewer/.well-known/agent-card.json"}]
    assert listed(STRANGER) == []
    assert n.metric('sam_node_a2a_ready{service="reviewer"}') == 1
    status, _, body = n.request("GET", "/a2a/reviewer/.well-known/agent-card.json", agent=AGENT_ID)
    got = json.loads(body)
    assert status == 200 and got["url"] == "http://mesh.sam.alt/a2a/reviewer/", got
    assert got["additionalInterfaces"][0]["url"] == "http://mesh.sam.alt/a2a/reviewer/"
    assert card.callers[-1] == AGENT_ID
    status, _, body = n.request("GET", "/a2a/reviewer/tasks/1?x=2", agent=AGENT_ID)
    assert status == 200 and json.loads(body) == {"path": "/tasks/1?x=2"}
    status, headers, _ = n.request("GET", "/a2a/reviewer/tasks/1", agent=STRANGER)
    assert status == 403 and headers["sam-node-reason"] == "not-granted"

    card.stop()
    wait_for(lambda: listed() == [], what="reviewer withdrawn")
    status, headers, _ = n.request("GET", "/a2a/reviewer/tasks/1", agent=AGENT_ID)
    assert status == 503 and headers["sam-node-reason"] == "service-not-ready"
    assert n.metric('sam_node_a2a_ready{service="reviewer"}') == 0


def test_spawn_templates_missing_runner_or_bundle_are_warned_at_start(sam_node):  # noqa: F811
    """Read when used, like a secret's value: a missing runner or bundle does not stop the
    node, but the log names the field at start rather than leaving it to the first spawn."""
    n = sam_node({"version": "v1",
                  "spawn": [{"name": "w", "bundle": "/nonexistent/w.yaml", "backend": "host",
                             "command": ["true"]}],
                  "runner": "/nonexistent/compass-runner",
                  "roles": [{"name": "r", "allowed_agents": [AGENT_ID], "spawn": ["w"]}]},
                 metrics=False)
    warnings = {line.get("field"): line for line in n.logs() if line.get("level") == "warn"}
    assert warnings["runner"]["runner"] == "/nonexistent/compass-runner", warnings
    assert warnings["spawn[0].bundle"]["bundle"] == "/nonexistent/w.yaml", warnings
    assert n.stop() == 0


def test_a_role_that_would_grant_nothing_is_refused_at_start(sam_node):  # noqa: F811
    n = sam_node({"version": "v1",
                  "services": [{"name": "fs", "type": "mcp", "target_url": "http://127.0.0.1:9/"}],
                  "roles": [{"name": "r", "allowed_agents": [AGENT_ID], "tools": ["fs/read*"],
                             "services": ["fs"]}]}, start=False)
    n.spawn()
    assert n.wait_exit() == 2
    assert "roles[0].tools[0]" in n.stderr_text() and "one exact name" in n.stderr_text()


def test_a_stream_longer_than_the_idle_limit_runs_on_and_silence_ends_it(sam_node,  # noqa: F811
                                                                         model_server):  # noqa: F811,E501
    """The upstream limit of a proxied exchange is silence, not length: a completion that
    streams for longer than upstream_idle_timeout_ms (1 s here; 600 s by default) is passed on
    whole, and one whose upstream goes quiet for longer is cut. (It was a 300 s cap on the whole
    exchange, which cut long streams of reasoning models.)"""
    n = sam_node(one_service({"name": "chat", "type": "openai", "target_url": model_server.base()},
                             upstream_idle_timeout_ms=1000), metrics=False)
    slow = {"model": "chat", "stream": True, "messages": [{"role": "user", "content": "s"}],
            "x_bench": {"chunks": 10, "bytes": 8, "delay_ms": 400}}  # 4 s in all
    started = time.monotonic()
    status, _, body = n.request("POST", "/v1/chat/completions", agent=AGENT_ID, body=slow,
                                timeout=30)
    assert status == 200 and body.count(b"xxxxxxxx") == 10 and b"[DONE]" in body, body[-200:]
    assert time.monotonic() - started > 3.5
    model_server.hold()  # the first event, then silence until release()
    try:
        started = time.monotonic()
        try:
            status, _, body = n.request("POST", "/v1/chat/completions", agent=AGENT_ID,
                                        body={"model": "chat", "stream": True,
                                              "messages": [{"role": "user", "content": "s"}]},
                                        timeout=30)
            assert b"[DONE]" not in body, body
        except http.client.IncompleteRead:
            pass  # the chunked body ended without its last chunk: cut, as it should be
        assert time.monotonic() - started < 15
    finally:
        model_server.release()
    assert any(line.get("msg") == "proxied response ended early" for line in n.logs())
    assert n.stop() == 0


def test_upstream_idle_timeout_is_checked(sam_node):  # noqa: F811
    n = sam_node({"version": "v1", "upstream_idle_timeout_ms": 10, "roles": []}, start=False)
    n.spawn()
    assert n.wait_exit() == 2
    assert "upstream_idle_timeout_ms: must be an integer from 1000 to 3600000" in n.stderr_text()
