#pragma once
// Egress `firewall` (seeds 000/002; DESIGN.md "nftables in a netns"): a veth from the agent's
// netns to the host with NAT, a per-agent DNS forwarder on the host end that answers only
// allowed names, and the default-deny `inet` ruleset armed in the netns before the agent
// starts. The netns itself (its creation and removal) belongs to the caller.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "compass-runner/ruleset.h"

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
  /// The agent's slot and its addresses (ruleset.h); armForGuest() callers give the sandbox
  /// ends and the resolver to the guest.
  [[nodiscard]] virtual const Addressing& addressing() const = 0;
  /// Removes everything arm() made. Idempotent; never throws.
  virtual void teardown() noexcept = 0;
};

/// Asked between steps of a long arming: non-zero (a signal number) if the runner was asked to
/// stop (AgentSpec::stop_signal). May be empty (never stop).
using StopSignalFn = std::function<int()>;

/// Arms egress for agent `id` in the netns `netns_name` (/run/netns/<name>, already created,
/// holding only lo): veth pair (host `cv<id>`, sandbox `eth0`) with IPv4 and IPv6 addresses
/// and default routes, host forwarding + masquerade, the DNS forwarder, then the ruleset with
/// `allow` (names as in --egress-allow / bundle egress.allow; `host` or `host:port`, `*.x`)
/// pre-resolved into its sets. The steps, in order (docs/compass-runner.md "Egress firewall"):
/// subnet, veth, sandbox link, forwarding, host nat, dns forwarder, ruleset, pre-resolve,
/// verify. `id` must be 1..12 characters of [a-z0-9]. Throws RunnerError("egress firewall:
/// <step>: <reason>"); on throw nothing is left. Call teardown() only once the agent's
/// processes are gone (the veth goes first, so no path out remains while the ruleset goes).
/// `on_addressed`, when given, is called once on the calling thread as soon as the slot is
/// chosen, before anything is made, with the final addresses (its host4/host6 are the
/// resolver): a caller arming on another thread can start the container meanwhile, holding
/// the agent back until arm() returns. It must not throw; it is not called if arm() fails
/// before the slot is chosen. `stop_signal` is asked before each allowed name is pre-resolved:
/// non-zero tears down what was made and throws StoppedBeforeStart (backend.h) with it.
std::unique_ptr<Egress> arm(const std::string& id, const std::string& netns_name,
                            const std::vector<std::string>& allow,
                            StopSignalFn stop_signal = nullptr,
                            const std::function<void(const Addressing&)>& on_addressed = nullptr);

/// Applies one batch of `add element` commands (addElementsBatch(), one command per line) to
/// wherever the sandbox's ruleset lives; returns true once the elements are in its sets. Called
/// from the DNS forwarder's worker threads, one batch at a time per agent.
using ApplyFn = std::function<bool(const std::string& batch)>;

/// Egress `firewall` for a microVM guest (issue 5): the same subnet, veth (host `cv<id>`,
/// sandbox end `eth0` in the netns), host table and DNS forwarder as arm(), but the netns
/// `netns_name` (already created, holding only lo) gets no address, route or ruleset: a
/// bridge `br0` joins its eth0 to a new tap device `tap` (1..15 bytes of [a-z0-9], for QEMU's
/// `-netdev tap,ifname=`), so the guest's NIC sits on the sandbox's /30 and /64. The guest
/// carries the sandbox addresses of addressing() and arms sandboxRuleset() itself before its
/// agent runs (seed 002: "armed in-guest by the backend"); the forwarder hands each new batch of
/// elements it opens to `apply` (required), which must reach the guest's sets. The host table
/// mirrors the allow sets (hostNatRuleset() `mirror`), filled before `apply` is called, so a
/// guest whose own ruleset is gone still reaches only what the allowlist opened. Steps, in order:
/// subnet, veth, bridge, forwarding, host nat, dns forwarder, pre-resolve. Pre-resolve answers
/// each allowed name (A and AAAA) through the forwarder's own answer path, as the podman tier's
/// queries from the netns are answered, so `apply` is first called (from this thread) before
/// the guest exists: the caller collects those batches into the ruleset the guest loads. Throws
/// RunnerError("egress firewall: <step>: <reason>"), or StoppedBeforeStart when `stop_signal`
/// (as for arm()) turns non-zero during pre-resolve; on throw nothing is left.
std::unique_ptr<Egress> armForGuest(const std::string& id, const std::string& netns_name,
                                    const std::vector<std::string>& allow, const std::string& tap,
                                    ApplyFn apply, StopSignalFn stop_signal = nullptr);

/// For gc: removes the host-side state (veth, NAT rules) a dead runner left for `id`.
/// Idempotent; never throws.
void reap(const std::string& id) noexcept;

}  // namespace runner::firewall
