#pragma once
// The nftables text of egress `firewall` (seeds 000/002; DESIGN.md "nftables in a netns"), as
// pure functions so that every byte the runner hands to `nft -f -` is unit-tested. Nothing
// here runs nft: firewall.cc and veth.cc do, through process.h.
//
// Address plan (one slot per live agent, docs/compass-runner.md "Egress firewall"):
//   IPv4  10.231.0.0/16 in /30s: slot n = 10.231.0.0 + 4n; host end .1, sandbox end .2
//   IPv6  fd5a:7c3e:91b4::/48 in /64s: slot n = fd5a:7c3e:91b4:n::/64; host ::1, sandbox ::2
// Both avoid podman's default bridge (10.88.0.0/16) and the tests' 198.18.0.0/15.

#include <asio/ip/address.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "policy/allowlist.h"

namespace runner::firewall {

/// The IPv4 pool, as a prefix and its size in /30 slots.
inline constexpr const char* kPool4 = "10.231.0.0/16";
/// The IPv6 pool (a ULA /48, RFC 4193, global ID chosen at random once).
inline constexpr const char* kPool6 = "fd5a:7c3e:91b4::/48";
/// Slots available: 16384 /30s fill the /16 (and 16384 < 65536 /64s in the /48).
inline constexpr unsigned kSlots = 16384;
/// Most elements each allow set holds (`size` in the set declaration): a bound on what an
/// agent can make the forwarder add by resolving allowed names that keep moving.
inline constexpr unsigned kMaxSetElements = 4096;
/// The netns table's name (`nft list ruleset` in the sandbox shows it).
inline constexpr const char* kEgressTable = "compass_egress";

/// One agent's addresses on its veth pair.
struct Addressing {
  unsigned slot = 0;
  std::string net4;      ///< "10.231.0.4/30"
  std::string host4;     ///< "10.231.0.5": host end, the sandbox's resolver and gateway
  std::string sandbox4;  ///< "10.231.0.6": eth0 in the sandbox
  std::string net6;      ///< "fd5a:7c3e:91b4:1::/64"
  std::string host6;     ///< "fd5a:7c3e:91b4:1::1"
  std::string sandbox6;  ///< "fd5a:7c3e:91b4:1::2"
};

/// The addresses of slot `slot` (0 <= slot < kSlots; throws std::out_of_range otherwise).
Addressing addressingForSlot(unsigned slot);

/// The slot an address of the pools belongs to, or nullopt if it lies outside both pools.
/// veth.cc uses it to see which slots live agents hold.
std::optional<unsigned> slotOfAddress(const asio::ip::address& addr);

/// True if `addr` lies in kPool4 or kPool6: no agent's answer may lead into another's veth.
bool inPools(const asio::ip::address& addr);

/// One element of the allow sets: `address` any port (allow4/allow6), or `address . port`
/// for TCP and UDP (allow4p/allow6p). `name` is the allowed name it was answered for; it
/// becomes the element's comment, so `nft list ruleset` says why an address is open.
struct AllowElement {
  asio::ip::address address;
  std::optional<uint16_t> port;
  std::string name;  ///< normalized host name ([a-z0-9.-] only, see policy/name.h)
  friend bool operator==(const AllowElement&, const AllowElement&) = default;
};

/// The ports `name` (normalized) may reach under `allow`: nullopt when the name matches no
/// rule; an empty vector when some matching rule has no port (any port); else the ports of
/// the matching `host:port` rules, ascending. Matching is policy::Allowlist's own (exact,
/// `*.x` subdomains at any depth, never x itself).
std::optional<std::vector<uint16_t>> allowedPorts(const policy::Allowlist& allow,
                                                  std::string_view name);

/// The set elements that open `addresses` for `name` given `ports` (allowedPorts()): one
/// any-port element per address when `ports` is empty, else one per address and port.
std::vector<AllowElement> elementsFor(std::string_view name, const std::vector<uint16_t>& ports,
                                      const std::vector<asio::ip::address>& addresses);

/// The sandbox's whole ruleset as one `nft -f -` batch, starting with `flush ruleset` so it
/// loads atomically or not at all: table inet compass_egress; output policy drop accepting
/// lo, established/related, DNS (UDP+TCP 53) to `net.host4`/`net.host6` only, ICMPv6
/// neighbour discovery, the four allow sets; then TCP reset / ICMP admin-prohibited, so a
/// denial fails at once. Input policy drop except lo, established/related and neighbour
/// discovery (agents serve nothing in firewall mode). `initial` fills the sets.
std::string sandboxRuleset(const Addressing& net, const std::vector<AllowElement>& initial);

/// `add element` commands for `elements` (one `nft -f -` batch; adding a present element is
/// not an error) into the sets of `table inet <table>`: the sandbox's kEgressTable, or a
/// guest's host table (hostNatRuleset() with `mirror`). Empty input gives an empty string.
std::string addElementsBatch(const std::vector<AllowElement>& elements,
                             std::string_view table = kEgressTable);

/// `delete element` commands undoing addElementsBatch(`elements`, `table`): one `nft -f -`
/// batch, which fails as a whole if any element is missing. Empty input gives "".
std::string deleteElementsBatch(const std::vector<AllowElement>& elements, std::string_view table);

/// The host table for agent `id` (`table inet compass_nat_<id>`): masquerade for the
/// sandbox's subnets on both families; forward: from the sandbox anything but the pools,
/// to it only established/related; input from the sandbox only DNS to its resolver (and
/// neighbour discovery), so the host's own services stay out of reach even without the
/// netns ruleset; the resolver's addresses take nothing from any other interface.
/// `host_veth` is `cv<id>`.
///
/// `mirror` (a microVM guest, whose own ruleset a guest-kernel exploit could flush): the
/// table also holds the four allow sets, and forward lets the sandbox's addresses out only
/// to what they hold, so the host enforces the same allowlist as the guest (the forwarder
/// adds each answered address to both, host first).
std::string hostNatRuleset(const std::string& id, const std::string& host_veth,
                           const Addressing& net, bool mirror = false);

/// The host table's name for agent `id`: "compass_nat_<id>".
std::string hostTableName(const std::string& id);

}  // namespace runner::firewall
