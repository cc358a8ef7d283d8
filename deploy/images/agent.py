#!/usr/bin/env python3
"""A demo harness for deploy/kubernetes: what an agent sees from inside its sandbox.

Run as nano-init's child (the pod's agent command). Prints one JSON object per line on stdout:

    {"sockets": [...]}               what it sees of /var/run/sam (agent.sock, never node.sock)
    {"check": {"rc", "out"}}        `nano-init check`: "sandboxed" or "not sandboxed: …"
    {"links": [...]}                the interfaces of its network namespace (`ip -o link show`)
    {"models": {"status", "body"}}  GET http://mesh.sam.alt/v1/models, answered by sam-node
    {"chat": {"status", "body"}}    one chat completion through the mesh (if AGENT_CHAT is set)
    {"fetch": {"url", "status"|"error", "body"}}   each URL in AGENT_FETCH (space-separated)

then `{"done": true}`, and waits for SIGTERM (so that `kubectl exec` has something to enter).
Plain urllib with a placeholder key: nothing SAM-specific, no credential, no proxy variable.
"""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

MESH = "http://mesh.sam.alt"
SOCKET_DIR = "/var/run/sam"


def emit(**item):
    print(json.dumps(item), flush=True)


def http(url, body=None, timeout=15):
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": "Bearer unused",
                                          "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return {"status": r.status, "body": r.read(4096).decode(errors="replace")}
    except urllib.error.HTTPError as e:
        return {"status": e.code, "body": e.read(4096).decode(errors="replace")}
    except Exception as e:  # a refused connection is what a denied name looks like
        return {"error": f"{type(e).__name__}: {e}"}


def main():
    # sam-box starts beside this container: wait (30 s at most) for its socket.
    for _ in range(300):
        if os.path.exists(SOCKET_DIR + "/agent.sock"):
            break
        time.sleep(0.1)
    emit(sockets=sorted(os.listdir(SOCKET_DIR)))
    r = subprocess.run(["nano-init", "check"], capture_output=True, text=True, timeout=30)
    emit(check={"rc": r.returncode, "out": (r.stdout + r.stderr).strip()})
    r = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=10)
    emit(links=[line.split(":")[1].strip().split("@")[0] for line in r.stdout.splitlines()])
    # sam-node starts beside it too, with no ordering between a pod's containers: until it
    # listens, sam-box refuses mesh.sam.alt (a refused connection) or answers 502. Retry for
    # 30 s at most, as a harness behind a sidecar should.
    deadline = time.monotonic() + 30
    models = http(f"{MESH}/v1/models")
    while (models.get("status", 502) == 502) and time.monotonic() < deadline:
        time.sleep(0.2)
        models = http(f"{MESH}/v1/models")
    emit(models=models)
    if os.environ.get("AGENT_CHAT"):
        emit(chat=http(f"{MESH}/v1/chat/completions",
                       {"model": os.environ["AGENT_CHAT"],
                        "messages": [{"role": "user", "content": "hello from the pod"}]}))
    for url in os.environ.get("AGENT_FETCH", "").split():
        emit(fetch={"url": url, **http(url)})
    emit(done=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        signal.pause()


if __name__ == "__main__":
    main()
