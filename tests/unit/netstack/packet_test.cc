// Byte-level tests of packet intake and of the packets netstack writes itself (the RST that
// refuses a held SYN, UDP answers).

#include "netstack/packet.h"

#include <gtest/gtest.h>

#include "test_packets.h"

namespace netstack {
namespace {

using testing::kAgent4;
using testing::kAgent6;
using testing::kSynthetic4;
using testing::kSynthetic6;
using testing::makePacket;

Packet parseOk(const std::vector<uint8_t>& bytes) {
  Packet p;
  EXPECT_EQ(parsePacket(bytes, &p), ParseStatus::kOk);
  return p;
}

TEST(PacketTest, ParsesIpv4Syn) {
  const auto bytes = makePacket(false, kAgent4, kSynthetic4, 40000, 443, kProtoTcp, kTcpSyn, 1000);
  const Packet p = parseOk(bytes);
  EXPECT_EQ(p.version, 4);
  EXPECT_TRUE(p.isSyn());
  EXPECT_EQ(p.seq, 1000u);
  EXPECT_EQ(p.key.src.port, 40000);
  EXPECT_EQ(p.key.dst.port, 443);
  EXPECT_EQ(p.key.dst.address().to_string(), "100.64.0.7");
  EXPECT_EQ(p.ip_header_len, 20u);
}

TEST(PacketTest, ParsesIpv6SynAndUdp) {
  const Packet syn = parseOk(makePacket(true, kAgent6, kSynthetic6, 1, 80, kProtoTcp, kTcpSyn));
  EXPECT_EQ(syn.version, 6);
  EXPECT_EQ(syn.key.dst.address().to_string(), "100::9");
  // The payload views the packet's bytes: keep them alive.
  const auto udp_bytes = makePacket(true, kAgent6, kSynthetic6, 5000, 53, kProtoUdp, 0, 0, "hello");
  const Packet udp = parseOk(udp_bytes);
  EXPECT_EQ(udp.protocol, kProtoUdp);
  EXPECT_EQ(udp.payload, "hello");
  EXPECT_FALSE(udp.isSyn());
}

TEST(PacketTest, SynAckAndRstAreNotHeldSyns) {
  EXPECT_FALSE(
      parseOk(makePacket(false, kAgent4, kSynthetic4, 1, 2, kProtoTcp, kTcpSyn | kTcpAck)).isSyn());
  EXPECT_FALSE(parseOk(makePacket(false, kAgent4, kSynthetic4, 1, 2, kProtoTcp, kTcpAck)).isSyn());
}

TEST(PacketTest, RejectsBadChecksumsAndLengths) {
  auto bytes = makePacket(false, kAgent4, kSynthetic4, 1, 2, kProtoTcp, kTcpSyn);
  Packet p;
  auto bad_tcp = bytes;
  bad_tcp[20 + 16] ^= 0xff;
  EXPECT_EQ(parsePacket(bad_tcp, &p), ParseStatus::kMalformed);
  auto bad_ip = bytes;
  bad_ip[10] ^= 0xff;
  EXPECT_EQ(parsePacket(bad_ip, &p), ParseStatus::kMalformed);
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_EQ(parsePacket({bytes.data(), n}, &p), ParseStatus::kMalformed) << n;
  }
  auto v5 = bytes;
  v5[0] = 0x55;
  EXPECT_EQ(parsePacket(v5, &p), ParseStatus::kMalformed);
}

TEST(PacketTest, FragmentsAndOtherProtocolsAreUnsupported) {
  auto frag = makePacket(false, kAgent4, kSynthetic4, 1, 2, kProtoUdp, 0, 0, "x");
  frag[6] = 0x20;  // more fragments
  frag[10] = frag[11] = 0;
  testing::put16(frag, 10, checksumFinish(checksumAdd({frag.data(), 20})));
  Packet p;
  EXPECT_EQ(parsePacket(frag, &p), ParseStatus::kUnsupported);
  auto icmp = makePacket(false, kAgent4, kSynthetic4, 1, 2, kProtoUdp);
  icmp[9] = 1;
  icmp[10] = icmp[11] = 0;
  testing::put16(icmp, 10, checksumFinish(checksumAdd({icmp.data(), 20})));
  EXPECT_EQ(parsePacket(icmp, &p), ParseStatus::kUnsupported);
}

TEST(PacketTest, TunPaddingAfterTotalLengthIsIgnored) {
  auto bytes = makePacket(false, kAgent4, kSynthetic4, 1, 2, kProtoUdp, 0, 0, "abc");
  bytes.push_back(0xee);
  const Packet p = parseOk(bytes);
  EXPECT_EQ(p.total_len, bytes.size() - 1);
  EXPECT_EQ(p.payload, "abc");
}

TEST(PacketTest, RstAnswersIpv4SynByteForByte) {
  const auto syn_bytes =
      makePacket(false, kAgent4, kSynthetic4, 40000, 443, kProtoTcp, kTcpSyn, 0xfffffffe);
  const Packet syn = parseOk(syn_bytes);
  const std::string rst = buildTcpRst(syn);
  ASSERT_EQ(rst.size(), 40u);
  const auto* b = reinterpret_cast<const uint8_t*>(rst.data());
  EXPECT_EQ(b[0], 0x45);
  EXPECT_EQ(b[9], kProtoTcp);
  EXPECT_EQ(std::vector<uint8_t>(b + 12, b + 16), kSynthetic4);  // from the dialled address
  EXPECT_EQ(std::vector<uint8_t>(b + 16, b + 20), kAgent4);
  EXPECT_EQ(b[20] << 8 | b[21], 443);
  EXPECT_EQ(b[22] << 8 | b[23], 40000);
  EXPECT_EQ(b[24] | b[25] | b[26] | b[27], 0);  // seq 0
  EXPECT_EQ(std::vector<uint8_t>(b + 28, b + 32), (std::vector<uint8_t>{0xff, 0xff, 0xff, 0xff}));
  EXPECT_EQ(b[33], kTcpRst | kTcpAck);
  // Valid checksums: it parses, as the agent's kernel will.
  Packet back;
  const std::vector<uint8_t> copy(b, b + rst.size());
  ASSERT_EQ(parsePacket(copy, &back), ParseStatus::kOk);
  EXPECT_EQ(back.key.src, syn.key.dst);
  EXPECT_EQ(back.key.dst, syn.key.src);
  EXPECT_EQ(back.ack, syn.seq + 1);
}

TEST(PacketTest, RstAnswersIpv6SynWithDataCountingItsLength) {
  const Packet syn =
      parseOk(makePacket(true, kAgent6, kSynthetic6, 1234, 80, kProtoTcp, kTcpSyn, 7, "tfo"));
  const std::string rst = buildTcpRst(syn);
  ASSERT_EQ(rst.size(), 60u);
  Packet back;
  const std::vector<uint8_t> copy(rst.begin(), rst.end());
  ASSERT_EQ(parsePacket(copy, &back), ParseStatus::kOk);
  EXPECT_EQ(back.tcp_flags, kTcpRst | kTcpAck);
  EXPECT_EQ(back.ack, 7u + 1 + 3);
  EXPECT_EQ(back.seq, 0u);
}

TEST(PacketTest, UdpReplyRoundTrips) {
  for (bool v6 : {false, true}) {
    const Packet q = parseOk(makePacket(v6, v6 ? kAgent6 : kAgent4, v6 ? kSynthetic6 : kSynthetic4,
                                        5353, 53, kProtoUdp, 0, 0, "query"));
    const std::string reply = buildUdp(q.key.dst, q.key.src, "answer");
    const std::vector<uint8_t> copy(reply.begin(), reply.end());
    Packet back;
    ASSERT_EQ(parsePacket(copy, &back), ParseStatus::kOk);
    EXPECT_EQ(back.payload, "answer");
    EXPECT_EQ(back.key.src, q.key.dst);
    EXPECT_EQ(back.key.dst, q.key.src);
  }
  EXPECT_TRUE(buildUdp(Endpoint{}, Endpoint{}, std::string(70000, 'x')).empty());
}

uint16_t load16(const std::string& s, size_t at) {
  return static_cast<uint16_t>((static_cast<uint8_t>(s[at]) << 8) |
                               static_cast<uint8_t>(s[at + 1]));
}

// A refused UDP flow is answered as a closed port would be: the agent's connected socket gets
// ECONNREFUSED instead of waiting (RFC 792, RFC 4443).
TEST(PacketTest, PortUnreachableQuotesTheDatagramAndChecksOut) {
  for (bool v6 : {false, true}) {
    SCOPED_TRACE(v6 ? "IPv6" : "IPv4");
    const Endpoint agent =
        Endpoint::from(asio::ip::make_address(v6 ? "100::2" : "100.64.0.2"), 40000);
    const Endpoint dst = Endpoint::from(asio::ip::make_address(v6 ? "100::9" : "100.64.0.9"), 443);
    const size_t ip_len = v6 ? 40 : 20;
    for (size_t payload_len : {size_t{5}, size_t{3000}}) {
      const std::string payload(payload_len, 'q');
      const std::string datagram = buildUdp(agent, dst, payload);
      const std::string icmp = buildUdpPortUnreachable(agent, dst, payload);
      ASSERT_FALSE(icmp.empty());
      // Outer header: from the address the agent dialled, to the agent, ICMP.
      EXPECT_EQ(static_cast<uint8_t>(icmp[0]) >> 4, v6 ? 6 : 4);
      EXPECT_EQ(static_cast<uint8_t>(icmp[v6 ? 6 : 9]), v6 ? kProtoIcmpv6 : kProtoIcmp);
      const size_t addr_at = v6 ? 8 : 12, addr_len = v6 ? 16 : 4;
      EXPECT_EQ(icmp.compare(addr_at, addr_len,
                             std::string(dst.addr.begin(), dst.addr.begin() + addr_len)),
                0);
      EXPECT_EQ(icmp.compare(addr_at + addr_len, addr_len,
                             std::string(agent.addr.begin(), agent.addr.begin() + addr_len)),
                0);
      const auto* bytes = reinterpret_cast<const uint8_t*>(icmp.data());
      if (!v6) {
        EXPECT_EQ(load16(icmp, 2), icmp.size());
        EXPECT_EQ(checksumFinish(checksumAdd({bytes, 20})), 0);
      } else {
        EXPECT_EQ(load16(icmp, 4) + 40U, icmp.size());
      }
      // Type and code: destination unreachable, port unreachable.
      EXPECT_EQ(static_cast<uint8_t>(icmp[ip_len]), v6 ? 1 : 3);
      EXPECT_EQ(static_cast<uint8_t>(icmp[ip_len + 1]), v6 ? 4 : 3);
      const size_t icmp_len = icmp.size() - ip_len;
      uint32_t sum = checksumAdd({bytes + ip_len, icmp_len});
      if (v6) {  // the pseudo-header: both addresses, the length and next header 58
        sum = checksumAdd({bytes + 8, 32}, sum);
        const uint8_t tail[8] = {0,
                                 0,
                                 static_cast<uint8_t>(icmp_len >> 8),
                                 static_cast<uint8_t>(icmp_len),
                                 0,
                                 0,
                                 0,
                                 kProtoIcmpv6};
        sum = checksumAdd(tail, sum);
      }
      EXPECT_EQ(checksumFinish(sum), 0);
      // The quote is the datagram as sent, cut to the protocol's size bound.
      const std::string quote = icmp.substr(ip_len + 8);
      EXPECT_EQ(quote, datagram.substr(0, quote.size()));
      if (payload_len == 5) {
        EXPECT_EQ(quote, datagram);
      } else {
        EXPECT_EQ(icmp.size(), v6 ? 1280U : 576U);
      }
    }
  }
}

TEST(PacketTest, EndpointAddressConversions) {
  const auto v4 = Endpoint::from(asio::ip::make_address("100.127.255.253"), 53);
  EXPECT_FALSE(v4.v6);
  EXPECT_EQ(v4.address().to_string(), "100.127.255.253");
  const auto v6 = Endpoint::from(asio::ip::make_address("100::5"), 80);
  EXPECT_TRUE(v6.v6);
  EXPECT_EQ(v6.address().to_string(), "100::5");
  EXPECT_NE(FlowKeyHash{}(FlowKey{v4, v6}), FlowKeyHash{}(FlowKey{v6, v4}));
}

}  // namespace
}  // namespace netstack
