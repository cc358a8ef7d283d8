// The firewall's DNS forwarder: first the answer logic as a pure function over hostile query
// bytes (a fake resolver and admit callback stand in for getaddrinfo and nft, which the
// integration test runs for real), then the forwarder's own sockets on loopback.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "common/unique_fd.h"
#include "compass-runner/backend.h"
#include "compass-runner/dns_answer.h"
#include "compass-runner/dns_forwarder.h"

namespace runner::firewall {
namespace {

using asio::ip::make_address;
constexpr uint16_t kA = 1, kAaaa = 28, kTxt = 16, kAny = 255;
constexpr uint8_t kNoError = 0, kFormErr = 1, kServFail = 2, kNxDomain = 3, kNotImp = 4,
                  kRefused = 5;

// A query by hand: header, the labels as given (any bytes), type and class.
std::string rawQuery(uint16_t id, const std::vector<std::string>& labels, uint16_t qtype,
                     uint16_t qclass = 1, uint16_t qdcount = 1, uint8_t flags1 = 0x01) {
  std::string q;
  q += static_cast<char>(id >> 8);
  q += static_cast<char>(id & 0xff);
  q += static_cast<char>(flags1);
  q += '\0';
  q += static_cast<char>(qdcount >> 8);
  q += static_cast<char>(qdcount & 0xff);
  q += std::string(6, '\0');
  for (const auto& l : labels) {
    q += static_cast<char>(l.size());
    q += l;
  }
  q += '\0';
  q += static_cast<char>(qtype >> 8);
  q += static_cast<char>(qtype & 0xff);
  q += static_cast<char>(qclass >> 8);
  q += static_cast<char>(qclass & 0xff);
  return q;
}

uint8_t rcodeOf(const std::string& reply) { return static_cast<uint8_t>(reply.at(3)) & 0x0f; }

class AnswerTest : public ::testing::Test {
 protected:
  AnswerTest() {
    for (const char* e :
         {"allowed.example", "*.wild.example", "api.example:443", "xn--bcher-kva.example"}) {
      allow_.add(policy::parseAllowRule(e));
    }
    resolution_.status = Resolution::Status::kOk;
    resolution_.addresses = {make_address("198.51.100.7"), make_address("2001:db8::7")};
  }

  Answer ask(const std::string& query, size_t max_reply = kMaxUdpReply) {
    AnswerContext ctx;
    ctx.allow = &allow_;
    ctx.resolve = [this](const std::string& name) {
      resolved_.push_back(name);
      return resolution_;
    };
    ctx.admit = [this](const std::vector<AllowElement>& e) {
      admitted_.insert(admitted_.end(), e.begin(), e.end());
      return admit_ok_;
    };
    ctx.local = [](const asio::ip::address& a) { return a == make_address("192.0.2.2"); };
    ctx.max_reply = max_reply;
    return answerQuery(query, ctx);
  }

  Answer askName(const std::string& name, uint16_t qtype) {
    return ask(buildQuery(0x1234, name, qtype));
  }

