#include "compass-runner/ruleset.h"

#include <algorithm>
#include <array>
#include <set>
#include <stdexcept>

#include "policy/address.h"

namespace runner::firewall {
namespace {

constexpr uint32_t kPool4Base = (10u << 24) | (231u << 16);  // 10.231.0.0
constexpr unsigned kPool4PrefixBits = 16;
// fd5a:7c3e:91b4::/48 as its first six bytes.
constexpr std::array<uint8_t, 6> kPool6Prefix = {0xfd, 0x5a, 0x7c, 0x3e, 0x91, 0xb4};

std::string v4Text(uint32_t a) { return asio::ip::address_v4(a).to_string(); }

std::string v6Text(unsigned slot, uint8_t host) {
  asio::ip::address_v6::bytes_type b{};
  std::copy(kPool6Prefix.begin(), kPool6Prefix.end(), b.begin());
  b[6] = static_cast<uint8_t>(slot >> 8);
  b[7] = static_cast<uint8_t>(slot & 0xff);
  b[15] = host;
  return asio::ip::address_v6(b).to_string();
}

std::string setFor(const AllowElement& e) {
  const bool v4 = e.address.is_v4();
  if (e.port) return v4 ? "allow4p" : "allow6p";
  return v4 ? "allow4" : "allow6";
}

// Names are [a-z0-9.-] after policy::normalizeName(), so quoting them cannot break out of the
// string; anything else is dropped from the comment rather than trusted.
std::string commentText(std::string_view name) {
  std::string out;
  for (char c : name) {
    if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-') out += c;
  }
  return out.substr(0, 128);  // nft caps comments at 128 bytes
}

std::string elementKey(const AllowElement& e) {
  std::string out = e.address.to_string();
  if (e.port) out += " . " + std::to_string(*e.port);
  return out;
}

std::string elementText(const AllowElement& e) {
  std::string out = elementKey(e);
  const std::string comment = commentText(e.name);
  if (!comment.empty()) out += " comment \"" + comment + "\"";
  return out;
}

constexpr std::array<std::pair<std::string_view, std::string_view>, 4> kSets = {{
    {"allow4", "ipv4_addr"},
    {"allow6", "ipv6_addr"},
    {"allow4p", "ipv4_addr . inet_service"},
    {"allow6p", "ipv6_addr . inet_service"},
}};

}  // namespace

Addressing addressingForSlot(unsigned slot) {
  if (slot >= kSlots) throw std::out_of_range("firewall slot out of range");
  Addressing a;
  a.slot = slot;
  const uint32_t base = kPool4Base + 4 * slot;
  a.net4 = v4Text(base) + "/30";
  a.host4 = v4Text(base + 1);
  a.sandbox4 = v4Text(base + 2);
  a.net6 = v6Text(slot, 0) + "/64";
  a.host6 = v6Text(slot, 1);
  a.sandbox6 = v6Text(slot, 2);
  return a;
}

std::optional<unsigned> slotOfAddress(const asio::ip::address& raw) {
  const auto addr = policy::canonicalAddress(raw);
  if (addr.is_v4()) {
    const uint32_t v = addr.to_v4().to_uint();
    if ((v >> kPool4PrefixBits) != (kPool4Base >> kPool4PrefixBits)) return std::nullopt;
    const unsigned slot = (v - kPool4Base) / 4;
    return slot < kSlots ? std::optional<unsigned>(slot) : std::nullopt;
  }
  const auto b = addr.to_v6().to_bytes();
  if (!std::equal(kPool6Prefix.begin(), kPool6Prefix.end(), b.begin())) return std::nullopt;
  const unsigned slot = (unsigned{b[6]} << 8) | b[7];
  return slot < kSlots ? std::optional<unsigned>(slot) : std::nullopt;
}

bool inPools(const asio::ip::address& raw) {
  const auto addr = policy::canonicalAddress(raw);
  if (addr.is_v4()) {
    return (addr.to_v4().to_uint() >> kPool4PrefixBits) == (kPool4Base >> kPool4PrefixBits);
  }
  const auto b = addr.to_v6().to_bytes();
  return std::equal(kPool6Prefix.begin(), kPool6Prefix.end(), b.begin());
}

std::optional<std::vector<uint16_t>> allowedPorts(const policy::Allowlist& allow,
                                                  std::string_view name) {
  bool matched = false;
  bool any_port = false;
  std::set<uint16_t> ports;
  for (const auto& rule : allow.rules()) {
    // A one-rule Allowlist asks the policy library itself whether this rule matches, so the
    // firewall can never disagree with sam-box on what `*.x` or case means.
    policy::Allowlist one;
    one.add(rule);
    const uint16_t probe = rule.port.value_or(1);
    if (!one.allows(name, probe)) continue;
    matched = true;
    if (rule.port) {
      ports.insert(*rule.port);
    } else {
      any_port = true;
    }
  }
  if (!matched) return std::nullopt;
  if (any_port) return std::vector<uint16_t>{};
  return std::vector<uint16_t>(ports.begin(), ports.end());
}

std::vector<AllowElement> elementsFor(std::string_view name, const std::vector<uint16_t>& ports,
                                      const std::vector<asio::ip::address>& addresses) {
  std::vector<AllowElement> out;
  for (const auto& a : addresses) {
    if (ports.empty()) {
      out.push_back({a, std::nullopt, std::string(name)});
      continue;
    }
    for (uint16_t p : ports) out.push_back({a, p, std::string(name)});
  }
  return out;
}

std::string sandboxRuleset(const Addressing& net, const std::vector<AllowElement>& initial) {
  std::string r = "flush ruleset\ntable inet " + std::string(kEgressTable) + " {\n";
  const auto rule = [&r](const std::string& text) { r += "    " + text + "\n"; };
  for (const auto& [set_name, type] : kSets) {
    r += "  set " + std::string(set_name) + " {\n";
    rule("type " + std::string(type));
    rule("size " + std::to_string(kMaxSetElements));
    std::string elements;
    for (const auto& e : initial) {
      if (setFor(e) != set_name) continue;
      elements += (elements.empty() ? "" : ", ") + elementText(e);
    }
    if (!elements.empty()) rule("elements = { " + elements + " }");
    r += "  }\n";
  }
  r += "  chain output {\n";
  rule("type filter hook output priority filter; policy drop;");
  rule("oif \"lo\" accept");
  rule("ct state established,related accept");
  // Both families of the resolver, so a dual-stack resolv.conf works whichever server the
  // agent's stub resolver picks; DNS to any other address is dropped like everything else.
  rule("ip daddr " + net.host4 + " meta l4proto { tcp, udp } th dport 53 accept");
  rule("ip6 daddr " + net.host6 + " meta l4proto { tcp, udp } th dport 53 accept");
  // Without neighbour discovery IPv6 to an allowed address never gets a next hop.
  rule("icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert, nd-router-solicit } accept");
  rule("ip daddr @allow4 accept");
  rule("ip6 daddr @allow6 accept");
  rule("meta l4proto { tcp, udp } ip daddr . th dport @allow4p accept");
  rule("meta l4proto { tcp, udp } ip6 daddr . th dport @allow6p accept");
  // Denials fail in milliseconds (a reset or an ICMP error) instead of a timeout.
  rule("meta l4proto tcp reject with tcp reset");
  rule("reject with icmpx admin-prohibited");
  r += "  }\n  chain input {\n";
  rule("type filter hook input priority filter; policy drop;");
  rule("iif \"lo\" accept");
  rule("ct state established,related accept");
  rule("icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert } accept");
  r += "  }\n}\n";
  return r;
}

std::string addElementsBatch(const std::vector<AllowElement>& elements, std::string_view table) {
  std::string out;
  for (const auto& e : elements) {
    out += "add element inet " + std::string(table) + " " + setFor(e) + " { " + elementText(e) +
           " }\n";
  }
  return out;
}

std::string deleteElementsBatch(const std::vector<AllowElement>& elements, std::string_view table) {
  std::string out;
  for (const auto& e : elements) {
    out += "delete element inet " + std::string(table) + " " + setFor(e) + " { " + elementKey(e) +
           " }\n";
  }
  return out;
}

std::string hostTableName(const std::string& id) { return "compass_nat_" + id; }

std::string hostNatRuleset(const std::string& id, const std::string& host_veth,
                           const Addressing& net, bool mirror) {
  const std::string in = "iifname \"" + host_veth + "\" ";
  const std::string out = "oifname \"" + host_veth + "\" ";
  std::string r = "table inet " + hostTableName(id) + " {\n";
  const auto rule = [&r](const std::string& text) { r += "    " + text + "\n"; };
  if (mirror) {
    for (const auto& [set_name, type] : kSets) {
      r += "  set " + std::string(set_name) + " {\n";
      rule("type " + std::string(type));
      rule("size " + std::to_string(kMaxSetElements));
      r += "  }\n";
    }
  }
  r += "  chain postrouting {\n";
  rule("type nat hook postrouting priority srcnat; policy accept;");
  rule("ip saddr " + net.net4 + " oifname != \"" + host_veth + "\" masquerade");
  rule("ip6 saddr " + net.net6 + " oifname != \"" + host_veth + "\" masquerade");
  r += "  }\n  chain forward {\n";
  rule("type filter hook forward priority filter; policy accept;");
  // No agent reaches another agent's veth, whatever its own ruleset says; and nothing but
  // the sandbox's own addresses leaves it (no spoofing through the host).
  rule(in + "ip daddr " + kPool4 + " drop");
  rule(in + "ip6 daddr " + kPool6 + " drop");
  if (mirror) {
    rule(in + "ip saddr " + net.net4 + " ip daddr @allow4 accept");
    rule(in + "ip6 saddr " + net.net6 + " ip6 daddr @allow6 accept");
    rule(in + "ip saddr " + net.net4 +
         " meta l4proto { tcp, udp } ip daddr . th dport @allow4p accept");
    rule(in + "ip6 saddr " + net.net6 +
         " meta l4proto { tcp, udp } ip6 daddr . th dport @allow6p accept");
  } else {
    rule(in + "ip saddr " + net.net4 + " accept");
    rule(in + "ip6 saddr " + net.net6 + " accept");
  }
  rule(in + "drop");
  rule(out + "ct state established,related accept");
  rule(out + "drop");
  r += "  }\n  chain input {\n";
  rule("type filter hook input priority filter; policy accept;");
  // The host's own services stay out of the sandbox's reach even without the netns ruleset:
  // only its resolver (and neighbour discovery) answers on the host end.
  rule(in + "ct state established,related accept");
  // `socket wildcard 0`: only a socket bound to the resolver's own address (the runner's
  // forwarder) receives it, never a host service on 0.0.0.0:53 or [::]:53, such as a local
  // dnsmasq, even when the runner was killed and its forwarder is gone.
  rule(in + "ip daddr " + net.host4 +
       " meta l4proto { tcp, udp } th dport 53 socket wildcard 0 accept");
  rule(in + "ip6 daddr " + net.host6 +
       " meta l4proto { tcp, udp } th dport 53 socket wildcard 0 accept");
  rule(in + "icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert } accept");
  rule(in + "drop");
  // The resolver serves its sandbox only: nothing that arrives by another interface (a LAN
  // routing to the pool, another agent, the host itself) reaches it.
  rule("iifname != \"" + host_veth + "\" ip daddr " + net.host4 + " drop");
  rule("iifname != \"" + host_veth + "\" ip6 daddr " + net.host6 + " drop");
  r += "  }\n}\n";
  return r;
}

}  // namespace runner::firewall
