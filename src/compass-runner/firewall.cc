// Egress `firewall` (seeds 000/002): arm() is one ordered list of named steps, each with its
// inverse registered before it runs, so a failure anywhere unwinds exactly what was made.
#include "compass-runner/firewall.h"

#include <ifaddrs.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <vector>

#include "common/log.h"
#include "compass-runner/admitter.h"
#include "compass-runner/backend.h"
#include "compass-runner/dns_forwarder.h"
#include "compass-runner/netns.h"
#include "compass-runner/process.h"
#include "compass-runner/ruleset.h"
#include "compass-runner/veth.h"
#include "policy/address.h"

namespace runner::firewall {
namespace {

constexpr std::chrono::seconds kNftTimeout{10};
constexpr std::chrono::seconds kPreResolveTimeout{5};
// Allowed names pre-resolved at once: their 2 queries each stay within the forwarder's
// kMaxLookups (8; a look-up gives its slot back before its answer is sent, so the next group
// finds them free). More would get a false SERVFAIL, which refuses the start.
constexpr size_t kPreResolveNamesAtOnce = 4;
// How long the arming waits for the veth's two ends to be operationally up (awaitLinkUp()).
constexpr std::chrono::milliseconds kLinkUpTimeout{2000};
constexpr uint16_t kTypeA = 1;
constexpr uint16_t kTypeAaaa = 28;
constexpr uint8_t kRcodeNoError = 0;
constexpr uint8_t kRcodeNxDomain = 3;

std::string netnsPath(const std::string& name) { return "/run/netns/" + name; }

// The host's own addresses, never answered: an allowed name that resolves to one would reach
// services bound on the host. Re-read at most once a second; unreadable = everything is local.
class HostAddresses {
 public:
  bool contains(const asio::ip::address& raw) {
    std::lock_guard lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    if (now - read_at_ >= std::chrono::seconds(1)) refresh(now);
    if (!readable_) return true;
    return addresses_.contains(policy::canonicalAddress(raw));
  }

 private:
  void refresh(std::chrono::steady_clock::time_point now) {
    read_at_ = now;
    addresses_.clear();
    ifaddrs* list = nullptr;
    readable_ = ::getifaddrs(&list) == 0;
    if (!readable_) return;
    for (const ifaddrs* ifa = list; ifa != nullptr; ifa = ifa->ifa_next) {
      if (ifa->ifa_addr == nullptr) continue;
      if (ifa->ifa_addr->sa_family == AF_INET) {
        asio::ip::address_v4::bytes_type b{};
        std::memcpy(b.data(), &reinterpret_cast<const sockaddr_in*>(ifa->ifa_addr)->sin_addr, 4);
        addresses_.insert(asio::ip::address_v4(b));
      } else if (ifa->ifa_addr->sa_family == AF_INET6) {
        asio::ip::address_v6::bytes_type b{};
        std::memcpy(b.data(), &reinterpret_cast<const sockaddr_in6*>(ifa->ifa_addr)->sin6_addr, 16);
        addresses_.insert(policy::canonicalAddress(asio::ip::address_v6(b)));
      }
    }
    ::freeifaddrs(list);
  }

  std::mutex mu_;
  std::set<asio::ip::address> addresses_;
  bool readable_ = false;
  std::chrono::steady_clock::time_point read_at_{};
};

// `nft -f -` of `batch` in the netns at `ns_path` (empty: the host's); its error is logged.
bool runNft(const std::string& id, const std::string& batch, const std::string& ns_path) {
  const CommandResult r = runCommand({"nft", "-f", "-"}, batch, kNftTimeout, ns_path);
  if (r.status != 0) {
    common::log::error("egress firewall: nft add element failed",
                       {{"agent", id},
                        {"where", ns_path.empty() ? "host" : ns_path},
                        {"status", r.status},
                        {"stderr", r.err.substr(0, 512)}});
  }
  return r.status == 0;
}

class FirewallEgress final : public Egress {
 public:
  FirewallEgress(std::string id, std::string netns_name, StopSignalFn stop_signal,
                 std::function<void(const Addressing&)> on_addressed = nullptr)
      : id_(std::move(id)),
        netns_name_(std::move(netns_name)),
        stop_signal_(std::move(stop_signal)),
        on_addressed_(std::move(on_addressed)) {}
  ~FirewallEgress() override { teardown(); }

  [[nodiscard]] std::string resolverAddress() const override { return net_.host4; }
  [[nodiscard]] std::string resolverAddress6() const override { return net_.host6; }
  [[nodiscard]] std::string hostVeth() const override { return hostVethName(id_); }
  [[nodiscard]] const Addressing& addressing() const override { return net_; }