  policy::Allowlist allow_;
  Resolution resolution_;
  bool admit_ok_ = true;
  std::vector<std::string> resolved_;
  std::vector<AllowElement> admitted_;
};

TEST_F(AnswerTest, AllowedNameIsAnsweredAndOpenedFirst) {
  const Answer a = askName("allowed.example", kA);
  const ParsedReply r = parseReply(a.reply);
  EXPECT_EQ(r.id, 0x1234);
  EXPECT_EQ(r.rcode, kNoError);
  EXPECT_EQ(r.addresses, std::vector<asio::ip::address>{make_address("198.51.100.7")});
  EXPECT_EQ(a.reason, "");
  EXPECT_EQ(resolved_, std::vector<std::string>{"allowed.example"});
  ASSERT_EQ(admitted_.size(), 1u);
  EXPECT_EQ(admitted_[0].address, make_address("198.51.100.7"));
  EXPECT_FALSE(admitted_[0].port);
  EXPECT_EQ(admitted_[0].name, "allowed.example");

  admitted_.clear();
  const ParsedReply r6 = parseReply(askName("allowed.example", kAaaa).reply);
  EXPECT_EQ(r6.addresses, std::vector<asio::ip::address>{make_address("2001:db8::7")});
  ASSERT_EQ(admitted_.size(), 1u);
  EXPECT_EQ(admitted_[0].address, make_address("2001:db8::7"));
}

TEST_F(AnswerTest, UpperCaseAndTrailingDotAreTheSameName) {
  const Answer a = ask(rawQuery(7, {"ALLOWED", "Example"}, kA));
  EXPECT_EQ(rcodeOf(a.reply), kNoError);
  EXPECT_EQ(a.name, "allowed.example");
  // The question comes back as it was asked (stubs using 0x20 case randomisation compare it).
  EXPECT_NE(a.reply.find("ALLOWED"), std::string::npos);
  EXPECT_EQ(parseReply(askName("allowed.example.", kA).reply).rcode, kNoError);
}

TEST_F(AnswerTest, DeniedNameIsRefusedWithoutResolvingIt) {
  for (const char* name : {"denied.example", "allowed.example.evil.com", "evil.com.allowed.example",
                           "wild.example", "xallowed.example", "example"}) {
    const Answer a = askName(name, kA);
    EXPECT_EQ(rcodeOf(a.reply), kRefused) << name;
    EXPECT_EQ(a.reason, "denied-name") << name;
  }
  EXPECT_TRUE(resolved_.empty());  // nothing about a denied name leaves the host
  EXPECT_TRUE(admitted_.empty());
}

TEST_F(AnswerTest, WildcardAllowsSubdomainsAtAnyDepthOnly) {
  EXPECT_EQ(rcodeOf(askName("a.wild.example", kA).reply), kNoError);
  EXPECT_EQ(rcodeOf(askName("evil.com.wild.example", kA).reply), kNoError);  // a subdomain
  EXPECT_EQ(rcodeOf(askName("wild.example.evil.com", kA).reply), kRefused);
  EXPECT_EQ(rcodeOf(askName("wild.example", kA).reply), kRefused);
}

TEST_F(AnswerTest, HostPortRuleOpensOnlyThatPort) {
  EXPECT_EQ(rcodeOf(askName("api.example", kA).reply), kNoError);
  ASSERT_EQ(admitted_.size(), 1u);
  EXPECT_EQ(admitted_[0].port, 443);
}

TEST_F(AnswerTest, DotInsideALabelIsNotASeparator) {
  // One label "allowed.example": in text it would read like the allowed name.
  const Answer a = ask(rawQuery(9, {"allowed.example"}, kA));
  EXPECT_EQ(rcodeOf(a.reply), kRefused);
  EXPECT_EQ(a.reason, "invalid-name");
  EXPECT_EQ(rcodeOf(ask(rawQuery(9, {"evil.com", "allowed", "example"}, kA)).reply), kRefused);
  EXPECT_TRUE(resolved_.empty());
}

TEST_F(AnswerTest, NonAsciiAndOtherBytesAreInvalidNames) {
  for (const std::string& label :
       {std::string("b\xc3\xbc"
                    "cher"),
        std::string("a_b"), std::string("a b"), std::string("a\0b", 3), std::string("-lead")}) {
    const Answer a = ask(rawQuery(9, {label, "example"}, kA));
    EXPECT_EQ(rcodeOf(a.reply), kRefused) << label;
    EXPECT_EQ(a.reason, "invalid-name") << label;
  }
  EXPECT_EQ(rcodeOf(askName("xn--bcher-kva.example", kA).reply), kNoError);  // punycode
}

TEST_F(AnswerTest, IpLiteralAndRootAreNotNames) {
  EXPECT_EQ(ask(rawQuery(1, {"127", "0", "0", "1"}, kA)).reason, "invalid-name");
  EXPECT_EQ(ask(rawQuery(1, {}, kA)).reason, "invalid-name");
  EXPECT_TRUE(resolved_.empty());
}

TEST_F(AnswerTest, OversizedLabelsAndNamesAreMalformed) {
  const Answer label = ask(rawQuery(3, {std::string(64, 'a'), "example"}, kA));
  EXPECT_EQ(rcodeOf(label.reply), kFormErr);
  EXPECT_EQ(label.reason, "malformed");
  // Five labels of 50: 256 bytes on the wire, more than RFC 1035's 255 (253 in text).
  const std::string l50(50, 'a');
  EXPECT_EQ(rcodeOf(ask(rawQuery(3, {l50, l50, l50, l50, l50}, kA)).reply), kFormErr);
  // Four labels of 62: 253 bytes of text, the most a name may have; valid but not allowed.
  const std::string l62(62, 'a');
  EXPECT_EQ(ask(rawQuery(3, {l62, l62, l62, l62}, kA)).reason, "denied-name");
}

TEST_F(AnswerTest, CompressionLoopsAreMalformed) {
  std::string self = rawQuery(4, {}, kA);
  // The question's name: a pointer to itself (offset 12).
  self.replace(12, 1, std::string("\xc0\x0c", 2));
  EXPECT_EQ(rcodeOf(ask(self).reply), kFormErr);
  std::string forward = rawQuery(4, {}, kA);
  forward.replace(12, 1, std::string("\xc0\x20", 2));  // past the end
  EXPECT_EQ(rcodeOf(ask(forward).reply), kFormErr);
  std::string two = rawQuery(4, {"a"}, kA);  // "a" then a pointer back to "a"
  two.replace(14, 1, std::string("\xc0\x0c", 2));
  EXPECT_EQ(rcodeOf(ask(two).reply), kFormErr);
  // A question name that is a pointer into the header: ID 0x0161 and a zero flags byte spell
  // the name "a", which would be refused as a denied name if the pointer were followed.
  std::string into_header = rawQuery(0x0161, {}, kA, 1, 1, 0x00);
  into_header.replace(12, 1, std::string("\xc0\x00", 2));
  EXPECT_EQ(rcodeOf(ask(into_header).reply), kFormErr);
  EXPECT_TRUE(resolved_.empty());
}

TEST_F(AnswerTest, TruncatedPackets) {
  const std::string full = buildQuery(0xabcd, "allowed.example", kA);
  for (size_t n = 2; n < full.size(); ++n) {
    const Answer a = ask(full.substr(0, n));
    ASSERT_FALSE(a.reply.empty()) << n;
    EXPECT_EQ(rcodeOf(a.reply), kFormErr) << n;
    EXPECT_EQ(a.reply.substr(0, 2), "\xab\xcd") << n;  // the ID is echoed
  }
  EXPECT_TRUE(ask(full.substr(0, 1)).reply.empty());
  EXPECT_TRUE(ask("").reply.empty());
  EXPECT_TRUE(resolved_.empty());
}

TEST_F(AnswerTest, QuestionCountMustBeOne) {
  EXPECT_EQ(rcodeOf(ask(rawQuery(5, {"allowed", "example"}, kA, 1, 0)).reply), kFormErr);
  std::string two = rawQuery(5, {"allowed", "example"}, kA, 1, 2);
  two += two.substr(12);  // the same question twice
  EXPECT_EQ(rcodeOf(ask(two).reply), kFormErr);
  EXPECT_TRUE(resolved_.empty());
}

TEST_F(AnswerTest, AnswersAndNonOptAdditionalsAreMalformed) {
  std::string q = buildQuery(6, "allowed.example", kA);
  q[7] = 1;  // ANCOUNT 1 without a record
  EXPECT_EQ(rcodeOf(ask(q).reply), kFormErr);
  // An OPT record (EDNS0) is what stubs send: accepted, answered without one.
  std::string edns = buildQuery(6, "allowed.example", kA);
  edns[11] = 1;
  edns += std::string("\0\0\x29\x04\xd0\0\0\0\0\0\0", 11);
  EXPECT_EQ(rcodeOf(ask(edns).reply), kNoError);
  // A TXT record in the additional section is not.
  std::string txt = buildQuery(6, "allowed.example", kA);
  txt[11] = 1;
  txt += std::string("\0\0\x10\0\x01\0\0\0\0\0\x02\x01x", 13);
  EXPECT_EQ(rcodeOf(ask(txt).reply), kFormErr);
}

TEST_F(AnswerTest, AnOptNotOwnedByTheRootOrBytesAfterTheLastRecordAreMalformed) {
  // An OPT record owned by a name ("x") instead of the root.
  std::string named = buildQuery(7, "allowed.example", kA);
  named[11] = 1;
  named += std::string("\x01x\0\0\x29\x04\xd0\0\0\0\0\0\0", 13);
  EXPECT_EQ(rcodeOf(ask(named).reply), kFormErr);
  // A well-formed query followed by bytes no count accounts for.
  std::string trailing = buildQuery(7, "allowed.example", kA) + "junk";
  EXPECT_EQ(rcodeOf(ask(trailing).reply), kFormErr);
  // An OPT whose RDLENGTH runs past the end.
  std::string overrun = buildQuery(7, "allowed.example", kA);
  overrun[11] = 1;
  overrun += std::string("\0\0\x29\x04\xd0\0\0\0\0\0\x10", 11);
  EXPECT_EQ(rcodeOf(ask(overrun).reply), kFormErr);
  EXPECT_TRUE(resolved_.empty());
}

TEST_F(AnswerTest, TheAnswerEchoesTheQuestionAsSentAndPointsAtIt) {
  const std::string q = rawQuery(0x4242, {"Allowed", "EXAMPLE"}, kA);
  const Answer a = ask(q);
  ASSERT_EQ(rcodeOf(a.reply), kNoError);
  // Header, then the question byte for byte (letter case as sent).
  EXPECT_EQ(a.reply.substr(12, q.size() - 12), q.substr(12));
  // The one answer's owner is a pointer to offset 12 (RFC 1035 §4.1.4).
  EXPECT_EQ(a.reply.substr(q.size(), 2), std::string("\xc0\x0c", 2));
  EXPECT_EQ(parseReply(a.reply).addresses,
            std::vector<asio::ip::address>{make_address("198.51.100.7")});
}

TEST(ParseReplyTest, HostileRepliesThrowInsteadOfReadingPastTheEnd) {
  const std::string q = buildQuery(1, "allowed.example", kA);
  std::string reply = q;
  reply[2] = static_cast<char>(0x81);
  reply[7] = 1;  // one answer
  // Owner: a pointer to itself (a loop), then type A, class IN, TTL, RDLENGTH 4, address.
  const size_t self = reply.size();
  reply += static_cast<char>(0xc0);
  reply += static_cast<char>(self);
  reply += std::string("\0\x01\0\x01\0\0\0\x1e\0\x04\xc6\x33\x64\x07", 14);
  EXPECT_THROW(parseReply(reply), std::invalid_argument);
  // RDLENGTH past the end of the message.
  std::string longer = q;
  longer[2] = static_cast<char>(0x81);
  longer[7] = 1;
  longer += std::string("\xc0\x0c\0\x01\0\x01\0\0\0\x1e\0\x40\xc6\x33", 14);
  EXPECT_THROW(parseReply(longer), std::invalid_argument);
  EXPECT_THROW(parseReply("\x01"), std::invalid_argument);
  EXPECT_THROW(buildQuery(1, std::string(64, 'a') + ".example", kA), std::invalid_argument);
}

TEST_F(AnswerTest, AnswersAreNeverQueriedBack) {
  const Answer a = ask(rawQuery(8, {"allowed", "example"}, kA, 1, 1, 0x81));
  EXPECT_TRUE(a.reply.empty());
  EXPECT_EQ(a.reason, "not-a-query");
}

TEST_F(AnswerTest, OtherOpcodesAndClasses) {
  EXPECT_EQ(rcodeOf(ask(rawQuery(8, {"allowed", "example"}, kA, 1, 1, 0x10)).reply), kNotImp);
  const Answer chaos = ask(rawQuery(8, {"allowed", "example"}, kA, 3));
  EXPECT_EQ(rcodeOf(chaos.reply), kRefused);
  EXPECT_EQ(chaos.reason, "class-not-in");
}

TEST_F(AnswerTest, OtherTypesOfAllowedNamesGetNoData) {
  for (uint16_t t : {kAny, kTxt, uint16_t{15}, uint16_t{252}}) {
    const Answer a = askName("allowed.example", t);
    EXPECT_EQ(rcodeOf(a.reply), kNoError) << t;
    EXPECT_TRUE(parseReply(a.reply).addresses.empty()) << t;
  }
  EXPECT_TRUE(resolved_.empty());
  EXPECT_EQ(rcodeOf(askName("denied.example", kAny).reply), kRefused);
  EXPECT_EQ(rcodeOf(askName("denied.example", kTxt).reply), kRefused);
}

TEST_F(AnswerTest, ForbiddenAddressesAreNeverAnswered) {
  resolution_.addresses = {make_address("127.0.0.1"),
                           make_address("169.254.169.254"),
                           make_address("::1"),
                           make_address("::ffff:127.0.0.1"),
                           make_address("::ffff:198.51.100.7"),
                           make_address("fe80::1"),
                           make_address("0.0.0.0"),
                           make_address("224.0.0.1"),
                           make_address("ff02::1"),
                           make_address("10.231.0.5"),
                           make_address("fd5a:7c3e:91b4::1"),
                           make_address("192.0.2.2")};
  for (uint16_t t : {kA, kAaaa}) {
    const Answer a = askName("allowed.example", t);
    const ParsedReply r = parseReply(a.reply);
    EXPECT_EQ(r.rcode, kNoError);
    EXPECT_TRUE(r.addresses.empty()) << t;
    EXPECT_EQ(a.reason, "forbidden-address");
  }
  EXPECT_TRUE(admitted_.empty());

  resolution_.addresses = {make_address("127.0.0.1"), make_address("198.51.100.7")};
  const Answer mixed = askName("allowed.example", kA);
  EXPECT_EQ(parseReply(mixed.reply).addresses,
            std::vector<asio::ip::address>{make_address("198.51.100.7")});
  EXPECT_EQ(mixed.filtered, std::vector<asio::ip::address>{make_address("127.0.0.1")});
  ASSERT_EQ(admitted_.size(), 1u);
  EXPECT_EQ(admitted_[0].address, make_address("198.51.100.7"));
}

TEST_F(AnswerTest, ResolverOutcomes) {
  resolution_ = {Resolution::Status::kNoName, {}};
  EXPECT_EQ(rcodeOf(askName("allowed.example", kA).reply), kNxDomain);
  resolution_ = {Resolution::Status::kNoData, {}};
  EXPECT_EQ(rcodeOf(askName("allowed.example", kA).reply), kNoError);
  resolution_ = {Resolution::Status::kTimedOut, {}};
  const Answer slow = askName("allowed.example", kA);
  EXPECT_EQ(rcodeOf(slow.reply), kServFail);
  EXPECT_EQ(slow.reason, "resolve-timeout");
  resolution_ = {Resolution::Status::kFailed, {}};
  EXPECT_EQ(askName("allowed.example", kA).reason, "resolve-failed");
  EXPECT_TRUE(admitted_.empty());
}

TEST_F(AnswerTest, NothingIsAnsweredThatCouldNotBeOpened) {
  admit_ok_ = false;
  const Answer a = askName("allowed.example", kA);
  EXPECT_EQ(rcodeOf(a.reply), kServFail);
  EXPECT_EQ(a.reason, "admit-failed");
  EXPECT_TRUE(parseReply(a.reply).addresses.empty());
}

TEST_F(AnswerTest, AnswersAreCappedAndTruncatedToFit) {
  resolution_.addresses.clear();
  for (int i = 1; i <= 40; ++i) {
    resolution_.addresses.push_back(make_address("198.51.100." + std::to_string(i)));
  }
  EXPECT_EQ(parseReply(askName("allowed.example", kA).reply).addresses.size(), kMaxAnswerAddresses);
  const Answer small = ask(buildQuery(1, "allowed.example", kA), 60);
  const ParsedReply r = parseReply(small.reply);
  EXPECT_TRUE(r.truncated);
  EXPECT_TRUE(r.addresses.empty());
  EXPECT_LE(small.reply.size(), 60u);
}

TEST(AnswerContextTest, MissingCallbacksAreABugNotAnAnswer) {
  AnswerContext ctx;
  EXPECT_THROW(answerQuery("xx", ctx), std::invalid_argument);
}

// ---- The forwarder's own sockets, on loopback (its answers for a loopback name are empty:
// ---- 127.0.0.1 is never answered, which is also what this checks end to end).

std::string exchangeUdp(uint16_t port, const std::string& query, int timeout_ms = 5000) {
  common::UniqueFd s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::sendto(s.get(), query.data(), query.size(), 0, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
  pollfd p{s.get(), POLLIN, 0};
  if (::poll(&p, 1, timeout_ms) != 1) return {};
  std::string buf(4096, '\0');
  const ssize_t n = ::recv(s.get(), buf.data(), buf.size(), 0);
  return n > 0 ? buf.substr(0, static_cast<size_t>(n)) : std::string();
}

common::UniqueFd connectTcp(uint16_t port) {
  common::UniqueFd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(s.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) return {};
  return s;
}

std::string exchangeTcp(int fd, const std::string& query) {
  std::string framed;
  framed += static_cast<char>(query.size() >> 8);
  framed += static_cast<char>(query.size() & 0xff);
  framed += query;
  if (::send(fd, framed.data(), framed.size(), MSG_NOSIGNAL) < 0) return {};
  std::string got;
  char buf[4096];
  const auto want = [&got] {
    return 2 + ((size_t{static_cast<uint8_t>(got[0])} << 8) | static_cast<uint8_t>(got[1]));
  };
  while (got.size() < 2 || got.size() < want()) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 5000) != 1) return {};
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return {};
    got.append(buf, static_cast<size_t>(n));
  }
  return got.substr(2);
}

