// The boundary's address forms and the tunnel requests nano-init sends, checked against
// sam-box's own request parser (proto), so both ends agree on the wire.

#include "netstack/boundary.h"

#include "netstack/ingress.h"
#include "netstack/limits.h"
#include "netstack/packet.h"
#include "proto/capsule.h"
#include "proto/tunnel_request.h"
#include "sam-box/limits.h"

#include <linux/vm_sockets.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <gtest/gtest.h>

namespace netstack {
namespace {

TEST(BoundaryTest, UnixPath) {
  std::string error;
  auto a = parseBoundary("/run/agent.sock", &error);
  ASSERT_TRUE(a) << error;
  EXPECT_EQ(a->kind, BoundaryAddress::Kind::kUnix);
  EXPECT_EQ(a->path, "/run/agent.sock");
  const auto ep = boundaryEndpoint(*a);
  EXPECT_EQ(ep.protocol().family(), AF_UNIX);
  const auto* un = reinterpret_cast<const sockaddr_un*>(ep.data());
  EXPECT_STREQ(un->sun_path, "/run/agent.sock");
}

TEST(BoundaryTest, VsockAddress) {
  std::string error;
  auto a = parseBoundary("vsock://2:1080", &error);
  ASSERT_TRUE(a) << error;
  EXPECT_EQ(a->kind, BoundaryAddress::Kind::kVsock);
  EXPECT_EQ(a->cid, 2u);
  EXPECT_EQ(a->port, 1080u);
  const auto ep = boundaryEndpoint(*a);
  EXPECT_EQ(ep.protocol().family(), AF_VSOCK);
  EXPECT_EQ(ep.size(), sizeof(sockaddr_vm));
  const auto* vm = reinterpret_cast<const sockaddr_vm*>(ep.data());
  EXPECT_EQ(vm->svm_cid, 2u);
  EXPECT_EQ(vm->svm_port, 1080u);
  auto max = parseBoundary("vsock://4294967295:4294967295", &error);
  ASSERT_TRUE(max);
  EXPECT_EQ(max->cid, 4294967295u);
}

TEST(BoundaryTest, RejectsMalformedAddresses) {
  for (const char* bad : {"", "vsock://", "vsock://2", "vsock://2:", "vsock://:1080",
                          "vsock://a:1080", "vsock://2:10x", "vsock://-1:5", "vsock://2:+5",
                          "vsock://4294967296:1", "vsock://2:99999999999", "vsock:// 2:1"}) {
    std::string error;
    EXPECT_FALSE(parseBoundary(bad, &error)) << bad;
    EXPECT_FALSE(error.empty()) << bad;
  }
  std::string error;
  EXPECT_FALSE(parseBoundary(std::string(sizeof(sockaddr_un::sun_path), 'x'), &error));
  EXPECT_TRUE(parseBoundary(std::string(sizeof(sockaddr_un::sun_path) - 1, 'x'), &error));
  EXPECT_FALSE(parseBoundary(std::string("/a\0b", 4), &error));
}

TEST(BoundaryTest, AuthorityIsTheNameOrTheLiteral) {
  const auto v4 = Endpoint::from(asio::ip::make_address("100.64.0.9"), 443);
  const auto v6 = Endpoint::from(asio::ip::make_address("2001:db8::2"), 80);
  EXPECT_EQ(tunnelAuthority(v4, std::string("api.example.com")), "api.example.com:443");
  EXPECT_EQ(tunnelAuthority(v4, std::nullopt), "100.64.0.9:443");
  EXPECT_EQ(tunnelAuthority(v6, std::nullopt), "[2001:db8::2]:80");
}

TEST(BoundaryTest, ConnectRequestParsesOnTheBoundary) {
  const std::string request = connectRequest("api.example.com:443");
  EXPECT_EQ(request, "CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com:443\r\n\r\n");
  proto::TunnelRequestParser parser;
  ASSERT_EQ(parser.feed(request), proto::TunnelRequestParser::Status::kComplete);
  EXPECT_EQ(parser.request().kind, proto::TunnelKind::kConnectTcp);
  EXPECT_EQ(parser.request().authority, "api.example.com:443");
  EXPECT_EQ(parser.consumed(), request.size());
}

TEST(BoundaryTest, ConnectUdpRequestParsesOnTheBoundary) {
  const auto named = Endpoint::from(asio::ip::make_address("100.64.0.9"), 5353);
  const auto literal6 = Endpoint::from(asio::ip::make_address("2001:db8::2"), 53);
  struct Case {
    Endpoint dst;
    std::optional<std::string> name;
    const char* authority;
  };
  for (const Case& c : {Case{named, "api.example.com", "api.example.com:5353"},
                        Case{literal6, std::nullopt, "[2001:db8::2]:53"}}) {
    const std::string request = connectUdpRequest(c.dst, c.name);
    proto::TunnelRequestParser parser;
    ASSERT_EQ(parser.feed(request), proto::TunnelRequestParser::Status::kComplete) << request;
    EXPECT_EQ(parser.request().kind, proto::TunnelKind::kConnectUdp);
    EXPECT_EQ(parser.request().authority, c.authority);
  }
  EXPECT_NE(connectUdpRequest(literal6, std::nullopt).find("/2001%3Adb8%3A%3A2/53/"),
            std::string::npos);
}

TEST(BoundaryTest, WaitsLongerThanTheBoundaryTriesToConnect) {
  // A destination that does not answer must be reported with sam-box's answer (504
  // connect-timeout), which comes after sambox::kConnectTimeout; a shorter wait here raced
  // it and told the operator the boundary itself was unreachable (new-user trial).
  EXPECT_GE(std::chrono::duration_cast<std::chrono::milliseconds>(kTunnelOpenTimeout),
            sambox::kConnectTimeout + std::chrono::seconds(3));
}

TEST(BoundaryTest, ResponseStatus) {
  EXPECT_EQ(responseStatus(proto::successResponse(proto::TunnelKind::kConnectTcp)), 200);
  EXPECT_EQ(responseStatus(proto::successResponse(proto::TunnelKind::kConnectUdp)), 101);
  EXPECT_EQ(responseStatus(proto::errorResponse(403, "not-allowlisted")), 403);
  EXPECT_EQ(responseStatus("HTTP/1.1 200\r\n\r\n"), 200);
  EXPECT_EQ(responseStatus("HTTP/1.1 2000 x\r\n"), -1);
  EXPECT_EQ(responseStatus("HTTP/2 200\r\n"), -1);
  EXPECT_EQ(responseStatus("SSH-2.0"), -1);
  EXPECT_EQ(responseStatus(""), -1);
}

TEST(CapsuleReuseTest, DatagramFramingMatchesTheBoundary) {
  // What UdpFlow sends: type 0x00, length, Context ID 0, payload (RFC 9297, RFC 9298).
  std::string out;
  proto::appendDatagramCapsule("ping", &out);
  EXPECT_EQ(out, std::string("\x00\x05\x00ping", 7));
  // A 300-byte payload needs a two-byte length varint.
  out.clear();
  proto::appendDatagramCapsule(std::string(300, 'a'), &out);
  EXPECT_EQ(out.substr(0, 4), std::string("\x00\x41\x2d\x00", 4));
  // What UdpFlow reads, split anywhere: each datagram comes out whole.
  std::string stream;
  proto::appendDatagramCapsule("one", &stream);
  stream += std::string("\x21\x01x", 3);  // an unknown capsule type, skipped
  proto::appendDatagramCapsule("two", &stream);
  proto::CapsuleReader reader;
  std::vector<std::string> got;
  for (char c : stream) {
    reader.append(std::string_view(&c, 1));
    while (reader.next() == proto::CapsuleReader::Status::kDatagram) {
      got.emplace_back(reader.payload());
    }
  }
  EXPECT_EQ(got, (std::vector<std::string>{"one", "two"}));
}

TEST(IngressTest, OnlyLoopbackV4WithAPort) {
  EXPECT_EQ(ingressPort("127.0.0.1:8080"), 8080);
  EXPECT_EQ(ingressPort("127.0.0.1:1"), 1);
  EXPECT_EQ(ingressPort("127.0.0.1:65535"), 65535);
  for (const char* bad :
       {"127.0.0.1:0", "127.0.0.1:65536", "127.0.0.1:", "127.0.0.1", "127.0.0.2:80", "localhost:80",
        "[::1]:80", "127.0.0.1:080", "127.0.0.1:80 ", "127.0.0.1:+80", "10.0.0.1:80"}) {
    EXPECT_FALSE(ingressPort(bad)) << bad;
  }
}

}  // namespace
}  // namespace netstack