  void teardown() noexcept override {
    // Newest first: the forwarder stops admitting, then the veth (and with it the only way out
    // of the netns) goes before anything that filters it.
    while (!undo_.empty()) {
      auto [what, fn] = std::move(undo_.back());
      undo_.pop_back();
      try {
        if (!fn()) {
          common::log::error("egress firewall: teardown step failed",
                             {{"agent", id_}, {"step", what}});
        }
      } catch (const std::exception& e) {
        common::log::error("egress firewall: teardown step failed",
                           {{"agent", id_}, {"step", what}, {"error", e.what()}});
      }
    }
  }

  // Runs one named step; `undo` is registered first, so a half-done step is undone too.
  void step(const std::string& name, const std::function<void()>& fn,
            std::function<bool()> undo = nullptr) {
    if (undo) undo_.emplace_back(name, std::move(undo));
    named(name, fn);
  }

  // Runs `fn`; a failure becomes RunnerError("egress firewall: <name>: <reason>"), the name
  // said once even when the reason already begins with it (stepMessage()).
  static void named(const std::string& name, const std::function<void()>& fn) {
    try {
      fn();
    } catch (const StoppedBeforeStart&) {
      throw;  // not a failure of the step: the runner was asked to stop
    } catch (const std::exception& e) {
      throw RunnerError("egress firewall: " + stepMessage(name, e.what()));
    }
  }

  // The steps both sandboxes share: the slot, then at once (each an `ip` or `nft` process, so
  // the start waits for the slowest, not the sum) the host table (`mirror`: hostNatRuleset()),
  // the veth (under the slot lock) followed by `sandbox_step` (its sandbox end) and forwarding,
  // and `alongside` when given. Every undo is registered before any of them runs, so that
  // teardown (newest first) removes the veth, the only way out of the netns, before any table
  // that filters it; all are joined before the next step or before a failure unwinds, and the
  // first failure wins.
  void armLinks(bool mirror, const char* sandbox_step, const std::function<void()>& sandbox,
                const std::function<void()>& alongside = nullptr) {
    // Held until the slot's addresses are on the host end: they are what marks it taken.
    std::optional<SlotLock> lock;
    step("subnet", [&] {
      lock.emplace();
      net_ = allocateSubnet(*lock);
    });
    if (on_addressed_) on_addressed_(net_);
    undo_.emplace_back("host nat", [this] { return removeHostNat(id_); });
    undo_.emplace_back("veth", [this] { return removeVeth(id_); });
    std::vector<std::future<void>> chains;
    if (alongside) chains.push_back(std::async(std::launch::async, alongside));
    // The host table goes in before the forwarder binds the resolver addresses it guards.
    chains.push_back(std::async(std::launch::async, [&] {
      named("host nat", [&] { installHostNat(id_, net_, mirror); });
    }));
    std::exception_ptr failed;
    try {
      named("veth", [&] { createVeth(id_, netns_name_, net_); });
      lock.reset();
      named(sandbox_step, sandbox);
      named("forwarding", [] { enableForwarding(); });
    } catch (...) {
      failed = std::current_exception();
    }
    for (auto& f : chains) {
      try {
        f.get();  // waits, whatever happened above
      } catch (...) {
        if (!failed) failed = std::current_exception();
      }
    }
    if (failed) std::rethrow_exception(failed);
  }

