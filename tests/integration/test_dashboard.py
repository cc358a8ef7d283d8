"""The operator's dashboard and scrape example match what a real sam-box exports.

deploy/grafana/sam-box.json, deploy/prometheus/prometheus.yml and sam-box-alerts.yml name
metrics and labels; a real sam-box, after real traffic, must export every one of them, so a
renamed metric or label fails here instead of leaving an empty panel. The dashboard must be
a Grafana dashboard a Grafana can import (panels with targets, the data source a variable),
and scripts/render-dashboard must turn a real scrape into a PNG.
"""

import json
import pathlib
import re
import struct
import subprocess
import sys

import yaml

import boxlib
from boxlib import Conn, bundle_yaml, netns_connect, netns_free_port

REPO = pathlib.Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy/grafana/sam-box.json"
SCRAPE = REPO / "deploy/prometheus/prometheus.yml"
ALERTS = REPO / "deploy/prometheus/sam-box-alerts.yml"
RENDERER = REPO / "scripts/render-dashboard"

sys.path.insert(0, str(REPO / "scripts"))
import dashboard_promql as promql  # noqa: E402

# Labels that come from the scrape (job name, the relabelled agent), not from sam-box.
SCRAPE_LABELS = {"agent", "job", "instance"}
# `up` is the series Prometheus itself records for each target it scrapes.
PROMETHEUS_SERIES = {"up"}


def dashboard():
    return json.loads(DASHBOARD.read_text())


def dashboard_queries(dash):
    """(where, expr) for every panel target and every query variable."""
    out = []
    for p in dash["panels"]:
        for t in p.get("targets", []):
            out.append((f"panel {p['title']!r} target {t.get('refId')}", t.get("expr")))
    return out


def selectors(node):
    """Every ("sel", name, matchers) node of a parsed query, and every `by` label list."""
    sels, bys = [], []

    def walk(n):
        if n[0] == "sel":
            sels.append(n)
        elif n[0] == "div":
            walk(n[1])
            walk(n[2])
        elif n[0] in ("sum", "sort_desc"):
            if n[1]:
                bys.append((n[2], n[1]))
            walk(n[2])
        elif n[0] in ("rate", "increase"):
            walk(n[1])

    walk(node)
    return sels, bys


def parsed(expr):
    text = re.sub(r"\[\$[a-zA-Z_]+\]", "[60s]", expr)
    return promql.parse(text.replace("$agent", ".*"))


# ---------------------------------------------------------------------------------------


def test_dashboard_is_a_grafana_dashboard_with_the_data_source_as_a_variable():
    dash = dashboard()
    assert isinstance(dash.get("schemaVersion"), int) and dash["schemaVersion"] >= 39
    assert dash.get("title") and dash.get("uid")
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    ds = variables.get("datasource")
    assert ds and ds["type"] == "datasource" and ds["query"] == "prometheus", variables
    agent = variables.get("agent")
    assert agent and agent["type"] == "query" and agent["includeAll"], agent
    assert agent["datasource"]["uid"] == "${datasource}"

    ids, cells = set(), set()
    titles = {p["title"] for p in dash["panels"]}
    for want in ("Flows by outcome and route", "Refusals by reason", "Bytes up / down",
                 "Flows in progress"):
        assert want in titles, f"no panel {want!r}: {sorted(titles)}"
    for p in dash["panels"]:
        where = f"panel {p.get('title')!r}"
        assert p["id"] not in ids, f"{where}: duplicate id {p['id']}"
        ids.add(p["id"])
        assert p["type"] in ("timeseries", "stat", "bargauge"), f"{where}: type {p['type']}"
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
        gp = p["gridPos"]
        assert all(isinstance(gp[k], int) for k in "xywh"), where
        assert 0 <= gp["x"] and gp["x"] + gp["w"] <= 24 and gp["w"] > 0 and gp["h"] > 0, where
        for x in range(gp["x"], gp["x"] + gp["w"]):
            for y in range(gp["y"], gp["y"] + gp["h"]):
                assert (x, y) not in cells, f"{where} overlaps another panel at {(x, y)}"
                cells.add((x, y))
        assert p["targets"], f"{where}: no targets"
        for t in p["targets"]:
            assert t.get("refId") and t.get("expr"), f"{where}: target without refId/expr"
            assert t["datasource"]["uid"] == "${datasource}", where
            # Every query is one the renderer can evaluate, and filters by the agent.
            parsed(t["expr"])
            assert 'agent=~"$agent"' in t["expr"], f"{where}: query ignores $agent"


