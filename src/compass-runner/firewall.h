#pragma once
// Egress `firewall` (seeds 000/002; DESIGN.md "nftables in a netns"): a veth from the agent's
// netns to the host with NAT, a per-agent DNS forwarder on the host end that answers only
// allowed names, and the default-deny `inet` ruleset armed in the netns before the agent
// starts. The netns itself (its creation and removal) belongs to the caller.

#include <memory>
#include <string>
#include <vector>

namespace runner::firewall {

/// Everything one agent's firewall holds; destroying it (or teardown()) removes the veth,
/// the host NAT rules, the forwarder and the netns's ruleset. Not copyable.
class Egress {
 public:
  virtual ~Egress() = default;
  /// The sandbox's resolver on IPv4 ("10.231.x.y", the veth's host end): give it to the
  /// container (`podman --dns`).
  [[nodiscard]] virtual std::string resolverAddress() const = 0;
  /// The same resolver on IPv6 ("fd5a:7c3e:91b4:n::1"); a second `--dns` is optional, the
  /// ruleset allows DNS to both.
  [[nodiscard]] virtual std::string resolverAddress6() const = 0;
  /// The host-side veth name (for the roster and gc).
  [[nodiscard]] virtual std::string hostVeth() const = 0;
  /// Removes everything arm() made. Idempotent; never throws.
  virtual void teardown() noexcept = 0;
};

/// Arms egress for agent `id` in the netns `netns_name` (/run/netns/<name>, already created,
/// holding only lo): veth pair (host `cv<id>`, sandbox `eth0`) with IPv4 and IPv6 addresses
/// and default routes, host forwarding + masquerade, the DNS forwarder, then the ruleset with
/// `allow` (names as in --egress-allow / bundle egress.allow; `host` or `host:port`, `*.x`)
/// pre-resolved into its sets. The steps, in order (docs/compass-runner.md "Egress firewall"):
/// subnet, veth, sandbox link, forwarding, host nat, dns forwarder, ruleset, pre-resolve,
/// verify. `id` must be 1..12 characters of [a-z0-9]. Throws RunnerError("egress firewall:
/// <step>: <reason>"); on throw nothing is left. Call teardown() only once the agent's
/// processes are gone (the veth goes first, so no path out remains while the ruleset goes).
std::unique_ptr<Egress> arm(const std::string& id, const std::string& netns_name,
                            const std::vector<std::string>& allow);

/// For gc: removes the host-side state (veth, NAT rules) a dead runner left for `id`.
/// Idempotent; never throws.
void reap(const std::string& id) noexcept;

}  // namespace runner::firewall
