"""sam-node with the SDKs agents really use (issue 6, "Tests with the SDKs agents really use").

The agent harness of examples/agent-harness (the `openai` and `@modelcontextprotocol/sdk` npm
packages, base URL http://mesh.sam.alt) runs inside a nano-init sandbox, whose only way out is
its sam-box; sam-box forwards http://mesh.sam.alt to sam-node's API socket and names the agent
in X-Sam-Agent. Behind the node, on loopback of the BOX namespace: the scripted model server
(model_server.py) and a real MCP server built with the MCP SDK (tests/js/mcp_server.mjs). An
A2A agent built with @a2a-js/sdk (tests/js/a2a_agent.mjs) serves from one sandbox and is called
from another (tests/js/a2a_client.mjs) through the node.

Everything runs in the BOX namespace of conftest.py or in the sandboxes' own namespaces;
nothing leaves loopback. The npm packages come from scripts/install-deps.
"""

import http.client
import json
import os
import pathlib
import re
import secrets
import select
import shutil
import socket
import subprocess
import tempfile
import threading
import time

import pytest

from boxlib import bundle_yaml, netns_connect, netns_free_port, wait_for
from nano_fixtures import (dummy_boundary, nano, nano_command, nano_has_netstack,  # noqa: F401
                           nano_tmp, run_nano)

REPO = pathlib.Path(__file__).resolve().parents[2]
HARNESS = REPO / "examples/agent-harness/harness.mjs"
JS = REPO / "tests/js"

RESEARCHER = "researcher-1.prod.acme.example"  # role researchers: add and read_note only
OPERATOR = "builder.ops.acme.example"          # role operators (*.ops.acme.example): notes/*
REVIEWER = "reviewer.c1.acme.example"          # serves code-reviewer; no role needed to serve
MODEL_KEY = "sk-upstream-" + secrets.token_hex(8)
MCP_SERVICE = "notes"
AGENT_PORT = 8080  # the port a2a_agent.mjs binds inside sandbox A (bundle `serves`)


SAM_NODE = pathlib.Path(os.environ.get("SAM_NODE", REPO / "build/src/sam-node/sam-node"))
if not SAM_NODE.is_absolute():
    SAM_NODE = REPO / SAM_NODE


# ---------------------------------------------------------------------------------------
# Processes in the BOX namespace


class BoxProc:
    """A server started in BOX with `ip netns exec` that prints `ready <port>` first; later
    stdout lines are kept (lines()), stderr too (for failure messages)."""

    def __init__(self, topo, argv, env=None):
        self.topo, self.argv = topo, [str(a) for a in argv]
        self.env = {**os.environ, **(env or {})}
        self.proc, self.port = None, None
        self._out, self._err = [], []

    def start(self, timeout=20):
        self.proc = subprocess.Popen(["ip", "netns", "exec", self.topo.box, *self.argv],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=self.env)
        r, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline().decode() if r else ""
        if not line.startswith("ready "):
            self.stop()
            raise AssertionError(f"{self.argv[:2]} did not start: {line!r} "
                                 f"{self.proc.stderr.read().decode(errors='replace')}")
        self.port = int(line.split()[1])
        for stream, sink in ((self.proc.stdout, self._out), (self.proc.stderr, self._err)):
            threading.Thread(target=self._drain, args=(stream, sink), daemon=True).start()
        return self

    @staticmethod
    def _drain(stream, sink):
        for raw in stream:
            sink.append(raw.decode("utf-8", "replace").rstrip("\n"))

    def lines(self):
        return list(self._out)

    def stderr_text(self):
        return "\n".join(self._err)

    def get_json(self, path):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        c.sock = netns_connect(self.topo.box, ("127.0.0.1", self.port))
        c.request("GET", path)
        resp = c.getresponse()
        body = resp.read()
        c.close()
        assert resp.status == 200, (path, resp.status, body)
        return json.loads(body)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout=10):
        super().__init__("sam-node", timeout=timeout)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


