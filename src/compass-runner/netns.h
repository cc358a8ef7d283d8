#pragma once
// The agent's network namespace for egress `boundary` (DESIGN.md "Two egress mechanisms",
// "Known facts"): /run/netns/compass-<id> holding only lo and tun0, tun0 with the sandbox's
// addresses and both default routes through it. The runner builds it so the container never
// needs CAP_NET_ADMIN or /dev/net/tun: tun0 is created by a thread that setns()es into the
// namespace, and its descriptor is handed to podman (--preserve-fds 1, fd 3 in the
// container), which nano-init adopts (src/nano-init/tun.h).

#include <chrono>
#include <string>
#include <vector>

#include "common/unique_fd.h"

namespace runner::netns {

/// Where named network namespaces live (ip-netns(8)).
inline constexpr const char* kDir = "/run/netns";

/// "compass-<id>": the netns (and container) name of agent `id`.
std::string nameFor(const std::string& id);
/// kDir + "/" + name.
std::string pathOf(const std::string& name);

/// Creates /run/netns/<name> as `ip netns add` does (ip-netns(8)), in-process: kDir made a
/// shared mount point, the file created O_EXCL, and a thread's unshare(CLONE_NEWNET)
/// namespace bind-mounted on it. Throws RunnerError naming the failing call and errno if it
/// exists already or cannot be made (the file is removed again).
void create(const std::string& name);

/// Opens /dev/net/tun as "tun0" (IFF_TUN | IFF_NO_PI, the flags nano-init checks when it
/// adopts fd 3) from a thread that has setns()'d into /run/netns/<name>, so the device lives
/// there. The device exists as long as the returned descriptor (O_CLOEXEC) is open. Throws
/// RunnerError naming the failing call and errno.
common::UniqueFd openTun(const std::string& name);

/// In /run/netns/<name>: lo up; tun0 MTU vdns::kTunMtu, up; 100.64.0.1/10 and 100::1/64 on tun0
/// (src/vdns/virtual_dns.h; no DAD: tun0 is IFF_NOARP); IPv4 and IPv6 default routes via
/// tun0. Interface and route ioctls (netdevice(7), route(8)'s SIOCADDRT) from a thread in the
/// namespace, no subprocess. Needs tun0 open (openTun). Throws RunnerError naming the
/// failing call and errno.
void configureTun(const std::string& name);

/// Waits until interface `dev` is operationally up (IFF_RUNNING, netdevice(7)): the kernel's
/// link watch has seen its carrier and given it a queueing discipline that passes packets.
/// Until then a packet sent on it is dropped, and a dropped ARP or neighbour solicitation is
/// only sent again a second later (arp(7) retrans_time_ms). `dev` is looked up in
/// /run/netns/<name>, or in the runner's own netns when `name` is empty. Polls SIOCGIFFLAGS
/// every 0.2 ms for at most `timeout` (ms). Returns true once it is up, false on timeout.
/// Throws RunnerError naming the failing call and errno (no such device, no such netns).
bool awaitRunning(const std::string& name, const std::string& dev,
                  std::chrono::milliseconds timeout);

/// Deletes /run/netns/<name> (`ip netns del`). Idempotent: a missing namespace is not an
/// error; returns false (and never throws) only if it exists and could not be removed.
bool remove(const std::string& name) noexcept;

/// True if /run/netns/<name> exists.
bool exists(const std::string& name);

/// The ids of every /run/netns/compass-<id> (for gc).
std::vector<std::string> listAgentIds();

}  // namespace runner::netns
