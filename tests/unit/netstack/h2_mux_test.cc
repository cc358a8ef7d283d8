// The HTTP/2 boundary forms (issue 5) and the mux's HTTP/1.1 <-> HTTP/2 head translation:
// the heads come from the flows' own request builders, the fields are what sam-box's h2
// session accepts (tests/integration/test_h2_tunnels.py), and the answers are read back with
// the flows' own responseStatus().

#include "netstack/h2_mux.h"
#include "netstack/boundary.h"
#include "netstack/packet.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/un.h>
#include <termios.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <asio/ip/address.hpp>

#include <map>

namespace netstack {
namespace {

std::map<std::string, std::string> fieldMap(const H2Request& r) {
  std::map<std::string, std::string> out;
  for (const auto& [n, v] : r.fields) out[n] = v;
  return out;
}

TEST(H2BoundaryTest, H2UnixForm) {
  std::string error;
  auto a = parseBoundary("h2+unix:///run/sam/agent.sock", &error);
  ASSERT_TRUE(a) << error;
  EXPECT_EQ(a->kind, BoundaryAddress::Kind::kH2Unix);
  EXPECT_EQ(a->path, "/run/sam/agent.sock");
  EXPECT_TRUE(a->isH2());
  const auto ep = boundaryEndpoint(*a);
  EXPECT_STREQ(reinterpret_cast<const sockaddr_un*>(ep.data())->sun_path, "/run/sam/agent.sock");
}

TEST(H2BoundaryTest, H2DevForm) {
  std::string error;
  auto a = parseBoundary("h2+dev:///dev/virtio-ports/sam", &error);
  ASSERT_TRUE(a) << error;
  EXPECT_EQ(a->kind, BoundaryAddress::Kind::kH2Dev);
  EXPECT_EQ(a->path, "/dev/virtio-ports/sam");
  EXPECT_TRUE(a->isH2());
}

TEST(H2BoundaryTest, OldFormsUnchanged) {
  std::string error;
  auto plain = parseBoundary("/tmp/sam.sock", &error);
  ASSERT_TRUE(plain) << error;
  EXPECT_EQ(plain->kind, BoundaryAddress::Kind::kUnix);
  EXPECT_FALSE(plain->isH2());
  EXPECT_EQ(plain->mux, nullptr);
  auto vsock = parseBoundary("vsock://3:5000", &error);
  ASSERT_TRUE(vsock) << error;
  EXPECT_EQ(vsock->kind, BoundaryAddress::Kind::kVsock);
}

TEST(H2BoundaryTest, BadH2FormsSayWhy) {
  std::string error;
  EXPECT_FALSE(parseBoundary("h2+unix://", &error));
  EXPECT_NE(error.find("empty Unix socket path"), std::string::npos) << error;
  EXPECT_NE(error.find("h2+unix://"), std::string::npos) << error;
  EXPECT_FALSE(parseBoundary("h2+unix://" + std::string(200, 'a'), &error));
  EXPECT_NE(error.find("longer than"), std::string::npos) << error;
  EXPECT_FALSE(parseBoundary(std::string("h2+unix:///a\0b", 15), &error));
  EXPECT_NE(error.find("NUL"), std::string::npos) << error;
  EXPECT_FALSE(parseBoundary("h2+dev://", &error));
  EXPECT_NE(error.find("absolute"), std::string::npos) << error;
  EXPECT_FALSE(parseBoundary("h2+dev://dev/ttyS0", &error));
  EXPECT_NE(error.find("absolute"), std::string::npos) << error;
  EXPECT_FALSE(parseBoundary("h2+dev:///" + std::string(5000, 'a'), &error));
  EXPECT_NE(error.find("too long"), std::string::npos) << error;
}

TEST(H2TranslateTest, ConnectBecomesPlainConnect) {
  std::string error;
  auto r = h1RequestToH2(connectRequest("api.example.com:443"), &error);
  ASSERT_TRUE(r) << error;
  EXPECT_FALSE(r->udp);
  // RFC 9113 §8.5: exactly :method and :authority, pseudo-fields first.
  ASSERT_EQ(r->fields.size(), 2u);
  EXPECT_EQ(r->fields[0], (std::pair<std::string, std::string>{":method", "CONNECT"}));
  EXPECT_EQ(r->fields[1],
            (std::pair<std::string, std::string>{":authority", "api.example.com:443"}));
}

TEST(H2TranslateTest, ConnectUdpBecomesExtendedConnect) {
  Endpoint dst;
  dst.port = 5353;
  std::string error;
  auto r = h1RequestToH2(connectUdpRequest(dst, std::string("api.example.com")), &error);
  ASSERT_TRUE(r) << error;
  EXPECT_TRUE(r->udp);
  auto f = fieldMap(*r);
  EXPECT_EQ(f[":method"], "CONNECT");
  EXPECT_EQ(f[":protocol"], "connect-udp");
  EXPECT_EQ(f[":scheme"], "https");
  EXPECT_EQ(f[":path"], "/.well-known/masque/udp/api.example.com/5353/");
  EXPECT_EQ(f[":authority"], "api.example.com:5353");
  EXPECT_EQ(f["capsule-protocol"], "?1");
  EXPECT_EQ(r->fields.front().first, ":method");
  EXPECT_EQ(r->fields.back().first, "capsule-protocol");  // the regular field last
}

TEST(H2TranslateTest, ConnectUdpToIpv6LiteralKeepsEncodedPath) {
  Endpoint dst;
  dst.v6 = true;
  dst.addr = asio::ip::make_address_v6("2001:db8::1").to_bytes();
  dst.port = 53;
  std::string error;
  auto r = h1RequestToH2(connectUdpRequest(dst, std::nullopt), &error);
  ASSERT_TRUE(r) << error;
  EXPECT_EQ(fieldMap(*r)[":path"], "/.well-known/masque/udp/2001%3Adb8%3A%3A1/53/");
}

TEST(H2TranslateTest, BadHeadsAreRefused) {
  std::string error;
  EXPECT_FALSE(h1RequestToH2("GET / HTTP/1.1\r\nHost: x\r\n\r\n", &error));
  EXPECT_FALSE(error.empty());
  error.clear();
  EXPECT_FALSE(h1RequestToH2("CONNECT a:1 HTTP/1.1\r\nHost: a:1\r\n", &error));  // incomplete
  EXPECT_FALSE(error.empty());
  error.clear();
  EXPECT_FALSE(h1RequestToH2(connectRequest("a:1") + "extra", &error));
  EXPECT_NE(error.find("after the request head"), std::string::npos) << error;
}

TEST(H2TranslateTest, ResponsesReadBackAsTheFlowsExpect) {
  EXPECT_EQ(responseStatus(h2ResponseToH1(200, "", false)), 200);
  const std::string udp = h2ResponseToH1(200, "", true);
  EXPECT_EQ(responseStatus(udp), 101);  // udp_flow.cc wants 101 (RFC 9298 over HTTP/1.1)
  EXPECT_NE(udp.find("Upgrade: connect-udp\r\n"), std::string::npos);
  EXPECT_NE(udp.find("Capsule-Protocol: ?1\r\n"), std::string::npos);
  const std::string refused = h2ResponseToH1(403, "not-allowed", false);
  EXPECT_EQ(responseStatus(refused), 403);
  EXPECT_NE(refused.find("\r\nBoundary-Reason: not-allowed\r\n"), std::string::npos) << refused;
  EXPECT_TRUE(refused.ends_with("\r\n\r\n"));
  EXPECT_EQ(responseStatus(h2ResponseToH1(7, "", false)), 502);
  // A reason can never break the head open.
  const std::string odd =
      h2ResponseToH1(502, std::string("a\r\nX: y") + std::string(100, 'z'), true);
  EXPECT_EQ(odd.find("\r\nX: y"), std::string::npos) << odd;
  EXPECT_EQ(odd.find(std::string(65, 'z')), std::string::npos);
}

TEST(H2UpstreamTest, DeviceThatIsATtyIsPutInRawMode) {
  const int master = ::posix_openpt(O_RDWR | O_NOCTTY);
  ASSERT_GE(master, 0);
  ASSERT_EQ(::grantpt(master), 0);
  ASSERT_EQ(::unlockpt(master), 0);
  BoundaryAddress a;
  a.kind = BoundaryAddress::Kind::kH2Dev;
  a.path = ::ptsname(master);
  std::string error;
  const int fd = openH2Upstream(a, &error);
  ASSERT_GE(fd, 0) << error;
  termios tio{};
  ASSERT_EQ(::tcgetattr(fd, &tio), 0);
  EXPECT_EQ(tio.c_lflag & (ECHO | ICANON | ISIG), 0u);
  EXPECT_EQ(tio.c_oflag & OPOST, 0u);
  EXPECT_NE(::fcntl(fd, F_GETFL) & O_NONBLOCK, 0);
  ::close(fd);
  ::close(master);
}

TEST(H2UpstreamTest, MissingPathsNameTheCall) {
  std::string error;
  BoundaryAddress dev;
  dev.kind = BoundaryAddress::Kind::kH2Dev;
  dev.path = "/nonexistent/vport";
  EXPECT_EQ(openH2Upstream(dev, &error), -1);
  EXPECT_NE(error.find("open(/nonexistent/vport, O_RDWR)"), std::string::npos) << error;
  BoundaryAddress sock;
  sock.kind = BoundaryAddress::Kind::kH2Unix;
  sock.path = "/nonexistent/sam.sock";
  EXPECT_EQ(openH2Upstream(sock, &error), -1);
  EXPECT_NE(error.find("connect(/nonexistent/sam.sock)"), std::string::npos) << error;
}

}  // namespace
}  // namespace netstack