  // The podman tier: the netns is the sandbox (addresses, routes, ruleset).
  void arm(const policy::Allowlist& allow) {
    const std::string ns_path = netnsPath(netns_name_);
    // Alongside the links: the netns ruleset, then `verify` of what the kernel holds. It needs
    // only the slot's addresses, so the netns is default-drop before its eth0 even comes up.
    // Nothing below edits its chains (the forwarder only adds set elements), so the verdict
    // stands. Its undo goes first, so teardown removes it after the veth.
    // The sandbox link (eth0 up, addresses, routes) waits for the verdict: eth0 is created
    // down, so until the ruleset is verified the netns has no way out even if something in it
    // is already running (podman starts the container while this arms).
    undo_.emplace_back("ruleset", [ns_path] { return removeSandboxTable(ns_path); });
    std::promise<void> verified;
    std::shared_future<void> verdict = verified.get_future().share();
    armLinks(
        /*mirror=*/false, "sandbox link",
        [&] {
          try {
            verdict.get();
          } catch (...) {
            return;  // eth0 stays down; the ruleset's chain reports its own failure
          }
          configureSandboxLink(ns_path, net_);
          awaitLinkUp();
        },
        [&] {
          try {
            // One nft run loads and reports: --echo prints what the kernel created, with the
            // handles it gave (nft(8) "-e", "-a"), which `verify` judges. A second run to list
            // the table cost a process start (12 ms of CPU on a slow box) beside podman's.
            // Not `-j`: nft 1.0.6 then reads stdin as JSON first and, that failing, parses
            // what is left of it (nothing): exit 0, nothing loaded.
            std::string echoed;
            named("ruleset", [&] {
              echoed = runChecked("nft", {"nft", "--echo", "--handle", "-f", "-"},
                                  sandboxRuleset(net_, {}), kNftTimeout, ns_path);
            });
            named("verify", [&] { verify(echoed); });
            verified.set_value();
          } catch (...) {
            verified.set_exception(std::current_exception());
            throw;
          }
        });
    startForwarder(allow, [id = id_, ns_path](const std::vector<AllowElement>& e) {
      return runNft(id, addElementsBatch(e), ns_path);
    });
    // Seed 000: "DNS is allowlisted first, then names are resolved from inside the sandbox":
    // the ruleset above holds the DNS rule, and each name's A (over IPv4) and AAAA (over IPv6)
    // query now goes from the netns through it to the forwarder, which opens what it answers.
    step("pre-resolve", [&] {
      preResolve(allow, [&](const std::string& name, uint16_t qtype, const std::string& server) {
        return queryFromNetns(ns_path, asio::ip::make_address(server), 53, name, qtype,
                              kPreResolveTimeout);
      });
    });
    logArmed();
  }

  // A microVM guest: the netns only bridges the veth to the guest's tap; the guest holds the
  // addresses and the ruleset, and `apply` reaches its sets.
  void armForGuest(const policy::Allowlist& allow, const std::string& tap, ApplyFn apply) {
    const std::string ns_path = netnsPath(netns_name_);
    armLinks(/*mirror=*/true, "bridge", [&] { bridgeToTap(ns_path, tap); });
    // The host's copy of the sets first: the guest's answer is what lets the reply go.
    startForwarder(allow, [id = id_, apply = std::move(apply)](const std::vector<AllowElement>& e) {
      if (!runNft(id, addElementsBatch(e, hostTableName(id)), "")) return false;
      if (apply(addElementsBatch(e))) return true;
      // The guest did not take them, so the answer will not leave: the host must not keep
      // them open either (they would count toward no cap).
      runNft(id, deleteElementsBatch(e, hostTableName(id)), "");
      return false;
    });
    // The guest cannot ask before it boots, so the names are answered here, by the forwarder's
    // own answer path (the same allowlist, resolver and filter as the guest's queries get):
    // `apply` then holds their elements before the guest's ruleset is written.
    step("pre-resolve", [&] {
      preResolve(allow, [this](const std::string& name, uint16_t qtype, const std::string&) {
        return parseReply(forwarder_->answerDirectly(buildQuery(0, name, qtype)));
      });
    });
    logArmed("egress firewall: host side ready (the guest arms its own ruleset)");
  }

 private:
  // Both ends of the veth operationally up before anything is sent over it (the pre-resolve
  // queries, then the agent). A packet sent before the kernel's link watch has run is
  // dropped, and a dropped neighbour solicitation is sent again only a second later: on this
  // host about 3 % of starts took a second longer that way. Past kLinkUpTimeout the start
  // goes on (slower then, not less contained: the ruleset is already verified) and says so.
  void awaitLinkUp() {
    const std::string host_end = hostVethName(id_);
    const bool host_up = netns::awaitRunning("", host_end, kLinkUpTimeout);
    const bool sandbox_up = netns::awaitRunning(netns_name_, "eth0", kLinkUpTimeout);
    if (host_up && sandbox_up) return;
    common::log::warn("egress firewall: the veth is not operationally up yet; going on",
                      {{"agent", id_},
                       {"veth", host_end},
                       {"host_end_up", host_up},
                       {"eth0_up", sandbox_up},
                       {"waited_ms", kLinkUpTimeout.count()}});
  }

  void startForwarder(const policy::Allowlist& allow, AddFn add) {
    step(
        "dns forwarder",
        [&] {
          auto admitter = std::make_shared<Admitter>(id_, std::move(add));
          auto local = std::make_shared<HostAddresses>();
          ForwarderConfig cfg;
          cfg.id = id_;
          cfg.allow = allow;
          cfg.listen = {asio::ip::make_address(net_.host4), asio::ip::make_address(net_.host6)};
          cfg.admit = [admitter](const std::vector<AllowElement>& e) { return admitter->admit(e); };
          cfg.local = [local](const asio::ip::address& a) { return local->contains(a); };
          forwarder_ = std::make_unique<DnsForwarder>(std::move(cfg));
          forwarder_->start();
        },
        [this] {
          if (forwarder_) forwarder_->stop();
          return true;
        });
  }

