"""The probes an agent runs from inside its sandbox: Python source that the agent's
`python3 -c` script starts with, shared by the podman tier's tests (test_runner_podman.py)
and the microvm tier's (test_runner_microvm.py, test_runner_microvm_firewall.py, through
microvm_lib.PROBE_HELPERS).

    run(*cmd)                  a command's status and output: {"rc", "out", "err"}
    tcp(host, port[, family])  connect, then read a banner: {"ok": True, "data"}, or
                               {"ok": False, "error": "ExceptionName: message"}
    boundary_egress(secs)      the boundary's egress as the agent sees it (a dict of the
                               above), against the test hosts of runner_hosts.py: curl by
                               name (`secs` is its -m) and by address, DNS to the outside
                               resolver and to the virtual one, TCP to :53 and :853, the
                               attempts to change the network, and the links and routes

Each tier passes its own timeouts to helpers(): a TCG guest is several times slower than a
container.
"""


def helpers(run_secs, connect_secs, recv_secs):
    """The source defining run(), tcp() and boundary_egress(): run() waits `run_secs` for a
    command, tcp() `connect_secs` for the connection and `recv_secs` for its first bytes."""
    return (f"\nRUN_SECS, CONNECT_SECS, RECV_SECS = {run_secs}, {connect_secs}, {recv_secs}"
            + _SOURCE)


_SOURCE = r'''
import json, os, socket, subprocess, sys
def run(*cmd):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_SECS)
    return {"rc": r.returncode, "out": r.stdout, "err": r.stderr}
def tcp(host, port, family=socket.AF_INET):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(CONNECT_SECS)
    try:
        s.connect((host, port))
        s.settimeout(RECV_SECS)
        try:
            data = s.recv(100).decode(errors="replace")
        except OSError as e:
            data = "recv: " + repr(e)
        return {"ok": True, "data": data}
    except OSError as e:
        return {"ok": False, "error": type(e).__name__ + ": " + str(e)}
    finally:
        s.close()
def boundary_egress(secs):
    m = str(secs)
    return {
      "curl4_allowed": run("curl", "-4", "-sS", "-m", m, "http://allowed.example/"),
      "curl6_allowed": run("curl", "-6", "-sS", "-m", m, "http://allowed.example/"),
      "curl_denied": run("curl", "-sS", "-m", m, "http://denied.example/"),
      "curl6_denied": run("curl", "-6", "-sS", "-m", m, "http://denied.example/"),
      "curl_raw_ip": run("curl", "-sS", "-m", "10", "http://198.18.5.2/"),
      "curl_raw_ip6": run("curl", "-g", "-sS", "-m", "10", "http://[2001:db8:5::2]/"),
      "dig_outside": run("dig", "@198.18.5.2", "allowed.example", "+time=2", "+tries=1"),
      "dig_outside_tcp": run("dig", "+tcp", "@198.18.5.2", "allowed.example", "+time=2",
                             "+tries=1"),
      "dig_virtual": run("dig", "+short", "allowed.example"),
      "tcp_ip_53": tcp("198.18.5.2", 53),
      "tcp_ip_853": tcp("198.18.5.2", 853),
      "tcp_ip6_853": tcp("2001:db8:5::2", 853, socket.AF_INET6),
      "tcp_name_53": tcp("allowed.example", 53),
      "tcp_name_853": tcp("allowed.example", 853),
      "nft_flush": run("nft", "flush", "ruleset"),
      "ip_link_add": run("ip", "link", "add", "dummy0", "type", "dummy"),
      "ip_addr_add": run("ip", "addr", "add", "10.9.9.9/32", "dev", "lo"),
      "links": run("ip", "-o", "link", "show"),
      "routes": run("ip", "route", "show"),
    }
'''
