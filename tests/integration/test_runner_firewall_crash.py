"""Egress `firewall` after its runner is killed (the crash window before `compass-runner gc`).

In a module of its own: the test binds port 53 on the host's wildcard addresses, which the
live forwarders of test_runner_firewall.py's module-scoped sandboxes would prevent. Same
driver and fixtures (firewall_driver: firewall::arm(), then waits).
"""

import signal
import socket
import time

import pytest

import runner_hosts as rh
from runner_hosts import runner_hosts  # noqa: F401 (a fixture)
from test_runner_firewall import driver, make_sandbox, sh, tmp  # noqa: F401 (fixtures)


def test_a_killed_runners_agent_reaches_no_host_service_on_port_53(make_sandbox, driver):
    """Once the runner (here its driver) is killed, its forwarder is gone but the agent, the
    veth and the host table stay until gc: a host service on 0.0.0.0:53 or [::]:53 (a local
    dnsmasq) must still not receive the sandbox's packets (`socket wildcard 0`)."""
    sb = make_sandbox([rh.ALLOWED])
    resolvers = [(socket.AF_INET, sb.info["resolver4"]), (socket.AF_INET6, sb.info["resolver6"])]
    sb.proc.send_signal(signal.SIGKILL)
    sb.proc.wait()
    listeners = []
    try:
        for family, wildcard in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
            for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):
                s = socket.socket(family, kind)
                # Other sandboxes' forwarders hold <their resolver>:53; SO_REUSEADDR lets a
                # wildcard bind beside those that allow it (TCP), the rest are left out.
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                try:
                    s.bind((wildcard, 53))
                except OSError:
                    s.close()
                    continue
                if kind == socket.SOCK_STREAM:
                    s.listen()
                s.setblocking(False)
                listeners.append(s)
        if not listeners:
            pytest.skip("port 53 on the wildcard addresses is taken on this host")
        probe = ("import socket\n"
                 f"for fam, addr in {[(int(f), a) for f, a in resolvers]!r}:\n"
                 "    u = socket.socket(fam, socket.SOCK_DGRAM)\n"
                 "    u.sendto(b'after-crash', (addr, 53))\n"
                 "    t = socket.socket(fam, socket.SOCK_STREAM)\n"
                 "    t.settimeout(1)\n"
                 "    try:\n"
                 "        t.connect((addr, 53))\n"
                 "        print('connected', addr)\n"
                 "    except OSError as e:\n"
                 "        print('refused', addr, e)\n")
        r = sb.run("/usr/bin/python3", "-c", probe)
        assert r.returncode == 0, r.stderr
        assert "connected" not in r.stdout, r.stdout
        time.sleep(0.5)
        got = []
        for s in listeners:
            try:
                got.append(s.recvfrom(2048) if s.type == socket.SOCK_DGRAM else s.accept())
            except BlockingIOError:
                pass
        assert got == [], got
    finally:
        for s in listeners:
            s.close()
        sh(str(driver), "--reap", sb.id)