  // `what`: the podman tier's "egress firewall armed"; a guest's host side is only ready (the
  // guest arms its own ruleset and says so later).
  void logArmed(const char* what = "egress firewall armed") const {
    common::log::info(what, {{"agent", id_},
                             {"veth", hostVeth()},
                             {"resolver", net_.host4},
                             {"resolver6", net_.host6},
                             {"slot", net_.slot}});
  }

  static bool removeSandboxTable(const std::string& ns_path) {
    if (!std::filesystem::exists(ns_path)) return true;
    const auto table = std::string(kEgressTable);
    if (runCommand({"nft", "delete", "table", "inet", table}, "", kNftTimeout, ns_path).status ==
        0) {
      return true;
    }
    return runCommand({"nft", "list", "table", "inet", table}, "", kNftTimeout, ns_path).status !=
           0;
  }

  // Each allowed name (not `*.x`) asked A and AAAA, at once; `ask(name, qtype, server)` sends
  // one query to the resolver at `server` and returns its reply.
  using AskFn = std::function<ParsedReply(const std::string&, uint16_t, const std::string&)>;
  void preResolve(const policy::Allowlist& allow, const AskFn& query) {
    // Each name once (rules for one name's ports are opened by the same answer); `*.x` names
    // are opened when the agent asks for them.
    std::vector<std::string> names;
    for (const auto& rule : allow.rules()) {
      if (!rule.wildcard && std::find(names.begin(), names.end(), rule.name) == names.end()) {
        names.push_back(rule.name);
      }
    }
    for (size_t first = 0; first < names.size(); first += kPreResolveNamesAtOnce) {
      // A long allowlist takes a while (each answer's elements are loaded with `nft`): a stop
      // asked for meanwhile ends arming here rather than after the last name.
      if (const int sig = stop_signal_ ? stop_signal_() : 0; sig != 0) {
        throw StoppedBeforeStart(sig);
      }
      // A few names' A and AAAA at once: each waits on the upstream resolver, and answers
      // that arrive together have their elements loaded together (admitter.h). Judged in
      // allowlist order.
      const size_t last = std::min(names.size(), first + kPreResolveNamesAtOnce);
      std::vector<std::pair<std::future<ParsedReply>, std::future<ParsedReply>>> asked;
      for (size_t i = first; i < last; ++i) {
        auto ask = [&](uint16_t qtype, const std::string& server) {
          return std::async(std::launch::async, [&query, &name = names[i], qtype, server] {
            return query(name, qtype, server);
          });
        };
        asked.emplace_back(ask(kTypeA, net_.host4), ask(kTypeAaaa, net_.host6));
      }
      for (size_t i = first; i < last; ++i) {
        auto& [a, aaaa] = asked[i - first];
        judgeReplies(names[i], a.get(), aaaa.get());
      }
    }
  }

  // Refuses the start if the resolver failed on `name`; logs a name with no address.
  void judgeReplies(const std::string& name, const ParsedReply& a, const ParsedReply& aaaa) const {
    const std::pair<uint16_t, const ParsedReply&> replies[] = {{kTypeA, a}, {kTypeAaaa, aaaa}};
    auto none = [](const ParsedReply& r) {
      return r.rcode == kRcodeNxDomain || r.addresses.empty();
    };
    // A name with addresses of one family only is common (IPv4-only hosts): said at info
    // level; a warning only when the name has no address at all.
    const bool nowhere = none(a) && none(aaaa);
    for (const auto& [qtype, r] : replies) {
      if (r.rcode != kRcodeNoError && r.rcode != kRcodeNxDomain) {
        throw RunnerError("the sandbox's resolver answered " + name +
                          (qtype == kTypeA ? " A" : " AAAA") + " with RCODE " +
                          std::to_string(r.rcode) + " (see the dns log line)");
      }
      if (!none(r)) continue;
      const nlohmann::json fields{
          {"agent", id_}, {"name", name}, {"qtype", qtype == kTypeA ? "A" : "AAAA"}};
      if (nowhere) {
        common::log::warn("egress firewall: allowed name has no address yet", fields);
      } else {
        common::log::info("egress firewall: allowed name has no address of this family", fields);
      }
    }
  }

