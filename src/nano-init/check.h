#pragma once
// `nano-init check`: is the calling process inside a nano-init sandbox? (seed 003, "Kubernetes
// pod": "The harness must be a child process of nano-init … A container that starts the harness
// directly, or that runs nano-init next to it, leaves the harness in the pod's network
// namespace, with eth0 and every route. It will run, and it will not be sandboxed.")
//
// Run by the harness (or by `kubectl exec -c agent …`, which enters nano-init's namespaces),
// it answers "sandboxed" (exit 0) or "not sandboxed: <reason>; <reason>…" (exit 1). The rules,
// in order; every failing one is named:
//   1. interfaces: this network namespace holds only lo and tun0, and tun0 is there;
//   2. IPv4 routes: a default route via tun0 and none via any other interface
//      (/proc/net/route; reject routes do not count);
//   3. IPv6 routes: the same in /proc/net/ipv6_route (skipped if the kernel has no IPv6);
//   4. resolv.conf: /etc/resolv.conf names exactly one nameserver, 100.127.255.253;
//   5. capabilities: CAP_NET_ADMIN and CAP_SYS_ADMIN (what it takes to re-route or leave the
//      network namespace) are in none of the effective, permitted and ambient sets, nor in the
//      bounding set unless no_new_privs is set (/proc/self/status);
//   6. only if 1-5 hold, so the packet can go nowhere but tun0: the virtual DNS answers an A
//      query for kProbeName with an address in 100.64.0.0/10 within 2 s. This proves that
//      nano-init is behind tun0, not just a tun0 that someone else made.
// Nothing is sent anywhere unless 1-5 hold. Rules 1-5 are a pure function (evaluate) so that
// tests can feed them any observation.

#include <optional>
#include <string>
#include <vector>

namespace nanoinit::check {

/// The name the DNS probe asks for (RFC 6761 .invalid: harmless should it ever leave).
inline constexpr const char* kProbeName = "nano-init-check.invalid";

/// What the process sees; nullopt = the file could not be read.
struct Observation {
  std::vector<std::string> interfaces;     ///< names in this network namespace
  std::optional<std::string> route4;       ///< /proc/net/route
  std::optional<std::string> route6;       ///< /proc/net/ipv6_route (nullopt: no IPv6)
  bool ipv6_present = true;                ///< false when /proc/net/ipv6_route does not exist
  std::optional<std::string> resolv_conf;  ///< /etc/resolv.conf
  std::optional<std::string> status;       ///< /proc/self/status
};

/// Rules 1-5 above: every reason the observation is not a sandbox, in rule order, each a short
/// sentence naming what was seen (e.g. "this network namespace also holds eth0"). Empty = the
/// static rules hold.
std::vector<std::string> evaluate(const Observation& seen);

/// Reads the observation of the calling process (if_nameindex(3), /proc, /etc/resolv.conf).
Observation observe();

/// Rule 6: asks 100.127.255.253:53 (UDP) for kProbeName, type A, twice at most (1 s each).
/// Returns an empty string if the answer holds an address in 100.64.0.0/10, else the reason.
std::string probeVirtualDns();

/// The whole check: prints "sandboxed: …" to stdout and returns 0, or prints
/// "not sandboxed: <reasons>" to stdout and returns 1.
int run();

}  // namespace nanoinit::check
