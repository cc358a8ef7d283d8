#pragma once
// The host half of egress `firewall` (issue 4): a subnet per agent, the veth pair from the
// host into the agent's netns, forwarding and the host NAT table. Each function is one named
// step of firewall::arm() and has an exact inverse. Links, addresses and routes are made over
// rtnetlink (rtnl.h); `nft` and the microVM bridge's `ip` run through process.h, in-netns ones
// with netns_path.

#include <string>

#include "common/unique_fd.h"
#include "compass-runner/ruleset.h"

namespace runner::firewall {

/// "cv<id>": the host end of agent `id`'s veth (<= 15 bytes for ids of <= 13 bytes).
std::string hostVethName(const std::string& id);

/// Throws RunnerError unless `id` is 1..12 characters of [a-z0-9] (so `cv<id>` fits IFNAMSIZ
/// and `compass_nat_<id>` is an nft identifier).
void checkId(const std::string& id);

/// Held while a slot is chosen and its addresses are put on the host end: slots are told
/// apart by the addresses live veths carry, so two runners must not pick at the same time.
/// An flock(2) on /run/compass-runner/firewall.lock (directory made 0700 if missing).
class SlotLock {
 public:
  /// Blocks until the lock is held. Throws RunnerError if the lock file cannot be opened.
  SlotLock();

 private:
  common::UniqueFd fd_;  // closing it releases the lock
};

/// Picks the lowest free slot (ruleset.h) under a held SlotLock: free = no address of the
/// slot's /30 or /64 on any host interface (getifaddrs(3)). Throws RunnerError if the host
/// uses the pools on an interface that is not ours (`cv…`), or if every slot is taken.
Addressing allocateSubnet(const SlotLock& held);

/// `ip link add cv<id> type veth peer name eth0 netns <netns_name>`; host end addressed
/// (IPv4, IPv6 with nodad so it is usable at once) and up, over rtnetlink. Throws
/// RunnerError naming the request and the kernel's errno.
void createVeth(const std::string& id, const std::string& netns_name, const Addressing& net);

/// In the netns: lo and eth0 up, eth0's IPv4 and IPv6 (nodad) addresses, default routes of
/// both families via the host end, over rtnetlink from a socket made in the netns. Throws
/// RunnerError naming the request and the kernel's errno.
void configureSandboxLink(const std::string& netns_path, const Addressing& net);

/// For a microVM guest (firewall::armForGuest()): in the netns, a bridge `br0` holding eth0 and a
/// new persistent tap device `tap` (for QEMU's `-netdev tap,ifname=TAP`), all up, with no
/// address at all (IPv6 address generation off: not even a link-local one); lo stays down.
/// Throws RunnerError with ip's message. The netns's removal removes all three.
void bridgeToTap(const std::string& netns_path, const std::string& tap);

/// net.ipv4.ip_forward=1 and net.ipv6.conf.all.forwarding=1 (left on at teardown: other
/// agents and podman rely on them). Enabling IPv6 forwarding makes the kernel ignore router
/// advertisements on the host (accept_ra=1 counts only for non-routers): documented in
/// docs/compass-runner.md. Throws RunnerError naming the sysctl file.
void enableForwarding();

/// Loads hostNatRuleset() (`nft -f -`; `mirror` as there). Throws RunnerError with nft's
/// message.
void installHostNat(const std::string& id, const Addressing& net, bool mirror = false);

/// Deletes `table inet compass_nat_<id>`; false if it was there and could not be removed.
/// Never throws.
bool removeHostNat(const std::string& id) noexcept;

/// Deletes cv<id> (and so its peer in the netns); false if it was there and could not be
/// removed. Never throws.
bool removeVeth(const std::string& id) noexcept;

}  // namespace runner::firewall