class SamNode:
    """`sam-node run` in BOX (so that it reaches BOX's loopback, where the model server, the
    MCP server and the serving sam-box's --ingress-listen are), with a metrics port."""

    def __init__(self, topo, config, env=None):
        if not SAM_NODE.exists():
            pytest.fail(f"sam-node not found at {SAM_NODE} (cmake --build build --target "
                        "sam-node, or set SAM_NODE)")
        self.topo = topo
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="node-", dir=topo.tmp))
        self.socket_path = str(self.dir / "node.sock")
        (self.dir / "node.yaml").write_text(config)
        self.metrics_port = netns_free_port(topo.box)
        self.argv = [str(SAM_NODE), "run", "--socket-path", self.socket_path, "--config",
                     str(self.dir / "node.yaml"), "--data-dir", str(self.dir),
                     "--metrics-addr", f"127.0.0.1:{self.metrics_port}", "--log-level", "debug"]
        self.env = {**os.environ, **(env or {})}
        self.proc, self._err = None, []

    def start(self, timeout=20):
        self.proc = subprocess.Popen(["ip", "netns", "exec", self.topo.box, *self.argv],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, env=self.env)
        threading.Thread(target=BoxProc._drain, args=(self.proc.stderr, self._err),
                         daemon=True).start()
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                time.sleep(0.1)  # let the reader thread take the last lines
                raise AssertionError(f"sam-node exited with {self.proc.returncode}:\n"
                                     f"{self.stderr_text()}")
            try:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(self.socket_path)
                s.close()
                return self
            except OSError:
                s.close()
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"sam-node not ready after {timeout}s:\n"
                                     f"{self.stderr_text()}")
            time.sleep(0.02)

    def stderr_text(self):
        return "\n".join(self._err)

    def request(self, method, path, agent=None, body=None, headers=None):
        """One request on the API socket, as sam-box would send it; returns (status, body)."""
        c = _UnixHTTPConnection(self.socket_path)
        h = {"Host": "mesh.sam.alt", **(headers or {})}
        if agent is not None:
            h["X-Sam-Agent"] = agent
        c.request(method, path, body=body, headers=h)
        resp = c.getresponse()
        data = resp.read()
        c.close()
        return resp.status, data

    def metric(self, series):
        """The value of one series on /metrics (e.g. 'x{a="b"}'), or None if absent."""
        c = http.client.HTTPConnection("127.0.0.1", self.metrics_port, timeout=5)
        c.sock = netns_connect(self.topo.box, ("127.0.0.1", self.metrics_port))
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
        c.close()
        for line in text.splitlines():
            if line.startswith(series + " "):
                return float(line.split()[-1])
        return None

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        shutil.rmtree(self.dir, ignore_errors=True)


# ---------------------------------------------------------------------------------------
# The mesh behind one node


def bare(name):
    """A tool name without a service qualifier the node may add (notes/add, notes.add, ...)."""
    m = re.fullmatch(rf"{MCP_SERVICE}(?:/|\.|__|_|-)(.+)", name)
    return m.group(1) if m else name


@pytest.fixture(scope="module")
def node_bin():
    path = shutil.which("node")
    if path is None:
        pytest.fail("`node` is not installed (scripts/install-deps installs nodejs)")
    for d in (HARNESS.parent, JS):
        if not (d / "node_modules").is_dir():
            pytest.fail(f"{d}/node_modules is missing: run scripts/install-deps (npm install)")
    return path


def node_config(model_port, mcp_port, a2a_port=None, probe_ms=200):
    a2a = ""
    if a2a_port is not None:
        a2a = f"""
  - name: code-reviewer
    type: a2a
    target_url: http://127.0.0.1:{a2a_port}"""
    return f"""version: v1
probe_interval_ms: {probe_ms}
services:
  - name: chat
    type: openai
    target_url: http://127.0.0.1:{model_port}/v1
    api_key: env://SAM_TEST_MODEL_KEY
  - name: {MCP_SERVICE}
    type: mcp
    target_url: http://127.0.0.1:{mcp_port}/mcp{a2a}
roles:
  - name: researchers
    allowed_agents: [{RESEARCHER}]
    services: [chat, {MCP_SERVICE}{", code-reviewer" if a2a_port is not None else ""}]
    tools: ["{MCP_SERVICE}/add", "{MCP_SERVICE}/read_note"]
  - name: operators
    allowed_agents: ["*.ops.acme.example"]
    services: [chat, {MCP_SERVICE}]
    tools: ["{MCP_SERVICE}/*"]
"""


class Mesh:
    """The servers behind one node: model server, MCP server, sam-node (all in BOX)."""

    def __init__(self, topo, node_bin, script, a2a_port=None):
        self.topo = topo
        server = REPO / "tests/integration/model_server.py"
        self.model = BoxProc(topo, ["/usr/bin/python3", server, "--script", json.dumps(script),
                                    "--api-key", MODEL_KEY]).start()
        self.mcp = BoxProc(topo, [node_bin, str(JS / "mcp_server.mjs"), "0"]).start()
        self.node = SamNode(topo, node_config(self.model.port, self.mcp.port, a2a_port),
                            env={"SAM_TEST_MODEL_KEY": MODEL_KEY}).start()

    def model_records(self):
        return self.model.get_json("/_records")

    def mcp_calls(self):
        return [json.loads(line)["call"] for line in self.mcp.lines() if line.startswith("{")]

    def stop(self):
        for p in (self.node, self.mcp, self.model):
            p.stop()


@pytest.fixture
def mesh(topo, node_bin, nano):
    made = []

    def make(script, a2a_port=None):
        m = Mesh(topo, node_bin, script, a2a_port)
        made.append(m)
        return m

    yield make
    for m in made:
        m.stop()


