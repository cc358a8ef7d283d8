"""The flow cap holds: the 4097th concurrent tunnel is refused 503 too-many-flows, counted, and
the box keeps serving once flows end. Needs ~4,100 descriptors in this process and ~4,100 in
sam-box (which raises its own RLIMIT_NOFILE at start)."""

import resource

from boxlib import STD_ALLOW, bundle_yaml, wait_for

FLOW_CAP = 4096  # sam-box/limits.h kMaxConcurrentFlows


def test_flow_cap_refuses_the_next_flow_and_recovers(sam_box):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = FLOW_CAP + 512
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= want, "cannot raise RLIMIT_NOFILE"

    box = sam_box(bundle=bundle_yaml(allow=STD_ALLOW), args=["--insecure-unverified-bundle"])
    held = []
    try:
        # A connection counts as a flow from accept on, head or not: open the cap's worth.
        for _ in range(FLOW_CAP):
            held.append(box.connect(timeout=30))
        # Accepts are asynchronous: wait until the box has taken them all.
        wait_for(lambda: box.alive and len(held) == FLOW_CAP, what="connections opened")
        resp = None

        def refused_once():
            nonlocal resp
            c = box.connect(timeout=30)
            c.send(b"CONNECT api.example.com:80 HTTP/1.1\r\nHost: api.example.com:80\r\n\r\n")
            r = c.read_head()
            c.close()
            if r.status == 503:
                resp = r
                return True
            return False

        wait_for(refused_once, timeout=30, what="a 503 at the cap")
        assert resp.header("Boundary-Reason") == "too-many-flows"
        assert box.metrics().get("sam_box_limit_hits_total", limit="max-concurrent-flows") >= 1
        assert box.metrics().get("sam_box_refusals_total", reason="too-many-flows") >= 1
    finally:
        for c in held:
            c.close()
    # The cap frees as flows end: an ordinary tunnel works again.
    def tunnel_ok():
        r, c = box.tunnel("api.example.com:80", timeout=30)
        c.close()
        return r.status == 200

    wait_for(tunnel_ok, timeout=30, what="a tunnel after the cap freed")
    assert box.alive
