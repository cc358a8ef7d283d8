#include "nano-init/check.h"

#include <gtest/gtest.h>

#include "nano-init/options.h"
#include "nano-init/tun.h"

namespace nanoinit::check {
namespace {

// Text as the kernel writes it (proc(5)); a sandbox as nano-init leaves it.
constexpr const char* kRouteHeader =
    "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n";
constexpr const char* kTunRoute4 =
    "tun0\t00000000\t00000000\t0001\t0\t0\t0\t00000000\t0\t0\t0\n"
    "tun0\t00004064\t00000000\t0001\t0\t0\t0\t0000C0FF\t0\t0\t0\n";
constexpr const char* kTunRoute6 =
    "00000000000000000000000000000000 00 00000000000000000000000000000000 00 "
    "00000000000000000000000000000000 00000400 00000001 00000000 00000001     tun0\n"
    "01000000000000000000000000000000 40 00000000000000000000000000000000 00 "
    "00000000000000000000000000000000 00000100 00000001 00000000 00000001     tun0\n";
constexpr const char* kStatusAgent =
    "Name:\tpython3\nCapInh:\t0000000000000000\nCapPrm:\t0000000000000000\n"
    "CapEff:\t0000000000000000\nCapBnd:\t0000000000000000\nCapAmb:\t0000000000000000\n"
    "NoNewPrivs:\t1\n";

Observation sandbox() {
  Observation o;
  o.interfaces = {"lo", "tun0"};
  o.route4 = std::string(kRouteHeader) + kTunRoute4;
  o.route6 = kTunRoute6;
  o.resolv_conf = "nameserver 100.127.255.253\n";
  o.status = kStatusAgent;
  return o;
}

std::string all(const std::vector<std::string>& reasons) {
  std::string out;
  for (const auto& r : reasons) out += r + "\n";
  return out;
}

TEST(CheckTest, NanoInitsSandboxPasses) { EXPECT_EQ(all(evaluate(sandbox())), ""); }

TEST(CheckTest, PodNetworkNamespaceIsNotASandbox) {
  // A harness started directly in a pod: eth0, its default route, the pod's resolver.
  Observation o;
  o.interfaces = {"lo", "eth0"};
  o.route4 = std::string(kRouteHeader) +
             "eth0\t00000000\t0100580A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
             "eth0\t0000580A\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n";
  o.route6 =
      "00000000000000000000000000000000 00 00000000000000000000000000000000 00 "
      "fe800000000000000000000000000001 00000400 00000001 00000000 00000003     eth0\n";
  o.resolv_conf = "search default.svc.cluster.local\nnameserver 10.96.0.10\n";
  o.status = kStatusAgent;
  const auto reasons = evaluate(o);
  const std::string text = all(reasons);
  EXPECT_NE(text.find("also holds eth0"), std::string::npos) << text;
  EXPECT_NE(text.find("there is no tun0"), std::string::npos) << text;
  EXPECT_NE(text.find("no IPv4 default route via tun0"), std::string::npos) << text;
  EXPECT_NE(text.find("an IPv4 default route via eth0"), std::string::npos) << text;
  EXPECT_NE(text.find("an IPv6 default route via eth0"), std::string::npos) << text;
  EXPECT_NE(text.find("does not name only 100.127.255.253"), std::string::npos) << text;
}

TEST(CheckTest, EachRuleFailsOnItsOwn) {
  {
    Observation o = sandbox();
    o.interfaces.push_back("veth0");
    EXPECT_EQ(all(evaluate(o)),
              "this network namespace also holds veth0 (a sandbox holds only "
              "lo and tun0)\n");
  }
  {
    Observation o = sandbox();
    *o.route4 += "eth1\t00000000\t00000000\t0001\t0\t0\t100\t00000000\t0\t0\t0\n";
    EXPECT_EQ(all(evaluate(o)), "an IPv4 default route via eth1\n");
  }
  {
    Observation o = sandbox();
    o.route6 = "";
    EXPECT_EQ(all(evaluate(o)), "no IPv6 default route via tun0\n");
  }
  {
    Observation o = sandbox();
    o.resolv_conf = "nameserver 100.127.255.253\nnameserver 1.1.1.1\n";
    EXPECT_EQ(all(evaluate(o)), "/etc/resolv.conf does not name only 100.127.255.253\n");
  }
  {
    Observation o = sandbox();
    o.resolv_conf.reset();
    EXPECT_EQ(all(evaluate(o)), "/etc/resolv.conf cannot be read\n");
  }
  {
    Observation o = sandbox();
    o.route4.reset();
    EXPECT_EQ(all(evaluate(o)), "the IPv4 routing table cannot be read\n");
  }
}

TEST(CheckTest, NoIpv6MeansNoIpv6Rule) {
  Observation o = sandbox();
  o.ipv6_present = false;
  o.route6.reset();
  EXPECT_EQ(all(evaluate(o)), "");
}

TEST(CheckTest, RejectAndDownRoutesDoNotCount) {
  // The kernel's "unreachable default" on lo (RTF_REJECT|RTF_UP) and a route without RTF_UP.
  const std::string v6 =
      "00000000000000000000000000000000 00 00000000000000000000000000000000 00 "
      "00000000000000000000000000000000 ffffffff 00000001 00000000 00200201       lo\n";
  EXPECT_TRUE(tun::defaultRoutes6(v6).empty());
  const std::string v4 = std::string(kRouteHeader) +
                         "eth0\t00000000\t0100580A\t0002\t0\t0\t0\t00000000\t0\t0\t0\n"
                         "eth0\t00000000\t0100580A\t0201\t0\t0\t0\t00000000\t0\t0\t0\n";
  EXPECT_TRUE(tun::defaultRoutes4(v4).empty());
  EXPECT_EQ(tun::defaultRoutes4(std::string(kRouteHeader) + kTunRoute4),
            (std::vector<std::string>{"tun0"}));
  EXPECT_EQ(tun::defaultRoutes6(kTunRoute6), (std::vector<std::string>{"tun0"}));
}

TEST(CheckTest, CapabilitiesThatCouldRerouteFail) {
  auto with = [](const std::string& eff, const std::string& bnd, const std::string& nnp) {
    Observation o = sandbox();
    o.status = "CapInh:\t0000000000000000\nCapPrm:\t" + eff + "\nCapEff:\t" + eff + "\nCapBnd:\t" +
               bnd + "\nCapAmb:\t0000000000000000\nNoNewPrivs:\t" + nnp + "\n";
    return all(evaluate(o));
  };
  // `kubectl exec` / `podman exec` into the agent container: the runtime's default set, which
  // lacks CAP_NET_ADMIN and CAP_SYS_ADMIN, is fine.
  EXPECT_EQ(with("00000000a80425fb", "00000000a80425fb", "0"), "");
  // CAP_NET_ADMIN (bit 12) held.
  EXPECT_NE(with("0000000000001000", "0000000000001000", "1").find("CapEff, CapPrm"),
            std::string::npos);
  // CAP_SYS_ADMIN (bit 21) only in the bounding set: gainable without no_new_privs.
  EXPECT_NE(with("0000000000000000", "0000000000200000", "0").find("CapBnd without no_new_privs"),
            std::string::npos);
  EXPECT_EQ(with("0000000000000000", "0000000000200000", "1"), "");
  // A privileged container: everything.
  EXPECT_NE(with("000001ffffffffff", "000001ffffffffff", "0").find("CAP_NET_ADMIN"),
            std::string::npos);
  // An unreadable field fails closed.
  Observation o = sandbox();
  o.status = "Name:\tx\n";
  EXPECT_EQ(all(evaluate(o)), "/proc/self/status has no readable CapEff\n");
}

TEST(CheckTest, CommandLineHasCheck) {
  std::vector<const char*> args{"nano-init", "check"};
  const auto p = parseCommandLine(static_cast<int>(args.size()), args.data());
  EXPECT_TRUE(std::holds_alternative<CheckOptions>(p));
  std::vector<const char*> extra{"nano-init", "check", "--bogus"};
  const auto q = parseCommandLine(static_cast<int>(extra.size()), extra.data());
  const auto* exit = std::get_if<Exit>(&q);
  ASSERT_NE(exit, nullptr);
  EXPECT_NE(exit->exit_code, 0);
}

}  // namespace
}  // namespace nanoinit::check