  // The ruleset as the kernel created it, not as we sent it: the load's echo (`nft --echo
  // --handle`), one "add …" line per object the kernel made, ending in the handle it gave
  // ("add chain inet compass_egress output { type filter hook output priority filter; policy
  // drop; } # handle 1"). The load flushed everything else in this netns, so our table is all
  // there is to judge.
  static void verify(const std::string& echoed) {
    const std::string table_line = "add table inet " + std::string(kEgressTable) + " # handle ";
    const std::string chain_prefix = "add chain inet " + std::string(kEgressTable) + " ";
    const auto dropChain = [](const std::string& hook) {
      return hook + " { type filter hook " + hook + " priority filter; policy drop; }";
    };
    const std::map<std::string, std::string> expected = {{"output", dropChain("output")},
                                                         {"input", dropChain("input")}};
    bool table = false;
    std::set<std::string> dropping;
    std::istringstream lines(echoed);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind(table_line, 0) == 0) table = true;
      if (line.rfind(chain_prefix, 0) != 0 || line.find(" # handle ") == std::string::npos) {
        continue;
      }
      for (const auto& [hook, body] : expected) {
        if (line.compare(chain_prefix.size(), body.size(), body) == 0) dropping.insert(hook);
      }
    }
    if (!table || !dropping.contains("output") || !dropping.contains("input")) {
      throw RunnerError("the netns ruleset does not hold table inet " + std::string(kEgressTable) +
                        " with output and input policy drop (nft echoed \"" +
                        echoed.substr(0, 200) + "\")");
    }
  }

  std::string id_;
  std::string netns_name_;
  StopSignalFn stop_signal_;
  std::function<void(const Addressing&)> on_addressed_;
  Addressing net_;
  std::unique_ptr<DnsForwarder> forwarder_;
  std::vector<std::pair<std::string, std::function<bool()>>> undo_;
};

}  // namespace

namespace {

// The checks both arm functions make before anything is created.
policy::Allowlist checkedAllowlist(const std::string& id, const std::string& netns_name,
                                   const std::vector<std::string>& allow) {
  checkId(id);
  policy::Allowlist list;
  for (const auto& entry : allow) {
    try {
      list.add(policy::parseAllowRule(entry));
    } catch (const policy::AllowRuleError& e) {
      throw RunnerError("egress firewall: allow entry \"" + entry + "\": " + e.what());
    }
  }
  if (!std::filesystem::exists(netnsPath(netns_name))) {
    throw RunnerError("egress firewall: netns " + netnsPath(netns_name) + " does not exist");
  }
  return list;
}

}  // namespace

std::unique_ptr<Egress> arm(const std::string& id, const std::string& netns_name,
                            const std::vector<std::string>& allow, StopSignalFn stop_signal,
                            const std::function<void(const Addressing&)>& on_addressed) {
  const policy::Allowlist list = checkedAllowlist(id, netns_name, allow);
  auto egress =
      std::make_unique<FirewallEgress>(id, netns_name, std::move(stop_signal), on_addressed);
  try {
    egress->arm(list);
  } catch (...) {
    egress->teardown();
    throw;
  }
  return egress;
}

std::unique_ptr<Egress> armForGuest(const std::string& id, const std::string& netns_name,
                                    const std::vector<std::string>& allow, const std::string& tap,
                                    ApplyFn apply, StopSignalFn stop_signal) {
  const policy::Allowlist list = checkedAllowlist(id, netns_name, allow);
  if (tap.empty() || tap.size() > 15 ||
      tap.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789") != std::string::npos) {
    throw RunnerError("egress firewall: tap name \"" + tap + "\": expected 1..15 of [a-z0-9]");
  }
  if (!apply) throw RunnerError("egress firewall: no way to reach the guest's ruleset");
  auto egress = std::make_unique<FirewallEgress>(id, netns_name, std::move(stop_signal));
  try {
    egress->armForGuest(list, tap, std::move(apply));
  } catch (...) {
    egress->teardown();
    throw;
  }
  return egress;
}

void reap(const std::string& id) noexcept {
  try {
    checkId(id);
  } catch (...) {
    return;  // not an id we could have made: nothing of ours carries it
  }
  if (!removeVeth(id)) {
    common::log::warn("egress firewall: reap could not remove veth", {{"veth", hostVethName(id)}});
  }
  if (!removeHostNat(id)) {
    common::log::warn("egress firewall: reap could not remove host table",
                      {{"table", hostTableName(id)}});
  }
}

}  // namespace runner::firewall
