#include "compass-runner/rtnl.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <net/if.h>
#include <unistd.h>

#include <string>

#include "compass-runner/backend.h"
#include "compass-runner/process.h"

namespace runner::rtnl {
namespace {

// Real requests to the kernel, in two network namespaces the test makes and removes; what
// they did is read back with ip(8), which shares none of this code.
class RtnlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to make network namespaces";
    a_ = "rtnl-a-" + std::to_string(::getpid());
    b_ = "rtnl-b-" + std::to_string(::getpid());
    ASSERT_EQ(runCommand({"ip", "netns", "add", a_}).status, 0);
    ASSERT_EQ(runCommand({"ip", "netns", "add", b_}).status, 0);
  }
  void TearDown() override {
    if (a_.empty()) return;
    runCommand({"ip", "netns", "del", a_});
    runCommand({"ip", "netns", "del", b_});
  }
  static std::string ip(const std::string& ns, const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"ip", "-n", ns};
    argv.insert(argv.end(), args.begin(), args.end());
    const CommandResult r = runCommand(argv);
    EXPECT_EQ(r.status, 0) << r.err;
    return r.out;
  }
  static std::string path(const std::string& ns) { return "/run/netns/" + ns; }
  template <class Fn>
  static std::string errorOf(Fn fn) {
    try {
      fn();
    } catch (const RunnerError& e) {
      return e.what();
    }
    return "(no error)";
  }

  std::string a_, b_;
};

TEST_F(RtnlTest, VethAddressesLinkAndDefaultRoutesAsIpWouldMakeThem) {
  Socket s = Socket::inNetns(path(a_));
  const common::UniqueFd peer_ns(::open(path(b_).c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(peer_ns.valid());
  s.addVeth("va0", "eth0", peer_ns.get());
  s.addAddress("va0", "10.99.0.1", 30, false);
  s.addAddress("va0", "fd00:99::1", 64, true);
  s.setUp("va0");
  s.setUp("lo");

  const std::string links_a = ip(a_, {"-o", "link", "show"});
  EXPECT_NE(links_a.find("va0@"), std::string::npos) << links_a;
  EXPECT_EQ(links_a.find("eth0"), std::string::npos) << "the peer went to the other netns";
  EXPECT_NE(ip(b_, {"-d", "-o", "link", "show", "eth0"}).find("veth"), std::string::npos);
  // One queue each way on both ends, made so (not cut down to one after it is registered,
  // which would wait for two expedited RCU grace periods under rtnl_lock).
  EXPECT_NE(ip(a_, {"-d", "-o", "link", "show", "va0"}).find("numtxqueues 1 numrxqueues 1 "),
            std::string::npos);
  EXPECT_NE(ip(b_, {"-d", "-o", "link", "show", "eth0"}).find("numtxqueues 1 numrxqueues 1 "),
            std::string::npos);
  const std::string addrs = ip(a_, {"-o", "addr", "show", "dev", "va0"});
  EXPECT_NE(addrs.find("inet 10.99.0.1/30"), std::string::npos) << addrs;
  EXPECT_NE(addrs.find("inet6 fd00:99::1/64"), std::string::npos) << addrs;
  EXPECT_NE(addrs.find("nodad"), std::string::npos) << addrs;
  EXPECT_NE(ip(a_, {"-o", "link", "show", "va0"}).find(",UP"), std::string::npos);
  EXPECT_NE(ip(a_, {"-o", "link", "show", "lo"}).find("LOOPBACK,UP"), std::string::npos);

  // The peer's side, from a socket made in b; the routes need its addresses on-link.
  Socket t = Socket::inNetns(path(b_));
  t.addAddress("eth0", "10.99.0.2", 30, false);
  t.addAddress("eth0", "fd00:99::2", 64, true);
  t.setUp("eth0");
  t.addDefaultRoute("eth0", "10.99.0.1");
  t.addDefaultRoute("eth0", "fd00:99::1");
  EXPECT_NE(ip(b_, {"route"}).find("default via 10.99.0.1 dev eth0"), std::string::npos);
  EXPECT_NE(ip(b_, {"-6", "route"}).find("default via fd00:99::1 dev eth0"), std::string::npos);
  // ...and the link carries packets: a TCP SYN from the host end to a closed port of the peer
  // comes back as a RST ("Connection refused"), not a timeout or "No route to host".
  const CommandResult syn =
      runCommand({"ip", "netns", "exec", a_, "bash", "-c", "echo > /dev/tcp/10.99.0.2/9"}, "",
                 std::chrono::seconds(10));
  EXPECT_NE(syn.err.find("Connection refused"), std::string::npos) << syn.err;
  // Requests name themselves and the kernel's reason when refused.
  EXPECT_NE(errorOf([&] { t.addDefaultRoute("eth0", "10.99.0.1"); }).find("File exists"),
            std::string::npos);
  EXPECT_NE(errorOf([&] { s.addVeth("va0", "eth0", peer_ns.get()); }).find("File exists"),
            std::string::npos);

  // Deleting the host end removes the pair: the peer is gone from the other netns too.
  s.deleteLink("va0");
  EXPECT_EQ(ip(a_, {"-o", "link", "show"}).find("va0"), std::string::npos);
  EXPECT_EQ(ip(b_, {"-o", "link", "show"}).find("eth0"), std::string::npos);
  EXPECT_NE(errorOf([&] { s.deleteLink("va0"); }).find("RTM_DELLINK va0: No such device"),
            std::string::npos);
}

TEST_F(RtnlTest, BadInputIsRefusedNamingWhatAndWhy) {
  Socket s = Socket::inNetns(path(a_));
  EXPECT_NE(errorOf([&] { s.setUp("nosuchdev0"); }).find("nosuchdev0: No such device"),
            std::string::npos);
  EXPECT_NE(errorOf([&] {
              s.addAddress("lo", "10.0.0.300", 24, false);
            }).find("\"10.0.0.300\" is not a numeric IPv4 or IPv6 address"),
            std::string::npos);
  EXPECT_NE(
      errorOf([&] { s.addAddress("lo", "::ffff:10.0.0.1x", 64, false); }).find("not a numeric"),
      std::string::npos);
  EXPECT_NE(errorOf([&] { s.addAddress("lo", "10.0.0.1", 33, false); }).find("prefix longer"),
            std::string::npos);
  EXPECT_NE(errorOf([&] { s.addDefaultRoute("lo", "gateway.example"); }).find("not a numeric"),
            std::string::npos);
  const std::string long_name(IFNAMSIZ, 'x');
  EXPECT_NE(errorOf([&] { s.addVeth(long_name, "eth0", 0); }).find("must be 1 to 15 bytes"),
            std::string::npos);
  EXPECT_NE(errorOf([&] { s.setUp(""); }).find("must be 1 to 15 bytes"), std::string::npos);
  EXPECT_NE(errorOf([] {
              Socket::inNetns("/run/netns/no-such-rtnl-netns");
            }).find("open(/run/netns/no-such-rtnl-netns): No such file or directory"),
            std::string::npos);
  // Nothing was created by any of these.
  EXPECT_EQ(ip(a_, {"-o", "addr", "show"}).find("10.0.0."), std::string::npos);
}

}  // namespace
}  // namespace runner::rtnl