def test_scrape_example_relabels_the_target_to_an_agent_label():
    conf = yaml.safe_load(SCRAPE.read_text())
    jobs = conf["scrape_configs"]
    assert len(jobs) == 1 and jobs[0]["job_name"] == "sam-box"
    job = jobs[0]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    # Prometheus relabelling (replace): source labels joined by the separator, the regex
    # anchored at both ends, the target label set to the expanded replacement on a match.
    (rule,) = job["relabel_configs"]

    def relabel(labels):
        joined = rule["separator"].join(labels.get(s, "") for s in rule["source_labels"])
        m = re.fullmatch(rule["regex"], joined)
        if m:
            labels = dict(labels, **{rule["target_label"]: m.expand(
                rule["replacement"].replace("$1", r"\1"))})
        return labels

    assert relabel({"__address__": "127.0.0.1:9601"})["agent"] == "127.0.0.1:9601"
    assert relabel({"__address__": "127.0.0.1:9601", "agent": "a.b"})["agent"] == "a.b"
    # The dashboard's `up` and alerts select this job.
    assert any('job="sam-box"' in expr for _, expr in dashboard_queries(dashboard()))
    assert 'job="sam-box"' in ALERTS.read_text()
    for group in yaml.safe_load(ALERTS.read_text())["groups"]:
        for r in group["rules"]:
            assert r["expr"] and r["alert"] and r["annotations"]["summary"]


def _drive_every_family(box, topo, ingress_port):
    """Traffic that makes every metric family of sam-box have samples."""
    resp, c = box.tunnel("api.example.com:80")
    assert resp.status == 200, resp
    r, body = boxlib.http_get(c, "/small.txt", "api.example.com")
    assert r.status == 200 and body == b"hello from upstream\n"
    c.close()
    assert box.refused("denied.example.com:80").reason == "not-allowlisted"
    c = box.raw(b"CONNECT api.example.com:80 HTTP/1.1\r\nX-Pad: " + b"p" * 9000 + b"\r\n\r\n")
    assert c.read_head().status == 431
    c.close()
    s = netns_connect(topo.box, ("127.0.0.1", ingress_port))
    c = Conn(s, 10)
    c.send(b"GET / HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n")
    assert c.read_head().status == 502  # nothing serves the agent's ingress socket
    c.close()


def test_every_metric_and_label_used_is_exported_by_a_real_sam_box(sam_box, topo):
    ingress_port = netns_free_port(topo.box)
    box = sam_box(
        bundle=bundle_yaml(allow=["api.example.com"], serves=("code-reviewer", 8080)),
        args=["--insecure-unverified-bundle",
              "--agent-ingress-socket", str(pathlib.Path(topo.tmp) / "no-agent-here.sock"),
              "--ingress-listen", f"127.0.0.1:{ingress_port}"])
    _drive_every_family(box, topo, ingress_port)
    metrics = boxlib.wait_for(
        lambda: (m := box.metrics()) and m.sum("sam_box_ingress_requests_total") >= 1 and m,
        what="the ingress request to be counted")
    exported = metrics.names()
    labels_of = {}
    for (name, labels) in metrics.samples:
        labels_of.setdefault(name, set()).update(k for k, _ in labels)

    used = {}  # metric name -> where
    dash = dashboard()
    for where, expr in dashboard_queries(dash):
        sels, bys = selectors(parsed(expr))
        for _, name, matchers in sels:
            used.setdefault(name, where)
            if name in PROMETHEUS_SERIES or name not in exported:
                continue  # (a name sam-box does not export is reported below)
            for label, _, _ in matchers:
                assert label in labels_of.get(name, set()) | SCRAPE_LABELS, (
                    f"{where}: label {label!r} is not on {name} "
                    f"(it has {sorted(labels_of.get(name, ()))})")
        for inner, by in bys:
            inner_names = {s[1] for s in selectors(inner)[0]}
            have = set().union(*(labels_of.get(n, set()) for n in inner_names))
            if not inner_names <= exported:
                continue
            for label in by:
                assert label in have | SCRAPE_LABELS, (
                    f"{where}: sum by ({label}) but {sorted(inner_names)} have "
                    f"only {sorted(have)}")
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            for name in re.findall(r"label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)",
                                   v["definition"]):
                used.setdefault(name, f"variable {v['name']}")
    for path in (SCRAPE, ALERTS):
        for name in re.findall(r"\bsam_box_[a-z_]+", path.read_text()):
            used.setdefault(name, path.name)

    assert any(n.startswith("sam_box_") for n in used)
    for name, where in sorted(used.items()):
        if name in PROMETHEUS_SERIES:
            continue
        assert name in exported, (f"{where} uses {name}, which a real sam-box does not export "
                                  f"after traffic; it exports {sorted(exported)}")
    # And every family sam-box exports is on the dashboard.
    missing = exported - set(used)
    assert not missing, f"sam-box exports {sorted(missing)}, which no dashboard panel shows"


def _png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24]), len(data)


def test_renderer_draws_the_dashboard_from_a_real_scrape(topo, tmp_path):
    boxlib.require_binary()
    out = tmp_path / "dashboard.png"
    r = subprocess.run([sys.executable, str(RENDERER), "--sam-box",
                        str(boxlib.SAM_BOX_RUN or boxlib.SAM_BOX), "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"render-dashboard failed:\n{r.stdout}\n{r.stderr}"
    (width, height), size = _png_size(out)
    assert width >= 1000 and height >= 700, (width, height)
    assert size > 30_000, f"PNG of {size} bytes: suspiciously empty"
    assert "scrapes over" in r.stdout
