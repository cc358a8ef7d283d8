#pragma once
// IP packet intake and the few packets netstack writes itself, at byte level: parsing what
// the agent's kernel wrote to tun0 (IPv4/IPv6, TCP/UDP) so a SYN can be held before lwIP sees
// it, a RST crafted when the boundary refuses, and UDP answered without lwIP. Input is
// untrusted: every length is checked, malformed packets are reported, never asserted on.

#include <asio/ip/address.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>

namespace netstack {

inline constexpr uint8_t kProtoTcp = 6;
inline constexpr uint8_t kProtoUdp = 17;
inline constexpr uint8_t kProtoIcmp = 1;
inline constexpr uint8_t kProtoIcmpv6 = 58;
inline constexpr uint8_t kTcpFin = 0x01;
inline constexpr uint8_t kTcpSyn = 0x02;
inline constexpr uint8_t kTcpRst = 0x04;
inline constexpr uint8_t kTcpAck = 0x10;

/// One side of a flow: an address (IPv4 in the first 4 bytes) and a port.
struct Endpoint {
  bool v6 = false;
  std::array<uint8_t, 16> addr{};
  uint16_t port = 0;
  bool operator==(const Endpoint&) const = default;
  [[nodiscard]] asio::ip::address address() const;
  static Endpoint from(const asio::ip::address& address, uint16_t port);
};

/// A flow as the agent sees it: src is the agent's socket, dst the address it dialled.
struct FlowKey {
  Endpoint src;
  Endpoint dst;
  bool operator==(const FlowKey&) const = default;
};

struct FlowKeyHash {
  size_t operator()(const FlowKey& key) const noexcept;
};

struct Packet {
  uint8_t version = 0;   ///< 4 or 6
  uint8_t protocol = 0;  ///< kProtoTcp or kProtoUdp
  size_t ip_header_len = 0;
  size_t total_len = 0;  ///< IP total length (the bytes after it, tun padding, are ignored)
  FlowKey key;
  // TCP only.
  uint32_t seq = 0;
  uint32_t ack = 0;
  uint8_t tcp_flags = 0;
  /// The transport payload (TCP data after the options, or the UDP payload).
  std::string_view payload;

  [[nodiscard]] bool isSyn() const {
    return protocol == kProtoTcp && (tcp_flags & (kTcpSyn | kTcpAck | kTcpRst)) == kTcpSyn;
  }
};

enum class ParseStatus {
  kOk,
  kMalformed,    ///< bad version, lengths, header checksum or transport checksum
  kUnsupported,  ///< valid but not handled: fragments, extension headers, ICMP, others
};

/// Parses one packet as read from an IFF_TUN|IFF_NO_PI device. Checks the IPv4 header
/// checksum and the TCP/UDP checksum (so lwIP need not). On kOk, `out` views `packet`.
ParseStatus parsePacket(std::span<const uint8_t> packet, Packet* out);

/// The RST|ACK answering `syn` (RFC 9293 §3.10.7.1: a SYN to a closed port is answered with
/// seq 0 and ack = SEG.SEQ + SEG.LEN, where the SYN counts as one), from syn's destination to
/// its source: the agent's connect() fails with ECONNREFUSED at once.
std::string buildTcpRst(const Packet& syn);

/// An IP/UDP packet from `from` to `to` carrying `payload` (≤ 65507 bytes for IPv4,
/// ≤ 65487 for IPv6 so the whole packet stays within kMaxPacketBytes); an empty string if
/// too large.
std::string buildUdp(const Endpoint& from, const Endpoint& to, std::string_view payload);

/// The ICMP "port unreachable" that `dst` would send `agent` for the UDP datagram agent → dst
/// carrying `payload` (RFC 792 type 3 code 3; RFC 4443 §3.1 type 1 code 4): it quotes that
/// datagram (IP header, UDP header, payload) cut so the whole stays within 576 bytes for IPv4
/// (RFC 1812 §4.3.2.3) or 1280 for IPv6 (RFC 4443 §2.4(c)). The agent's kernel then fails a
/// connected UDP socket with ECONNREFUSED (udp(7)), as a refused TCP flow fails with a RST.
/// Empty if the datagram itself could not be built (buildUdp()).
std::string buildUdpPortUnreachable(const Endpoint& agent, const Endpoint& dst,
                                    std::string_view payload);

/// The Internet checksum (RFC 1071) of `data` added to `sum`, not yet folded or inverted.
uint32_t checksumAdd(std::span<const uint8_t> data, uint32_t sum = 0);
/// Folds and inverts a checksumAdd() result.
uint16_t checksumFinish(uint32_t sum);

}  // namespace netstack
