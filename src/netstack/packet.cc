#include "netstack/packet.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "netstack/checksum.h"

namespace netstack {
namespace {

constexpr size_t kIpv4HeaderMin = 20;
constexpr size_t kIpv6Header = 40;
constexpr size_t kTcpHeaderMin = 20;
constexpr size_t kUdpHeader = 8;
constexpr uint8_t kDefaultTtl = 64;

uint16_t load16(const uint8_t* p) { return static_cast<uint16_t>(p[0] << 8 | p[1]); }
uint32_t load32(const uint8_t* p) {
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | p[3];
}
void store16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v);
}
void store32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (24 - 8 * i));
}

// The pseudo-header sum of RFC 9293 §3.1 / RFC 8200 §8.1 for a transport segment.
uint32_t pseudoHeaderSum(const Endpoint& src, const Endpoint& dst, uint8_t protocol,
                         size_t length) {
  const size_t addr_len = src.v6 ? 16 : 4;
  uint32_t sum = checksumAdd({src.addr.data(), addr_len});
  sum = checksumAdd({dst.addr.data(), addr_len}, sum);
  sum += protocol;
  sum += static_cast<uint32_t>(length >> 16) + static_cast<uint32_t>(length & 0xffff);
  return sum;
}

// Writes an IP header for a transport segment of `l4_len` bytes; returns its length.
size_t writeIpHeader(uint8_t* out, const Endpoint& from, const Endpoint& to, uint8_t protocol,
                     size_t l4_len) {
  if (!from.v6) {
    std::memset(out, 0, kIpv4HeaderMin);
    out[0] = 0x45;
    store16(out + 2, static_cast<uint16_t>(kIpv4HeaderMin + l4_len));
    out[6] = 0x40;  // DF: netstack never fragments
    out[8] = kDefaultTtl;
    out[9] = protocol;
    std::memcpy(out + 12, from.addr.data(), 4);
    std::memcpy(out + 16, to.addr.data(), 4);
    store16(out + 10, checksumFinish(checksumAdd({out, kIpv4HeaderMin})));
    return kIpv4HeaderMin;
  }
  std::memset(out, 0, kIpv6Header);
  out[0] = 0x60;
  store16(out + 4, static_cast<uint16_t>(l4_len));
  out[6] = protocol;
  out[7] = kDefaultTtl;
  std::memcpy(out + 8, from.addr.data(), 16);
  std::memcpy(out + 24, to.addr.data(), 16);
  return kIpv6Header;
}

}  // namespace

asio::ip::address Endpoint::address() const {
  if (v6) return asio::ip::address_v6(addr);
  return asio::ip::address_v4(asio::ip::address_v4::bytes_type{addr[0], addr[1], addr[2], addr[3]});
}

Endpoint Endpoint::from(const asio::ip::address& address, uint16_t port) {
  Endpoint e;
  e.port = port;
  if (address.is_v6()) {
    e.v6 = true;
    e.addr = address.to_v6().to_bytes();
  } else {
    const auto b = address.to_v4().to_bytes();
    std::memcpy(e.addr.data(), b.data(), 4);
  }
  return e;
}

size_t FlowKeyHash::operator()(const FlowKey& key) const noexcept {
  // FNV-1a over both endpoints: cheap, and the agent chooses only its own ports.
  uint64_t h = 1469598103934665603ULL;
  auto mix = [&h](const Endpoint& e) {
    for (uint8_t b : e.addr) h = (h ^ b) * 1099511628211ULL;
    h = (h ^ e.port) * 1099511628211ULL;
    h = (h ^ static_cast<uint64_t>(e.v6)) * 1099511628211ULL;
  };
  mix(key.src);
  mix(key.dst);
  return static_cast<size_t>(h);
}

uint32_t checksumAdd(std::span<const uint8_t> data, uint32_t sum) {
  // The memory-order sum read as a big-endian 16-bit word: the sum of big-endian words.
  uint16_t folded = onesSumMemoryOrder(data.data(), data.size());
  if constexpr (std::endian::native == std::endian::little) folded = __builtin_bswap16(folded);
  uint64_t wide = uint64_t{sum} + folded;
  while (wide >> 32) wide = (wide & 0xffffffff) + (wide >> 32);
  return static_cast<uint32_t>(wide);
}