def agent_box(sam_box, mesh_, agent_id, **kw):
    args = ["--insecure-unverified-bundle", "--sidecar-socket", mesh_.node.socket_path]
    args += kw.pop("args", [])
    return sam_box(bundle=bundle_yaml(agent_id=agent_id, external_id=None, **kw), args=args)


def run_harness(box, node_bin, prompt="what is 2 + 3?", stream=False, timeout=90):
    """Runs the harness as nano-init's agent; returns (summary dict, CompletedProcess)."""
    cmd = [node_bin, str(HARNESS), prompt, "--max-turns", "4"] + (["--stream"] if stream else [])
    r = run_nano(box.socket_path, cmd, timeout=timeout)
    assert r.returncode == 0, (f"harness failed ({r.returncode})\nstdout: {r.stdout}\n"
                               f"stderr: {r.stderr}\nsam-box: {box.stderr_text()[-2000:]}")
    last = r.stdout.strip().splitlines()[-1]
    return json.loads(last), r


def tool_messages(request_body):
    return [m for m in request_body["messages"] if m.get("role") == "tool"]


# ---------------------------------------------------------------------------------------
# (a) discover, call the model, run the loop, stop


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_harness_runs_the_tool_loop_through_the_node(mesh, sam_box, node_bin, stream):
    m = mesh({"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}},
                             {"name": "read_note", "arguments": {"name": "todo"}}]})
    box = agent_box(sam_box, m, RESEARCHER)
    summary, _ = run_harness(box, node_bin, stream=stream)

    assert summary["stopped"] == "final" and summary["turns"] == 2, summary
    assert summary["model"] == "chat", summary  # GET /v1/models: the granted openai service
    assert sorted(bare(t) for t in summary["tools"]) == ["add", "read_note"], summary
    assert [(bare(c["name"]), c["isError"], c["result"]) for c in summary["calls"]] == [
        ("add", False, "5"), ("read_note", False, "buy milk")], summary

    # What reached the model: two turns, the second carrying both tool results; the
    # placeholder key never left the sandbox, the node's upstream key was attached.
    records = m.model_records()
    assert len(records) == 2, records
    for rec in records:
        auth = {k.lower(): v for k, v in rec["headers"].items()}.get("authorization")
        assert auth == f"Bearer {MODEL_KEY}", rec["headers"]
        assert bool(rec["body"].get("stream")) == stream
    offered = sorted(bare(t["function"]["name"]) for t in records[0]["body"]["tools"])
    assert offered == ["add", "read_note"]
    assert [t["content"] for t in tool_messages(records[1]["body"])] == ["5", "buy milk"]
    assert summary["final"].startswith("FINAL ")
    assert [x["content"] for x in json.loads(summary["final"][6:])] == ["5", "buy milk"]
    assert m.mcp_calls() == ["add", "read_note"]


# ---------------------------------------------------------------------------------------
# (b) two agents behind one node see different tool lists


def test_two_agents_see_different_tool_lists(mesh, sam_box, node_bin):
    m = mesh({})  # the model answers at once: only discovery matters here
    researcher = agent_box(sam_box, m, RESEARCHER)
    operator = agent_box(sam_box, m, OPERATOR)
    r_summary, _ = run_harness(researcher, node_bin)
    o_summary, _ = run_harness(operator, node_bin)

    assert sorted(map(bare, r_summary["tools"])) == ["add", "read_note"], r_summary
    assert sorted(map(bare, o_summary["tools"])) == ["add", "delete_everything", "read_note"]
    for s in (r_summary, o_summary):
        assert s["stopped"] == "final" and s["calls"] == [], s
    # The model was offered what each agent saw, no more.
    offered = [sorted(bare(t["function"]["name"]) for t in rec["body"]["tools"])
               for rec in m.model_records()]
    assert offered == [["add", "read_note"], ["add", "delete_everything", "read_note"]]


# ---------------------------------------------------------------------------------------
# (c) a refused tool call reaches the model as an error it can read


def test_refused_tool_call_reaches_the_model_as_an_error(mesh, sam_box, node_bin):
    # The model asks for a tool the researcher was not shown; the harness passes it on.
    m = mesh({"tool_calls": [{"name": "delete_everything", "arguments": {}},
                             {"name": "add", "arguments": {"a": 40, "b": 2}}]})
    box = agent_box(sam_box, m, RESEARCHER)
    summary, _ = run_harness(box, node_bin)

    assert summary["stopped"] == "final", summary
    refused, added = summary["calls"]
    assert bare(refused["name"]) == "delete_everything" and refused["isError"], summary
    assert refused["result"].strip(), "the refusal must carry a text the model can read"
    assert not added["isError"] and added["result"] == "42", summary
    second = m.model_records()[1]["body"]
    texts = [t["content"] for t in tool_messages(second)]
    assert texts[0].startswith("Error: ") and texts[0] == "Error: " + refused["result"], texts
    assert texts[1] == "42"
    assert m.mcp_calls() == ["add"], "a refused call must never reach the MCP server"


