#include "proto/tunnel_request.h"

#include <gtest/gtest.h>

namespace proto {
namespace {

using Status = TunnelRequestParser::Status;

TEST(TunnelRequestTest, ConnectInOneFeedLeavesTunnelBytesUnread) {
  TunnelRequestParser p;
  const std::string head =
      "CONNECT api.github.com:443 HTTP/1.1\r\nHost: api.github.com:443\r\n\r\n";
  ASSERT_EQ(p.feed(head + "\x16\x03\x01 tls bytes"), Status::kComplete);
  EXPECT_EQ(p.request().kind, TunnelKind::kConnectTcp);
  EXPECT_EQ(p.request().authority, "api.github.com:443");
  EXPECT_EQ(p.consumed(), head.size());
}

TEST(TunnelRequestTest, ConnectByteByByte) {
  TunnelRequestParser p;
  const std::string head = "CONNECT [2001:db8::1]:80 HTTP/1.1\r\nHost: x\r\n\r\n";
  for (size_t i = 0; i + 1 < head.size(); ++i) {
    ASSERT_EQ(p.feed(head.substr(i, 1)), Status::kNeedMore) << i;
  }
  ASSERT_EQ(p.feed(head.substr(head.size() - 1)), Status::kComplete);
  EXPECT_EQ(p.request().authority, "[2001:db8::1]:80");
  EXPECT_EQ(p.consumed(), 1u);
}

TEST(TunnelRequestTest, ConnectUdpUpgrade) {
  TunnelRequestParser p;
  ASSERT_EQ(p.feed("GET /.well-known/masque/udp/dns.example/53/ HTTP/1.1\r\nHost: x\r\n"
                   "Connection: keep-alive, Upgrade\r\nUpgrade: connect-udp\r\n"
                   "Capsule-Protocol: ?1\r\n\r\n"),
            Status::kComplete);
  EXPECT_EQ(p.request().kind, TunnelKind::kConnectUdp);
  EXPECT_EQ(p.request().authority, "dns.example:53");
}

TEST(TunnelRequestTest, ConnectUdpPercentEncodedIpv6IsBracketed) {
  std::string authority, reason;
  ASSERT_TRUE(
      connectUdpAuthority("/.well-known/masque/udp/2001%3Adb8%3A%3A1/443/", &authority, &reason));
  EXPECT_EQ(authority, "[2001:db8::1]:443");
}

TEST(TunnelRequestTest, ConnectUdpBadPaths) {
  std::string authority, reason;
  for (const char* path :
       {"/", "/.well-known/masque/udp/", "/.well-known/masque/udp/a/",
        "/.well-known/masque/udp/a/53", "/.well-known/masque/udp//53/",
        "/.well-known/masque/udp/a//", "/.well-known/masque/udp/a/5/3/",
        "/.well-known/masque/udp/a%2/53/", "/.well-known/masque/udp/a%zz/53/", "/other/a/53/"}) {
    EXPECT_FALSE(connectUdpAuthority(path, &authority, &reason)) << path;
    EXPECT_FALSE(reason.empty());
  }
}

TEST(TunnelRequestTest, ConnectUdpWithoutCapsuleProtocolIsMalformed) {
  TunnelRequestParser p;
  EXPECT_EQ(p.feed("GET /.well-known/masque/udp/a/53/ HTTP/1.1\r\nHost: x\r\n"
                   "Connection: Upgrade\r\nUpgrade: connect-udp\r\n\r\n"),
            Status::kMalformed);
}

TEST(TunnelRequestTest, PlainProxyRequestIsNotServed) {
  TunnelRequestParser p;
  EXPECT_EQ(p.feed("GET http://evil.example/ HTTP/1.1\r\nHost: evil.example\r\n\r\n"),
            Status::kMethodNotAllowed);
  TunnelRequestParser q;
  EXPECT_EQ(q.feed("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n"),
            Status::kMalformed);  // a body on a tunnel request is refused before the method
}

TEST(TunnelRequestTest, ConnectWithBodyFramingIsMalformed) {
  TunnelRequestParser p;
  EXPECT_EQ(p.feed("CONNECT a.example:443 HTTP/1.1\r\nContent-Length: 5\r\n\r\n"),
            Status::kMalformed);
}

TEST(TunnelRequestTest, Http10IsMalformed) {
  TunnelRequestParser p;
  EXPECT_EQ(p.feed("CONNECT a.example:443 HTTP/1.0\r\n\r\n"), Status::kMalformed);
}

TEST(TunnelRequestTest, GarbageIsMalformedAndSticky) {
  TunnelRequestParser p;
  EXPECT_EQ(p.feed("\x16\x03\x01\x02\x00 hello"), Status::kMalformed);
  EXPECT_FALSE(p.error().empty());
  EXPECT_EQ(p.feed("CONNECT a.example:443 HTTP/1.1\r\n\r\n"), Status::kMalformed);
}

TEST(TunnelRequestTest, OversizedHeadIsTooLarge) {
  TunnelRequestParser p;
  ASSERT_EQ(p.feed("CONNECT a.example:443 HTTP/1.1\r\n"), Status::kNeedMore);
  Status s = Status::kNeedMore;
  for (int i = 0; i < 100 && s == Status::kNeedMore; ++i) {
    s = p.feed("X-Padding: " + std::string(200, 'a') + "\r\n");
  }
  EXPECT_EQ(s, Status::kTooLarge);
}

TEST(TunnelRequestTest, ManySmallHeadersAreTooLarge) {
  TunnelRequestParser p;
  std::string head = "CONNECT a.example:443 HTTP/1.1\r\n";
  for (size_t i = 0; i <= kMaxHeaderFields; ++i) head += "A: b\r\n";
  EXPECT_EQ(p.feed(head + "\r\n"), Status::kTooLarge);
}

TEST(TunnelRequestTest, ErrorResponseNamesTheReason) {
  const std::string r = errorResponse(403, "not-allowlisted");
  EXPECT_EQ(r.rfind("HTTP/1.1 403 Forbidden\r\n", 0), 0u);
  EXPECT_NE(r.find("\r\nBoundary-Reason: not-allowlisted\r\n"), std::string::npos);
  EXPECT_NE(r.find("Connection: close"), std::string::npos);
}

TEST(TunnelRequestTest, ReasonPhrasesOfTheStatusesAnswered) {
  EXPECT_EQ(reasonPhrase(400), "Bad Request");
  EXPECT_EQ(reasonPhrase(403), "Forbidden");
  EXPECT_EQ(reasonPhrase(405), "Method Not Allowed");
  EXPECT_EQ(reasonPhrase(408), "Request Timeout");
  EXPECT_EQ(reasonPhrase(421), "Misdirected Request");
  EXPECT_EQ(reasonPhrase(431), "Request Header Fields Too Large");
  EXPECT_EQ(reasonPhrase(502), "Bad Gateway");
  EXPECT_EQ(reasonPhrase(503), "Service Unavailable");
  EXPECT_EQ(reasonPhrase(504), "Gateway Timeout");
  // Any other status has no phrase here: each caller supplies its own fallback.
  EXPECT_TRUE(reasonPhrase(200).empty());
  EXPECT_TRUE(reasonPhrase(404).empty());
  EXPECT_TRUE(reasonPhrase(0).empty());
  EXPECT_TRUE(reasonPhrase(-1).empty());
}

TEST(TunnelRequestTest, ErrorResponseFallsBackToErrorForUnlistedStatuses) {
  const std::string r = errorResponse(418, "");
  EXPECT_EQ(r.rfind("HTTP/1.1 418 Error\r\n", 0), 0u) << r;
  EXPECT_TRUE(r.ends_with("\r\n\r\nError\n")) << r;
  EXPECT_EQ(r.find("Boundary-Reason"), std::string::npos) << r;
  EXPECT_EQ(errorResponse(408, "header-timeout").rfind("HTTP/1.1 408 Request Timeout\r\n", 0), 0u);
}

}  // namespace
}  // namespace proto
