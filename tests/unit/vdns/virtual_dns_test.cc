#include "vdns/virtual_dns.h"

#include <gtest/gtest.h>
#include <asio/ip/network_v4.hpp>

#include <random>
#include <set>

namespace vdns {
namespace {

using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

constexpr uint16_t kA = 1;
constexpr uint16_t kAaaa = 28;
constexpr uint16_t kTxt = 16;
constexpr uint16_t kMx = 15;

void put16(std::string* out, uint16_t v) {
  out->push_back(static_cast<char>(v >> 8));
  out->push_back(static_cast<char>(v & 0xff));
}

std::string encodeName(std::string_view name) {
  std::string out;
  size_t start = 0;
  while (start < name.size()) {
    size_t dot = name.find('.', start);
    if (dot == std::string_view::npos) dot = name.size();
    out.push_back(static_cast<char>(dot - start));
    out.append(name.substr(start, dot - start));
    start = dot + 1;
  }
  out.push_back(0);
  return out;
}

std::string query(std::string_view name, uint16_t type, uint16_t id = 0x1234, bool edns = false) {
  std::string q;
  put16(&q, id);
  put16(&q, 0x0100);  // RD
  put16(&q, 1);
  put16(&q, 0);
  put16(&q, 0);
  put16(&q, edns ? 1 : 0);
  q += encodeName(name);
  put16(&q, type);
  put16(&q, 1);
  if (edns) {
    q.push_back(0);
    put16(&q, 41);
    put16(&q, 4096);
    q.append(4, '\0');
    put16(&q, 0);
  }
  return q;
}

uint16_t get16(std::string_view b, size_t at) {
  return static_cast<uint16_t>((static_cast<uint8_t>(b[at]) << 8) |
                               static_cast<uint8_t>(b[at + 1]));
}
int rcode(std::string_view r) { return r[3] & 0x0F; }
int ancount(std::string_view r) { return get16(r, 6); }

// The address in the single answer of a response to `q`.
asio::ip::address answerAddress(std::string_view q, std::string_view r) {
  const size_t at = q.size() - (get16(q, 10) == 1 ? 11 : 0) + 12;  // pointer,type,class,ttl,len
  const uint16_t len = get16(r, at - 2);
  if (len == 4) {
    asio::ip::address_v4::bytes_type b;
    std::copy_n(r.data() + at, 4, b.begin());
    return asio::ip::address_v4(b);
  }
  asio::ip::address_v6::bytes_type b;
  std::copy_n(r.data() + at, 16, b.begin());
  return asio::ip::address_v6(b);
}

TEST(VirtualDnsTest, AnswersAWithSyntheticAddressFromCgnatRange) {
  VirtualDns dns;
  const auto q = query("api.example.com", kA);
  const auto r = dns.answer(q);
  ASSERT_GE(r.size(), q.size() + 16);
  EXPECT_EQ(get16(r, 0), 0x1234);
  EXPECT_EQ(get16(r, 2) & 0x8000, 0x8000);  // QR
  EXPECT_EQ(get16(r, 2) & 0x0100, 0x0100);  // RD echoed
  EXPECT_EQ(rcode(r), 0);
  EXPECT_EQ(ancount(r), 1);
  EXPECT_EQ(get16(r, q.size() + 6), 0);  // TTL high half
  EXPECT_EQ(get16(r, q.size() + 8), kAnswerTtlSeconds);
  const auto addr = answerAddress(q, r);
  ASSERT_TRUE(addr.is_v4());
  const auto net = asio::ip::make_network_v4(asio::ip::make_address_v4("100.64.0.0"), 10);
  EXPECT_TRUE(asio::ip::make_network_v4(addr.to_v4(), 32).is_subnet_of(net)) << addr;
  EXPECT_EQ(dns.nameFor(addr), "api.example.com");
}

TEST(VirtualDnsTest, AnswersAaaaFrom100Slash64AndRemembersThePair) {
  VirtualDns dns;
  const auto q6 = query("Api.Example.COM", kAaaa);
  const auto r6 = dns.answer(q6);
  ASSERT_EQ(rcode(r6), 0);
  const auto a6 = answerAddress(q6, r6);
  ASSERT_TRUE(a6.is_v6());
  const auto b = a6.to_v6().to_bytes();
  EXPECT_EQ(b[0], 0x01);
  for (int i = 1; i < 8; ++i) EXPECT_EQ(b[i], 0) << i;
  EXPECT_NE(a6, asio::ip::make_address(kTunAddress6));
  EXPECT_EQ(dns.nameFor(a6), "api.example.com");
  // The v4 address is not live until an A query hands it out.
  const auto q4 = query("api.example.com.", kA);
  const auto r4 = dns.answer(q4);
  const auto a4 = answerAddress(q4, r4);
  EXPECT_EQ(dns.nameFor(a4), "api.example.com");
  EXPECT_EQ(dns.liveNames(), 1U);
}

TEST(VirtualDnsTest, QuestionEchoKeepsTheCaseTheClientSent) {
  VirtualDns dns;
  const auto q = query("ApI.eXample.com", kA);
  const auto r = dns.answer(q);
  EXPECT_EQ(r.substr(12, q.size() - 12), q.substr(12));
}

TEST(VirtualDnsTest, SameNameSameAddressDifferentNamesDifferentAddresses) {
  VirtualDns dns;
  std::set<std::string> seen;
  for (int i = 0; i < 300; ++i) {
    const auto q = query("host" + std::to_string(i) + ".example.com", kA);
    const auto addr = answerAddress(q, dns.answer(q));
    EXPECT_TRUE(seen.insert(addr.to_string()).second) << addr;
    EXPECT_EQ(answerAddress(q, dns.answer(q)), addr);
    const auto v4 = addr.to_v4().to_bytes();
    EXPECT_NE(v4[3], 0);
    EXPECT_NE(v4[3], 255);
  }
  EXPECT_EQ(seen.count(kTunAddress4), 0U);
  EXPECT_EQ(seen.count(kResolverAddress), 0U);
}

TEST(VirtualDnsTest, NeverHandsOutTunOrResolverAddressOrBroadcastLikeOnes) {
  // Walk the whole IPv4 space of a large pool by asking for many names.
  VirtualDns dns(70000);
  for (int i = 0; i < 70000; ++i) {
    const auto q = query("n" + std::to_string(i) + ".t", kA);
    const auto b = answerAddress(q, dns.answer(q)).to_v4().to_bytes();
    ASSERT_EQ(b[0], 100);
    ASSERT_TRUE(b[1] >= 64 && b[1] <= 127);
    ASSERT_FALSE(b[1] == 64 && b[2] == 0) << "tun0's /24";
    ASSERT_FALSE(b[1] == 127 && b[2] == 255) << "the resolver's /24";
    ASSERT_NE(b[3], 0);
    ASSERT_NE(b[3], 255);
  }
}

TEST(VirtualDnsTest, OtherTypesGetNoErrorWithoutData) {
  VirtualDns dns;
  for (uint16_t type : {kTxt, kMx, uint16_t{33}, uint16_t{255}, uint16_t{12}}) {
    const auto r = dns.answer(query("api.example.com", type));
    EXPECT_EQ(rcode(r), 0) << type;
    EXPECT_EQ(ancount(r), 0) << type;
  }
  EXPECT_EQ(dns.liveNames(), 0U) << "no address is reserved for a TXT lookup";
}

TEST(VirtualDnsTest, InvalidNamesGetNxdomain) {
  VirtualDns dns;
  for (std::string_view name :
       {"under_score.example.com", "-lead.example.com", "trail-.example.com", "1.2.3.4", "host.123",
        "sp ace.example.com", "caf\xc3\xa9.example.com"}) {
    const auto r = dns.answer(query(name, kA));
    EXPECT_EQ(rcode(r), 3) << name;
    EXPECT_EQ(ancount(r), 0) << name;
  }
  // A label holding a literal dot must not read as two labels.
  std::string q = query("ab.example.com", kA);
  q[13] = '.';  // "a.b" as one label
  EXPECT_EQ(rcode(dns.answer(q)), 3);
  // The root name.
  EXPECT_EQ(rcode(dns.answer(query("", kA))), 3);
  EXPECT_EQ(dns.liveNames(), 0U);
  EXPECT_EQ(dns.stats().nxdomain, 9U);
}

TEST(VirtualDnsTest, LocalhostIsLoopbackAndNotRemembered) {
  VirtualDns dns;
  auto q = query("localhost", kA);
  EXPECT_EQ(answerAddress(q, dns.answer(q)), asio::ip::make_address("127.0.0.1"));
  q = query("x.localhost", kAaaa);
  EXPECT_EQ(answerAddress(q, dns.answer(q)), asio::ip::make_address("::1"));
  EXPECT_EQ(dns.liveNames(), 0U);
}

TEST(VirtualDnsTest, MalformedQueriesGetFormerr) {
  VirtualDns dns;
  const auto good = query("api.example.com", kA);
  // Too short for a header: FORMERR that still carries the ID.
  auto r = dns.answer(good.substr(0, 5));
  ASSERT_EQ(r.size(), 12U);
  EXPECT_EQ(get16(r, 0), 0x1234);
  EXPECT_EQ(rcode(r), 1);
  // Truncated question.
  EXPECT_EQ(rcode(dns.answer(good.substr(0, good.size() - 1))), 1);
  // Trailing garbage.
  EXPECT_EQ(rcode(dns.answer(good + "x")), 1);
  // QDCOUNT 0 and 2.
  for (uint16_t qd : {0, 2}) {
    auto bad = good;
    bad[5] = static_cast<char>(qd);
    EXPECT_EQ(rcode(dns.answer(bad)), 1) << qd;
  }
  // ANCOUNT set in a query.
  auto bad = good;
  bad[7] = 1;
  EXPECT_EQ(rcode(dns.answer(bad)), 1);
  // Reserved label type 0x40.
  bad = good;
  bad[12] = 0x43;
  EXPECT_EQ(rcode(dns.answer(bad)), 1);
  // Label length running past the end.
  bad = good;
  bad[12] = 60;
  EXPECT_EQ(rcode(dns.answer(bad)), 1);
  EXPECT_EQ(dns.liveNames(), 0U);
}

TEST(VirtualDnsTest, DropsResponsesAndTinyInputs) {
  VirtualDns dns;
  EXPECT_TRUE(dns.answer("").empty());
  EXPECT_TRUE(dns.answer("\x01").empty());
  auto resp = query("api.example.com", kA);
  resp[2] = static_cast<char>(resp[2] | 0x80);
  EXPECT_TRUE(dns.answer(resp).empty()) << "never answer a response (no reflection loops)";
}

TEST(VirtualDnsTest, NonQueryOpcodeIsNotImplemented) {
  VirtualDns dns;
  auto q = query("api.example.com", kA);
  q[2] = static_cast<char>(5 << 3);  // UPDATE
  EXPECT_EQ(rcode(dns.answer(q)), 4);
}

TEST(VirtualDnsTest, CompressionPointersBackwardOnlyNoLoops) {
  VirtualDns dns;
  std::string q;
  put16(&q, 7);
  put16(&q, 0);
  put16(&q, 1);
  q.append(6, '\0');
  // Pointer to itself (offset 12): a loop.
  std::string loop = q + std::string("\xC0\x0C", 2);
  put16(&loop, kA);
  put16(&loop, 1);
  EXPECT_EQ(rcode(dns.answer(loop)), 1);
  // Forward pointer.
  std::string fwd = q + std::string("\xC0\x0E\x00", 3);
  put16(&fwd, kA);
  put16(&fwd, 1);
  EXPECT_EQ(rcode(dns.answer(fwd)), 1);
  // Pointer into the header.
  std::string hdr = q + std::string("\xC0\x02", 2);
  put16(&hdr, kA);
  put16(&hdr, 1);
  EXPECT_EQ(rcode(dns.answer(hdr)), 1);
  // With one question, the name is the only thing before which a pointer could point, so
  // every pointer in a query is either into the header or a loop: all refused.
}

TEST(VirtualDnsTest, EdnsOptIsAnsweredWithOpt) {
  VirtualDns dns;
  const auto q = query("api.example.com", kA, 9, /*edns=*/true);
  const auto r = dns.answer(q);
  EXPECT_EQ(rcode(r), 0);
  EXPECT_EQ(ancount(r), 1);
  EXPECT_EQ(get16(r, 10), 1);  // ARCOUNT
  EXPECT_EQ(static_cast<uint8_t>(r[r.size() - 11]), 0);
  EXPECT_EQ(get16(r, r.size() - 10), 41);
  // EDNS version 1: BADVERS.
  auto v1 = q;
  v1[v1.size() - 5] = 1;
  const auto rb = dns.answer(v1);
  EXPECT_EQ(rcode(rb), 0);  // the low 4 bits of 16
  EXPECT_EQ(static_cast<uint8_t>(rb[rb.size() - 6]), 1) << "extended rcode 16 >> 4";
  // Two additional records: FORMERR.
  auto two = q;
  two[11] = 2;
  EXPECT_EQ(rcode(dns.answer(two)), 1);
}

TEST(VirtualDnsTest, PoolIsBoundedAndReusesOnlyIdleOldAddresses) {
  VirtualDns dns(4, std::chrono::seconds(10));
  const auto t0 = Clock::now();
  std::vector<asio::ip::address> addrs;
  for (int i = 0; i < 4; ++i) {
    const auto q = query("n" + std::to_string(i) + ".example", kA);
    addrs.push_back(answerAddress(q, dns.answer(q, t0)));
  }
  // Full, and every answer is recent: SERVFAIL, counted.
  EXPECT_EQ(rcode(dns.answer(query("late.example", kA), t0 + seconds(1))), 2);
  EXPECT_EQ(dns.stats().pool_exhausted, 1U);
  // n0 has a live flow; after the hold, n1 (oldest without a flow) is reused.
  dns.flowOpened(addrs[0]);
  const auto q = query("late.example", kA);
  const auto r = dns.answer(q, t0 + seconds(11));
  ASSERT_EQ(rcode(r), 0);
  EXPECT_EQ(answerAddress(q, r), addrs[1]);
  EXPECT_EQ(dns.nameFor(addrs[1]), "late.example") << "one address, one name at a time";
  EXPECT_EQ(dns.nameFor(addrs[0]), "n0.example");
  EXPECT_EQ(dns.liveNames(), 4U);
  EXPECT_EQ(dns.stats().evicted, 1U);
  // Once the flow closes, n0 can go too.
  dns.flowClosed(addrs[0]);
  dns.flowClosed(addrs[0]);  // an extra close is harmless
  const auto q2 = query("later.example", kA);
  EXPECT_EQ(answerAddress(q2, dns.answer(q2, t0 + seconds(12))), addrs[0]);
  EXPECT_FALSE(dns.nameFor(asio::ip::make_address("100.64.0.1")));
  EXPECT_FALSE(dns.nameFor(asio::ip::make_address("198.18.0.2")));
}

TEST(VirtualDnsTest, TenThousandRandomNamesStayBounded) {
  VirtualDns dns(1000, std::chrono::seconds(1));
  std::mt19937 rng(42);
  auto t = Clock::now();
  const std::string alphabet = "abcdefghijklmnopqrstuvwxyz0123456789";
  size_t answered = 0;
  for (int i = 0; i < 10000; ++i) {
    std::string name;
    for (int j = 0; j < 20; ++j) name.push_back(alphabet[rng() % alphabet.size()]);
    name += ".example.com";
    const auto r = dns.answer(query(name, (i % 2) != 0 ? kA : kAaaa), t);
    answered += rcode(r) == 0 ? 1 : 0;
    ASSERT_LE(dns.liveNames(), 1000U);
    t += std::chrono::milliseconds(1);
  }
  // 10 s of queries with a 1 s hold: most were answered, the rest refused with SERVFAIL.
  EXPECT_GT(answered, 9000U);
  EXPECT_EQ(answered + dns.stats().pool_exhausted, 10000U);
  EXPECT_GT(dns.stats().evicted, 8000U);
}

TEST(NormalizeNameTest, Rules) {
  EXPECT_EQ(normalizeName("Api.Example.COM."), "api.example.com");
  EXPECT_EQ(normalizeName("xn--caf-dma.example"), "xn--caf-dma.example");
  EXPECT_EQ(normalizeName("a"), "a");
  EXPECT_FALSE(normalizeName(""));
  EXPECT_FALSE(normalizeName("."));
  EXPECT_FALSE(normalizeName("a..b"));
  EXPECT_FALSE(normalizeName("a.b.."));
  EXPECT_FALSE(normalizeName(std::string(64, 'a') + ".com"));
  EXPECT_TRUE(normalizeName(std::string(63, 'a') + ".com"));
  std::string long_name;
  while (long_name.size() < 251) long_name += "abcdefghi.";
  long_name += "com";
  EXPECT_FALSE(normalizeName(long_name));
  EXPECT_FALSE(normalizeName("10.0.0.1"));
  EXPECT_FALSE(normalizeName("123"));
  EXPECT_TRUE(normalizeName("123.example"));
}

}  // namespace
}  // namespace vdns