uint16_t checksumFinish(uint32_t sum) {
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  return static_cast<uint16_t>(~sum);
}

ParseStatus parsePacket(std::span<const uint8_t> packet, Packet* out) {
  *out = Packet{};
  if (packet.empty()) return ParseStatus::kMalformed;
  const uint8_t* p = packet.data();
  const uint8_t version = p[0] >> 4;
  size_t hlen = 0;
  size_t total = 0;
  uint8_t protocol = 0;
  Endpoint src;
  Endpoint dst;
  if (version == 4) {
    if (packet.size() < kIpv4HeaderMin) return ParseStatus::kMalformed;
    hlen = size_t{p[0] & 0x0fu} * 4;
    total = load16(p + 2);
    if (hlen < kIpv4HeaderMin || total < hlen || total > packet.size()) {
      return ParseStatus::kMalformed;
    }
    if (checksumFinish(checksumAdd({p, hlen})) != 0) return ParseStatus::kMalformed;
    // More-fragments set or a non-zero offset: a fragment (the agent's kernel sends none
    // with DF and a 1500 MTU; reassembly is not worth its attack surface here).
    if ((load16(p + 6) & 0x3fff) != 0) return ParseStatus::kUnsupported;
    protocol = p[9];
    std::memcpy(src.addr.data(), p + 12, 4);
    std::memcpy(dst.addr.data(), p + 16, 4);
  } else if (version == 6) {
    if (packet.size() < kIpv6Header) return ParseStatus::kMalformed;
    hlen = kIpv6Header;
    total = kIpv6Header + load16(p + 4);
    if (total > packet.size()) return ParseStatus::kMalformed;
    protocol = p[6];  // extension headers (and fragments) are not handled: unsupported
    src.v6 = dst.v6 = true;
    std::memcpy(src.addr.data(), p + 8, 16);
    std::memcpy(dst.addr.data(), p + 24, 16);
  } else {
    return ParseStatus::kMalformed;
  }
  if (protocol != kProtoTcp && protocol != kProtoUdp) return ParseStatus::kUnsupported;

  const uint8_t* l4 = p + hlen;
  const size_t l4_len = total - hlen;
  size_t l4_hlen = 0;
  if (protocol == kProtoTcp) {
    if (l4_len < kTcpHeaderMin) return ParseStatus::kMalformed;
    l4_hlen = static_cast<size_t>(l4[12] >> 4) * 4;
    if (l4_hlen < kTcpHeaderMin || l4_hlen > l4_len) return ParseStatus::kMalformed;
    out->seq = load32(l4 + 4);
    out->ack = load32(l4 + 8);
    out->tcp_flags = l4[13];
  } else {
    if (l4_len < kUdpHeader) return ParseStatus::kMalformed;
    const size_t udp_len = load16(l4 + 4);
    if (udp_len < kUdpHeader || udp_len != l4_len) return ParseStatus::kMalformed;
    l4_hlen = kUdpHeader;
  }
  src.port = load16(l4);
  dst.port = load16(l4 + 2);
  // UDP over IPv4 may omit its checksum (zero); everything else must carry a correct one.
  const bool no_udp_checksum = protocol == kProtoUdp && version == 4 && load16(l4 + 6) == 0;
  if (!no_udp_checksum) {
    const uint32_t sum = checksumAdd({l4, l4_len}, pseudoHeaderSum(src, dst, protocol, l4_len));
    if (checksumFinish(sum) != 0) return ParseStatus::kMalformed;
  }
  out->version = version;
  out->protocol = protocol;
  out->ip_header_len = hlen;
  out->total_len = total;
  out->key = FlowKey{src, dst};
  out->payload = std::string_view(reinterpret_cast<const char*>(l4 + l4_hlen), l4_len - l4_hlen);
  return ParseStatus::kOk;
}