uint16_t freePort() {
  common::UniqueFd s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(s.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa);
  socklen_t len = sizeof sa;
  ::getsockname(s.get(), reinterpret_cast<sockaddr*>(&sa), &len);
  return ntohs(sa.sin_port);
}

class ForwarderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    port_ = freePort();
    ForwarderConfig cfg;
    cfg.id = "unit";
    cfg.allow.add(policy::parseAllowRule("localhost"));
    cfg.listen = {make_address("127.0.0.1")};
    cfg.port = port_;
    cfg.admit = [this](const std::vector<AllowElement>& e) {
      admits_ += static_cast<int>(e.size());
      return true;
    };
    forwarder_ = std::make_unique<DnsForwarder>(std::move(cfg));
    forwarder_->start();
  }

  uint16_t port_ = 0;
  std::atomic<int> admits_{0};
  std::unique_ptr<DnsForwarder> forwarder_;
};

TEST_F(ForwarderTest, UdpRefusesDeniedAndNeverAnswersLoopback) {
  const ParsedReply denied = parseReply(exchangeUdp(port_, buildQuery(11, "denied.example", kA)));
  EXPECT_EQ(denied.id, 11);
  EXPECT_EQ(denied.rcode, kRefused);
  const ParsedReply local = parseReply(exchangeUdp(port_, buildQuery(12, "localhost", kA)));
  EXPECT_EQ(local.rcode, kNoError);
  EXPECT_TRUE(local.addresses.empty());  // 127.0.0.1 filtered out
  EXPECT_EQ(admits_, 0);
  const ForwarderStats s = forwarder_->stats();
  EXPECT_EQ(s.queries, 2u);
  EXPECT_EQ(s.refused, 2u);  // denied-name, forbidden-address
}

