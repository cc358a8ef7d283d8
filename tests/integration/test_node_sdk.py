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

import json
import pathlib
import re
import secrets
import shutil
import subprocess

import pytest

from boxlib import bundle_yaml, netns_free_port, wait_for
from nano_fixtures import (dummy_boundary, nano, nano_command, nano_has_netstack,  # noqa: F401
                           nano_tmp, run_nano)
from nodelib import ModelServer, ReadyProc, header_values
from nodelib import sam_node  # noqa: F401 (fixture used by name)

REPO = pathlib.Path(__file__).resolve().parents[2]
HARNESS = REPO / "examples/agent-harness/harness.mjs"
JS = REPO / "tests/js"

RESEARCHER = "researcher-1.prod.acme.example"  # role researchers: add and read_note only
OPERATOR = "builder.ops.acme.example"          # role operators (*.ops.acme.example): notes/*
REVIEWER = "reviewer.c1.acme.example"          # serves code-reviewer; no role needed to serve
MODEL_KEY = "sk-upstream-" + secrets.token_hex(8)
MCP_SERVICE = "notes"
AGENT_PORT = 8080  # the port a2a_agent.mjs binds inside sandbox A (bundle `serves`)


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
    services = [{"name": "chat", "type": "openai",
                 "target_url": f"http://127.0.0.1:{model_port}/v1",
                 "api_key": "env://SAM_TEST_MODEL_KEY"},
                {"name": MCP_SERVICE, "type": "mcp",
                 "target_url": f"http://127.0.0.1:{mcp_port}/mcp"}]
    if a2a_port is not None:
        services.append({"name": "code-reviewer", "type": "a2a",
                         "target_url": f"http://127.0.0.1:{a2a_port}"})
    return {"version": "v1", "probe_interval_ms": probe_ms, "services": services,
            "roles": [{"name": "researchers", "allowed_agents": [RESEARCHER],
                       "services": ["chat", MCP_SERVICE]
                       + (["code-reviewer"] if a2a_port is not None else []),
                       "tools": [f"{MCP_SERVICE}/add", f"{MCP_SERVICE}/read_note"]},
                      {"name": "operators", "allowed_agents": ["*.ops.acme.example"],
                       "services": ["chat", MCP_SERVICE], "tools": [f"{MCP_SERVICE}/*"]}]}


class Mesh:
    """The servers behind one node, all in BOX (so that sam-node reaches BOX's loopback, where
    the model server, the MCP server and the serving sam-box's --ingress-listen are)."""

    def __init__(self, model, mcp, node):
        self.model, self.mcp, self.node = model, mcp, node

    def model_records(self):
        return self.model.records()

    def mcp_calls(self):
        return [json.loads(line)["call"] for line in self.mcp.lines() if line.startswith("{")]


@pytest.fixture
def mesh(topo, node_bin, nano, sam_node):  # noqa: F811 (pytest fixture)
    """A factory: mesh(script, a2a_port=None) -> Mesh; everything stopped after the test."""
    servers = []

    def make(script, a2a_port=None):
        model = ModelServer(script, api_key=MODEL_KEY, netns=topo.box)
        servers.append(model)
        model.start()
        mcp = ReadyProc([node_bin, JS / "mcp_server.mjs", "0"], netns=topo.box)
        servers.append(mcp)
        mcp.start()
        node = sam_node(node_config(model.port, mcp.port, a2a_port), netns=topo.box,
                        env={"SAM_TEST_MODEL_KEY": MODEL_KEY}, args=["--log-level", "debug"])
        return Mesh(model, mcp, node)

    yield make
    for p in servers:
        p.stop()


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
        assert header_values(rec, "authorization") == [f"Bearer {MODEL_KEY}"], rec["headers"]
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
    status, _, body = m.node.request("GET", "/a2a", agent=agent)
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