std::string buildTcpRst(const Packet& syn) {
  const Endpoint& from = syn.key.dst;
  const Endpoint& to = syn.key.src;
  std::string out(kIpv6Header + kTcpHeaderMin, '\0');
  auto* p = reinterpret_cast<uint8_t*>(out.data());
  const size_t hlen = writeIpHeader(p, from, to, kProtoTcp, kTcpHeaderMin);
  out.resize(hlen + kTcpHeaderMin);
  uint8_t* tcp = p + hlen;
  store16(tcp, from.port);
  store16(tcp + 2, to.port);
  uint32_t seg_len = static_cast<uint32_t>(syn.payload.size());
  if (syn.tcp_flags & kTcpSyn) ++seg_len;
  if (syn.tcp_flags & kTcpFin) ++seg_len;
  store32(tcp + 4, 0);
  store32(tcp + 8, syn.seq + seg_len);
  tcp[12] = 5 << 4;
  tcp[13] = kTcpRst | kTcpAck;
  const uint32_t sum =
      checksumAdd({tcp, kTcpHeaderMin}, pseudoHeaderSum(from, to, kProtoTcp, kTcpHeaderMin));
  store16(tcp + 16, checksumFinish(sum));
  return out;
}

std::string buildUdpPortUnreachable(const Endpoint& agent, const Endpoint& dst,
                                    std::string_view payload) {
  constexpr size_t kIcmpHeader = 8;
  const size_t ip_len = dst.v6 ? kIpv6Header : kIpv4HeaderMin;
  const size_t most = dst.v6 ? 1280 : 576;
  // The quote: the datagram as the agent sent it (its own lengths and checksum), cut.
  std::string quote = buildUdp(agent, dst, payload);
  if (quote.empty()) return {};
  quote.resize(std::min(quote.size(), most - ip_len - kIcmpHeader));
  const size_t icmp_len = kIcmpHeader + quote.size();
  std::string out(ip_len + icmp_len, '\0');
  auto* p = reinterpret_cast<uint8_t*>(out.data());
  writeIpHeader(p, dst, agent, dst.v6 ? kProtoIcmpv6 : kProtoIcmp, icmp_len);
  uint8_t* icmp = p + ip_len;
  icmp[0] = dst.v6 ? 1 : 3;  // destination unreachable
  icmp[1] = dst.v6 ? 4 : 3;  // port unreachable
  std::copy(quote.begin(), quote.end(), icmp + kIcmpHeader);
  // ICMPv6 sums a pseudo-header (RFC 4443 §2.3); ICMPv4 sums the message only (RFC 792).
  const uint32_t start = dst.v6 ? pseudoHeaderSum(dst, agent, kProtoIcmpv6, icmp_len) : 0;
  store16(icmp + 2, checksumFinish(checksumAdd({icmp, icmp_len}, start)));
  return out;
}

std::string buildUdp(const Endpoint& from, const Endpoint& to, std::string_view payload) {
  const size_t ip_len = from.v6 ? kIpv6Header : kIpv4HeaderMin;
  const size_t l4_len = kUdpHeader + payload.size();
  if (ip_len + l4_len > 65535) return {};
  std::string out(ip_len + l4_len, '\0');
  auto* p = reinterpret_cast<uint8_t*>(out.data());
  writeIpHeader(p, from, to, kProtoUdp, l4_len);
  uint8_t* udp = p + ip_len;
  store16(udp, from.port);
  store16(udp + 2, to.port);
  store16(udp + 4, static_cast<uint16_t>(l4_len));
  std::memcpy(udp + kUdpHeader, payload.data(), payload.size());
  uint16_t sum =
      checksumFinish(checksumAdd({udp, l4_len}, pseudoHeaderSum(from, to, kProtoUdp, l4_len)));
  if (sum == 0) sum = 0xffff;  // RFC 768: a computed zero is sent as all ones
  store16(udp + 6, sum);
  return out;
}

}  // namespace netstack