TEST_F(ForwarderTest, TcpAnswersSeveralQueriesOnOneConnection) {
  const common::UniqueFd c = connectTcp(port_);
  ASSERT_TRUE(c.valid());
  for (uint16_t id = 1; id <= 3; ++id) {
    const ParsedReply r = parseReply(exchangeTcp(c.get(), buildQuery(id, "denied.example", kA)));
    EXPECT_EQ(r.id, id);
    EXPECT_EQ(r.rcode, kRefused);
  }
}

TEST_F(ForwarderTest, TcpClientsBeyondTheCapAreClosed) {
  std::vector<common::UniqueFd> held;
  for (int i = 0; i < kMaxTcpClients; ++i) {
    held.push_back(connectTcp(port_));
    ASSERT_TRUE(held.back().valid());
    // One exchange each, so every connection has been accepted and counted.
    ASSERT_FALSE(exchangeTcp(held.back().get(), buildQuery(1, "denied.example", kA)).empty());
  }
  const common::UniqueFd extra = connectTcp(port_);
  ASSERT_TRUE(extra.valid());
  EXPECT_TRUE(exchangeTcp(extra.get(), buildQuery(2, "denied.example", kA)).empty());
  held.pop_back();  // one leaves: a new client is served again
  // Once the forwarder has seen that close (its own thread, so not at once): polled for up to
  // 5 s, not a fixed number of tries, which a busy machine could exhaust before it looks.
  bool served = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!served && std::chrono::steady_clock::now() < deadline) {
    const common::UniqueFd c = connectTcp(port_);
    served = !exchangeTcp(c.get(), buildQuery(3, "denied.example", kA)).empty();
    if (!served) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(served);
}

TEST_F(ForwarderTest, StopClosesTheSocketsAndIsIdempotent) {
  forwarder_->stop();
  forwarder_->stop();
  EXPECT_TRUE(exchangeUdp(port_, buildQuery(1, "denied.example", kA), 300).empty());
}

TEST(ForwarderBind, AnAddressNotOnTheHostIsARunnerError) {
  ForwarderConfig cfg;
  cfg.listen = {make_address("203.0.113.77")};  // TEST-NET-3, on no interface here
  cfg.port = freePort();
  cfg.admit = [](const std::vector<AllowElement>&) { return true; };
  DnsForwarder f(std::move(cfg));
  try {
    f.start();
    FAIL() << "bind to a foreign address succeeded";
  } catch (const RunnerError& e) {
    EXPECT_NE(std::string(e.what()).find("dns forwarder: bind 203.0.113.77:"), std::string::npos)
        << e.what();
  }
}

TEST(ResolveOnHost, LocalhostResolvesFromEtcHosts) {
  const Resolution r = resolveOnHost("localhost", std::chrono::seconds(5));
  ASSERT_EQ(r.status, Resolution::Status::kOk);
  EXPECT_FALSE(r.addresses.empty());
}

}  // namespace
}  // namespace runner::firewall
