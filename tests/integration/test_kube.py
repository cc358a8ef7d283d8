"""deploy/kubernetes/pod.yaml under a real `podman kube play` (rootful podman, runc): the pod of
seed 003 ("Kubernetes pod") with sam-node, sam-box and the agent, whose command is
`nano-init run --create-namespaces …`. The images are built once per module by
deploy/images/build from COMPASS_BUILD_DIR (default build/), and the manifest refers to their
local tags as written.

What the test changes in the manifest, and why (everything else is played as written):
- names: the pod, its ConfigMaps and its volumes get a unique prefix, so two runs (or a user's
  own `agent` pod) never share a volume;
- the data: the bundle allows `allowed.example:80` (runner_hosts.py's test host, reached from
  the pod through podman's bridge), sam-node's `chat` service points at model_server.py in the
  test hosts' namespace, and the harness fetches the two test hosts;
- podman < 4.4 cannot mount a ConfigMap key with subPath (it mounts the volume's directory
  onto the file and runc fails "not a directory"; subPath support came with podman 4.4), so on
  such a podman the two per-container files (resolv.conf, hosts) become hostPath files with the
  same content. The other ConfigMaps stay ConfigMap volumes.

Nothing is sent to any address outside this host: the agent's traffic ends at sam-box, sam-box
reaches only the test hosts, and sam-node only the model server.
"""

import json
import os
import pathlib
import re
import secrets
import subprocess
import sys
import tempfile
import time

import pytest
import yaml

from runner_hosts import runner_hosts  # noqa: F401 (a fixture)

REPO = pathlib.Path(__file__).resolve().parents[2]
HERE = pathlib.Path(__file__).resolve().parent
MANIFEST = REPO / "deploy/kubernetes/pod.yaml"
BUILD_IMAGES = REPO / "deploy/images/build"
BUILD_DIR = pathlib.Path(os.environ.get("COMPASS_BUILD_DIR", REPO / "build"))
if not BUILD_DIR.is_absolute():
    BUILD_DIR = REPO / BUILD_DIR
RUNNER = BUILD_DIR / "src/compass-runner/compass-runner"
NANO_INIT_CMD = ["/usr/local/bin/nano-init", "run", "--create-namespaces", "--user", "0:0",
                 "/var/run/sam/agent.sock"]
# The project's podman settings (DESIGN.md: runc; ulimits root here may set).
CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]
pids_limit = 2048
log_driver = "k8s-file"
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""


class Podman:
    def __init__(self, conf):
        self.env = dict(os.environ, CONTAINERS_CONF=str(conf))

    def __call__(self, *args, timeout=120, check=False):
        r = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout,
                           env=self.env, stdin=subprocess.DEVNULL)
        if check and r.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)} failed ({r.returncode}): {r.stderr}")
        return r

    def version(self):
        v = self("version", "--format", "{{.Client.Version}}", check=True).stdout.strip()
        return tuple(int(x) for x in re.findall(r"\d+", v)[:2])


@pytest.fixture(scope="module")
def podman():
    if os.geteuid() != 0:
        pytest.fail("the kube tests run as root (rootful podman)")
    d = tempfile.mkdtemp(prefix="compass-kube-")
    conf = pathlib.Path(d) / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    yield Podman(conf)
    conf.unlink()
    os.rmdir(d)


@pytest.fixture(scope="module")
def images(podman):
    """deploy/images/build, once per module (the Debian base image first, if missing)."""
    if podman("image", "exists", "localhost/compass-agent:latest").returncode != 0:
        if not RUNNER.exists():
            pytest.fail(f"localhost/compass-agent:latest is missing and {RUNNER} is not built")
        r = subprocess.run([str(RUNNER), "image", "build"], capture_output=True, text=True,
                           timeout=1800)
        assert r.returncode == 0, r.stderr
    started = time.monotonic()
    r = subprocess.run([str(BUILD_IMAGES), "--build-dir", str(BUILD_DIR)], capture_output=True,
                       text=True, timeout=600, env=podman.env)
    assert r.returncode == 0, f"deploy/images/build failed:\n{r.stderr}"
    print(f"images built in {time.monotonic() - started:.1f} s:\n{r.stdout}", file=sys.stderr)
    return r.stdout