# ---------------------------------------------------------------------------------------
# (d) A2A: served from sandbox A, called from sandbox B through the node


class ServingSandbox:
    """nano-init running a2a_agent.mjs once `gate` exists, and killing it once `stop` exists
    (the sandbox itself stays up until `end` exists or it is killed): the agent's readiness and
    death are observed by the node, never announced to it."""

    def __init__(self, box, node_bin, ingress_socket, tmp):
        self.tmp = tmp
        self.gate, self.stop_file, self.end = tmp / "gate", tmp / "stop", tmp / "end"
        self.out = tmp / "agent.out"
        script = (f"while [ ! -e {self.gate} ]; do sleep 0.05; done; "
                  f"{node_bin} {JS / 'a2a_agent.mjs'} {AGENT_PORT} >{self.out} 2>&1 & p=$!; "
                  f"while [ ! -e {self.stop_file} ]; do sleep 0.05; done; "
                  f"kill $p; wait $p; echo agent-gone >>{self.out}; "
                  f"while [ ! -e {self.end} ]; do sleep 0.1; done")
        cmd = nano_command(box.socket_path, ["sh", "-c", script],
                           flags=["--ingress-socket", str(ingress_socket)])
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT)

    def output(self):
        return self.out.read_text() if self.out.exists() else ""

    def close(self):
        self.end.touch()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)


def listed(m, agent=RESEARCHER):
    status, body = m.node.request("GET", "/a2a", agent=agent)
    assert status == 200, (status, body)
    return [a["name"] for a in json.loads(body)["agents"]]


def a2a_call(box, node_bin, text):
    r = run_nano(box.socket_path, [node_bin, str(JS / "a2a_client.mjs"), "code-reviewer", text],
                 timeout=60)
    lines = r.stdout.strip().splitlines()
    assert lines, f"a2a_client printed nothing ({r.returncode}): {r.stderr}"
    return r.returncode, json.loads(lines[-1])


def test_a2a_agent_served_from_one_sandbox_called_from_another(mesh, sam_box, topo, node_bin,
                                                               nano_tmp):
    tmp = nano_tmp / f"a2a-{secrets.token_hex(3)}"
    tmp.mkdir()
    ingress_port = netns_free_port(topo.box)
    m = mesh({}, a2a_port=ingress_port)
    ingress_socket = tmp / "ingress.sock"
    serving = agent_box(sam_box, m, REVIEWER, serves=("code-reviewer", AGENT_PORT),
                        args=["--agent-ingress-socket", str(ingress_socket),
                              "--ingress-listen", f"127.0.0.1:{ingress_port}"])
    caller = agent_box(sam_box, m, RESEARCHER)
    sandbox = ServingSandbox(serving, node_bin, ingress_socket, tmp)
    try:
        wait_for(ingress_socket.exists, timeout=20, what="sandbox A's ingress socket")
        # The sandbox is up, the agent has not bound its port: once the node has probed (the
        # readiness gauge exists and says 0), the agent is not listed and cannot be called.
        wait_for(lambda: m.node.metric('sam_node_a2a_ready{service="code-reviewer"}') == 0,
                 timeout=20, what="a failed card probe of code-reviewer")
        assert "code-reviewer" not in listed(m)
        rc, out = a2a_call(caller, node_bin, "too early")
        assert rc != 0 and not out["ok"], out

        sandbox.gate.touch()
        wait_for(lambda: "code-reviewer" in listed(m), timeout=30,
                 what=f"code-reviewer listed; agent output: {sandbox.output()}")
        rc, out = a2a_call(caller, node_bin, "please review")
        assert rc == 0 and out["ok"], out
        assert out["reply"] == f"code-reviewer reviewed: please review (caller {RESEARCHER})"
        # The card the caller saw sends it back through the node, not to the agent's address.
        urls = out["card"]["urls"]
        assert all(u.startswith("http://mesh.sam.alt/a2a/code-reviewer") for u in urls), urls
        # An agent without a grant for code-reviewer does not see it.
        assert listed(m, agent=OPERATOR) == []

        sandbox.stop_file.touch()
        wait_for(lambda: "agent-gone" in sandbox.output(), timeout=20, what="agent stopped")
        wait_for(lambda: "code-reviewer" not in listed(m), timeout=20,
                 what="code-reviewer withdrawn after its agent died")
        rc, out = a2a_call(caller, node_bin, "too late")
        assert rc != 0 and not out["ok"], out
    finally:
        sandbox.close()