@pytest.fixture(scope="module")
def model(runner_hosts):
    """model_server.py in the test hosts' namespace, on the allowed host's address."""
    proc = subprocess.Popen(
        ["ip", "netns", "exec", runner_hosts.NETNS, sys.executable, str(HERE / "model_server.py"),
         "--host", runner_hosts.ALLOWED_V4, "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    line = proc.stdout.readline().decode()
    if not line.startswith("ready "):
        proc.kill()
        raise RuntimeError("model server did not start: " + proc.stderr.read().decode())
    yield f"http://{runner_hosts.ALLOWED_V4}:{int(line.split()[1])}"
    proc.terminate()
    proc.wait(timeout=10)


class Played:
    """One manifest under `podman kube play`; `down()` runs `podman kube down`."""

    def __init__(self, podman, docs, tmp):
        self.podman = podman
        self.pod = next(d for d in docs if d["kind"] == "Pod")
        self.name = self.pod["metadata"]["name"]
        self.configmaps = [d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"]
        self.path = pathlib.Path(tmp) / f"{self.name}.yaml"
        self.path.write_text(yaml.safe_dump_all(docs))
        self.is_down = False
        r = podman("kube", "play", str(self.path))
        if r.returncode != 0:
            self.down()
            self.remove_configmap_volumes()
            raise AssertionError(f"podman kube play failed: {r.stderr}")

    def ctr(self, container):
        return f"{self.name}-{container}"

    def logs(self, container):
        r = self.podman("logs", self.ctr(container))
        return r.stdout, r.stderr

    def infra_pid(self):
        r = self.podman("pod", "inspect", "--format", "{{.InfraContainerID}}", self.name,
                        check=True)
        return self.podman("inspect", "--format", "{{.State.Pid}}", r.stdout.strip(),
                           check=True).stdout.strip()

    def leftovers(self):
        left = []
        if self.podman("pod", "exists", self.name).returncode == 0:
            left.append(f"pod {self.name}")
        names = self.podman("ps", "-a", "--format", "{{.Names}}").stdout.split()
        left += [f"container {n}" for n in names if n.startswith(self.name + "-")]
        vols = self.podman("volume", "ls", "--format", "{{.Name}}").stdout.split()
        left += [f"volume {v}" for v in vols if v.startswith(self.name + "-")]
        return left

    def down(self):
        if not self.is_down:
            self.is_down = True
            return self.podman("kube", "down", str(self.path))
        return None

    def remove_configmap_volumes(self):
        for v in self.configmaps:
            self.podman("volume", "rm", "-f", v)


def manifest(podman, tmp, model_url, agent_command=None):
    """deploy/kubernetes/pod.yaml with the changes the module docstring lists."""
    docs = list(yaml.safe_load_all(MANIFEST.read_text()))
    prefix = "kt" + secrets.token_hex(3)
    configmaps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    pod = next(d for d in docs if d["kind"] == "Pod")
    pod["metadata"]["name"] = prefix
    for cm in configmaps.values():
        cm["metadata"]["name"] = f"{prefix}-{cm['metadata']['name']}"
    by_new_name = {cm["metadata"]["name"]: cm for cm in configmaps.values()}
    subpath_ok = podman.version() >= (4, 4)
    spec = pod["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    renamed = {name: f"{prefix}-{name}" for name in volumes}
    for v in spec["volumes"]:
        v["name"] = renamed[v["name"]]
        if "configMap" in v:
            v["configMap"]["name"] = f"{prefix}-{v['configMap']['name']}"
    for c in spec["containers"]:
        for m in c.get("volumeMounts", []):
            source = volumes[m["name"]]
            m["name"] = renamed[m["name"]]
            if "subPath" in m and "configMap" in source and not subpath_ok:
                # podman < 4.4: a hostPath file holding the ConfigMap key instead.
                cm = by_new_name[source["configMap"]["name"]]
                f = pathlib.Path(tmp) / f"{cm['metadata']['name']}.{m['subPath']}"
                f.write_text(cm["data"][m["subPath"]])
                name = f"{m['name']}-{m['subPath'].replace('.', '-')}"
                if name not in [v["name"] for v in spec["volumes"]]:
                    spec["volumes"].append({"name": name,
                                            "hostPath": {"path": str(f), "type": "File"}})
                m["name"] = name
                del m["subPath"]
    spec["volumes"] = [v for v in spec["volumes"]
                       if any(m["name"] == v["name"] for c in spec["containers"]
                              for m in c.get("volumeMounts", []))]
    bundle_cm = configmaps["agent-bundle"]
    bundle = yaml.safe_load(bundle_cm["data"]["bundle.yaml"])
    bundle["egress"]["allow"] = ["allowed.example:80"]
    bundle_cm["data"]["bundle.yaml"] = yaml.safe_dump(bundle)
    node_cm = configmaps["sam-node-config"]
    node = yaml.safe_load(node_cm["data"]["node.yaml"])
    node["services"][0]["target_url"] = f"{model_url}/v1"
    node_cm["data"]["node.yaml"] = yaml.safe_dump(node)
    agent = next(c for c in spec["containers"] if c["name"] == "agent")
    assert agent["command"][:len(NANO_INIT_CMD)] == NANO_INIT_CMD, "the manifest's agent is not nano-init's child"
    agent["env"] = [{"name": "AGENT_FETCH", "value": "http://allowed.example/ http://denied.example/"},
                    {"name": "AGENT_CHAT", "value": "chat"}]
    if agent_command is not None:
        agent["command"] = agent_command
        spec["restartPolicy"] = "Never"
    return docs


def wait_for(predicate, what, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def played(podman, images, runner_hosts, model):
    tmp = tempfile.mkdtemp(prefix="compass-kube-")
    started = time.monotonic()
    p = Played(podman, manifest(podman, tmp, model), tmp)
    try:
        out = wait_for(lambda: (lambda o: o if '"done": true' in o else None)(p.logs("agent")[0]),
                       "the harness's done line")
        p.started_s = time.monotonic() - started
        p.items = {}
        for line in out.splitlines():
            if line.startswith("{") and '"program"' not in line:
                item = json.loads(line)
                for k, v in item.items():
                    p.items.setdefault(k, []).append(v)
        yield p
    finally:
        p.down()
        p.remove_configmap_volumes()
        for f in pathlib.Path(tmp).iterdir():
            f.unlink()
        os.rmdir(tmp)


def item(played, key):
    assert key in played.items, f"the harness printed no {key}: {played.logs('agent')}"
    return played.items[key][0]


def pod_specs():
    """(file, pod spec) of every pod in deploy/kubernetes, a Deployment's template included."""
    for path in sorted(MANIFEST.parent.glob("*.yaml")):
        for d in yaml.safe_load_all(path.read_text()):
            if d["kind"] == "Pod":
                yield path.name, d["spec"]
            elif d["kind"] == "Deployment":
                yield path.name, d["spec"]["template"]["spec"]


def test_manifests_keep_the_seeds_details():
    """Both manifests, also the one podman cannot play: the harness is nano-init's child; no
    securityContext anywhere; tun is a hostPath CharDevice; resolv.conf is a per-container
    file naming only the virtual DNS, no dnsConfig; node.sock and tokens stay out of the
    agent's container."""
    specs = list(pod_specs())
    assert [name for name, _ in specs] == ["deployment.yaml", "pod.yaml"]
    for name, spec in specs:
        assert "securityContext" not in spec and "dnsConfig" not in spec, name
        assert spec.get("automountServiceAccountToken") is False, name
        volumes = {v["name"]: v for v in spec["volumes"]}
        containers = {c["name"]: c for c in spec["containers"]}
        assert set(containers) == {"sam-node", "sam-box", "agent"}, name
        for c in containers.values():
            assert "securityContext" not in c, (name, c["name"])
        agent = containers["agent"]
        assert agent["command"][:len(NANO_INIT_CMD)] == NANO_INIT_CMD, name
        mounts = {m["mountPath"]: m for m in agent["volumeMounts"]}
        assert volumes[mounts["/dev/net/tun"]["name"]]["hostPath"] == {
            "path": "/dev/net/tun", "type": "CharDevice"}, name
        resolv = mounts["/etc/resolv.conf"]
        # The harness is the container's root: a writable mount would let it rewrite the file
        # (on podman, the host file behind it, shared with other pods of the same names).
        assert resolv.get("readOnly") is True and mounts["/etc/hosts"].get("readOnly") is True
        cm_name = volumes[resolv["name"]]["configMap"]["name"]
        docs = list(yaml.safe_load_all((MANIFEST.parent / name).read_text()))
        cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == cm_name)
        assert cm["data"][resolv["subPath"]] == "nameserver 100.127.255.253\n", name
        # The socket directory the agent sees is not sam-node's.
        node_sock_dir = next(a.split("=", 1)[1].rsplit("/", 1)[0]
                             for a in containers["sam-node"]["args"]
                             if a.startswith("--socket-path="))
        node_volume = next(m["name"] for m in containers["sam-node"]["volumeMounts"]
                           if m["mountPath"] == node_sock_dir)
        assert node_volume not in [m["name"] for m in agent["volumeMounts"]], name
        assert not any("projected" in volumes[m["name"]] for m in agent["volumeMounts"]), name


def test_harness_sees_only_lo_and_tun0(played):
    print(f"kube play to the harness's last line: {played.started_s:.2f} s", file=sys.stderr)
    assert item(played, "links") == ["lo", "tun0"]
    check = item(played, "check")
    assert check["rc"] == 0 and check["out"].startswith("sandboxed:"), check


def test_exec_into_agent_container_sees_the_sandbox(played):
    # The seed's own check: `kubectl exec -c agent agent -- ip -o link show | cut -d: -f2`.
    # runc exec joins the namespaces nano-init (the container's PID 1) now has.
    r = played.podman("exec", played.ctr("agent"), "ip", "-o", "link", "show", check=True)
    assert [ln.split(":")[1].strip() for ln in r.stdout.splitlines()] == ["lo", "tun0"]
    r = played.podman("exec", played.ctr("agent"), "nano-init", "check")
    assert r.returncode == 0 and r.stdout.startswith("sandboxed:"), r.stdout + r.stderr
    # …while the pod's own namespace, where sam-box and sam-node run, has eth0.
    r = subprocess.run(["nsenter", "-t", played.infra_pid(), "-n", "ip", "-o", "link", "show"],
                       capture_output=True, text=True, check=True)
    assert "eth0" in r.stdout


def test_node_socket_is_not_in_the_agents_container(played):
    assert item(played, "sockets") == ["agent.sock"]


def test_allowed_name_works_and_denied_is_refused(played):
    fetches = {f["url"]: f for f in played.items["fetch"]}
    assert fetches["http://allowed.example/"].get("status") == 200, fetches
    assert fetches["http://allowed.example/"]["body"] == "allowed.example\n"
    denied = fetches["http://denied.example/"]
    assert "status" not in denied and "Connection refused" in denied["error"], denied
    box_log = played.logs("sam-box")[1]
    assert re.search(r'"name":"denied.example".*"reason":"not-allowlisted"', box_log), box_log
    metrics = subprocess.run(["nsenter", "-t", played.infra_pid(), "-n", "curl", "-sS", "-m", "5",
                              "http://127.0.0.1:9600/metrics"],
                             capture_output=True, text=True).stdout
    assert re.search(r'sam_box_flows_total\{outcome="allowed",route="external"\} [1-9]', metrics)
    assert re.search(r'sam_box_flows_total\{outcome="denied",route="external"\} [1-9]', metrics)


def test_mesh_is_answered_by_sam_node(played, model):
    models = item(played, "models")
    assert models.get("status") == 200, models
    assert [m["id"] for m in json.loads(models["body"])["data"]] == ["chat"]
    chat = item(played, "chat")
    assert chat.get("status") == 200, chat
    assert json.loads(chat["body"])["choices"][0]["message"]["role"] == "assistant"
    # The model saw the request the node made, not the sandbox's placeholder key.
    records = json.loads(subprocess.run(["curl", "-sS", "-m", "5", f"{model}/_records"],
                                        capture_output=True, text=True, check=True).stdout)
    assert records, "the model server saw no request"
    headers = {k.lower(): v for k, v in records[-1]["headers"]}
    assert headers.get("authorization") != "Bearer unused"


def test_harness_started_directly_is_not_sandboxed(podman, images, runner_hosts, model):
    """The seed's warning: a container that runs the harness itself (here `nano-init check`
    as the whole command) leaves it in the pod's network namespace. It runs, and is told."""
    tmp = tempfile.mkdtemp(prefix="compass-kube-")
    p = Played(podman, manifest(podman, tmp, model,
                                agent_command=["/usr/local/bin/nano-init", "check"]), tmp)
    try:
        code = podman("wait", p.ctr("agent"), timeout=60, check=True).stdout.strip()
        out = p.logs("agent")[0]
        print(f"harness started directly: {out.strip()}", file=sys.stderr)
        assert code == "1", (code, out)
        assert out.startswith("not sandboxed:"), out
        assert "also holds eth0" in out and "default route via eth0" in out, out
    finally:
        p.down()
        p.remove_configmap_volumes()
        for f in pathlib.Path(tmp).iterdir():
            f.unlink()
        os.rmdir(tmp)


def test_kube_down_leaves_nothing(played):
    """Last in the module. podman 4.3 keeps the volumes it made from ConfigMaps on `kube down`
    (by design, to keep data; `kube down --force` in later podman removes them): those, and
    only those, are removed by hand here and named in the output."""
    r = played.down()
    assert r is not None and r.returncode == 0, r.stderr if r else "already down"
    left = played.leftovers()
    kept = [f"volume {v}" for v in played.configmaps]
    unexpected = [x for x in left if x not in kept]
    assert unexpected == [], unexpected
    if left:
        print(f"podman kube down kept the ConfigMap volumes {left}; removing them",
              file=sys.stderr)
    played.remove_configmap_volumes()
    assert played.leftovers() == []
