#include "nano-init/options.h"

#include <gtest/gtest.h>

#include "nano-init/resolv.h"

namespace nanoinit {
namespace {

Parsed parse(std::vector<const char*> args) {
  args.insert(args.begin(), "nano-init");
  return parseCommandLine(static_cast<int>(args.size()), args.data());
}

TEST(OptionsTest, RunTakesEverythingAfterBoundaryAsTheCommand) {
  const auto p = parse({"run", "--create-namespaces", "--ingress-socket", "/in.sock",
                        "/run/agent.sock", "python3", "-c", "print(1)", "--create-namespaces"});
  const auto* run = std::get_if<RunOptions>(&p);
  ASSERT_NE(run, nullptr);
  EXPECT_TRUE(run->create_namespaces);
  EXPECT_EQ(run->ingress_socket, "/in.sock");
  EXPECT_EQ(run->boundary, "/run/agent.sock");
  EXPECT_EQ(run->command,
            (std::vector<std::string>{"python3", "-c", "print(1)", "--create-namespaces"}));
}

TEST(OptionsTest, CommandWordsThatLookLikeOurOptionsAreTheCommands) {
  // The agent's own --help, --create-namespaces or --user must run, not reconfigure nano-init.
  auto p = parse({"run", "/run/agent.sock", "--help"});
  ASSERT_NE(std::get_if<RunOptions>(&p), nullptr);
  EXPECT_EQ(std::get<RunOptions>(p).command, (std::vector<std::string>{"--help"}));
  p = parse({"run", "--user", "1000:1000", "--ingress-socket=/in.sock", "/run/agent.sock",
             "--create-namespaces", "--user", "0:0", "id"});
  const auto* run = std::get_if<RunOptions>(&p);
  ASSERT_NE(run, nullptr);
  EXPECT_FALSE(run->create_namespaces);
  ASSERT_TRUE(run->user.has_value());
  EXPECT_EQ(run->user->first, 1000u);
  EXPECT_EQ(run->ingress_socket, "/in.sock");
  EXPECT_EQ(run->command, (std::vector<std::string>{"--create-namespaces", "--user", "0:0", "id"}));
  p = parse({"run", "--help"});  // no BOUNDARY: nano-init's own help
  ASSERT_NE(std::get_if<Exit>(&p), nullptr);
  EXPECT_EQ(std::get<Exit>(p).exit_code, 0);
}

TEST(OptionsTest, RunWithoutCommandOrBoundaryIsRefused) {
  for (auto args : {std::vector<const char*>{"run", "/run/agent.sock"},
                    std::vector<const char*>{"run"}, std::vector<const char*>{}}) {
    const auto p = parse(args);
    const auto* exit = std::get_if<Exit>(&p);
    ASSERT_NE(exit, nullptr) << args.size();
    EXPECT_NE(exit->exit_code, 0);
  }
}

TEST(OptionsTest, SuperviseTakesUserAndTheCommandFromItsFirstWord) {
  auto p = parse({"supervise", "--user", "1000:1001", "sh", "-c", "exit 3"});
  const auto* sup = std::get_if<SuperviseOptions>(&p);
  ASSERT_NE(sup, nullptr);
  ASSERT_TRUE(sup->user.has_value());
  EXPECT_EQ(sup->user->first, 1000u);
  EXPECT_EQ(sup->user->second, 1001u);
  EXPECT_EQ(sup->command, (std::vector<std::string>{"sh", "-c", "exit 3"}));
  p = parse({"supervise", "--user=0:0", "id"});
  sup = std::get_if<SuperviseOptions>(&p);
  ASSERT_NE(sup, nullptr);
  ASSERT_TRUE(sup->user.has_value());
  EXPECT_EQ(*sup->user, std::make_pair(0u, 0u));
  EXPECT_EQ(sup->command, (std::vector<std::string>{"id"}));
  p = parse({"supervise", "/bin/true"});  // no --user: nano-init's own ids
  sup = std::get_if<SuperviseOptions>(&p);
  ASSERT_NE(sup, nullptr);
  EXPECT_FALSE(sup->user.has_value());
  EXPECT_EQ(sup->command, (std::vector<std::string>{"/bin/true"}));
}

TEST(OptionsTest, SuperviseCommandWordsThatLookLikeOurOptionsAreTheCommands) {
  // No BOUNDARY here: CMD's own --help and --user are the agent's from CMD on.
  auto p = parse({"supervise", "--user", "1:1", "sh", "-c", "x", "--help", "--user", "0:0"});
  const auto* sup = std::get_if<SuperviseOptions>(&p);
  ASSERT_NE(sup, nullptr);
  EXPECT_EQ(*sup->user, std::make_pair(1u, 1u));
  EXPECT_EQ(sup->command, (std::vector<std::string>{"sh", "-c", "x", "--help", "--user", "0:0"}));
  p = parse({"supervise", "--help"});  // no CMD: nano-init's own help
  ASSERT_NE(std::get_if<Exit>(&p), nullptr);
  EXPECT_EQ(std::get<Exit>(p).exit_code, 0);
  EXPECT_NE(std::get<Exit>(p).message.find("--user"), std::string::npos);
}

TEST(OptionsTest, SuperviseRefusesABadUserOrNoCommand) {
  for (const char* bad : {"1000", "1000:", ":1000", "a:b", "1:2:3", "-1:0", "4294967295:0",
                          "0:4294967295", "99999999999:0", ""}) {
    const auto p = parse({"supervise", "--user", bad, "true"});
    const auto* exit = std::get_if<Exit>(&p);
    ASSERT_NE(exit, nullptr) << bad;
    EXPECT_EQ(exit->exit_code, 2) << bad;
    EXPECT_NE(exit->message.find("--user"), std::string::npos) << bad;
  }
  // The same rule for run (one shared parser).
  auto p = parse({"run", "--user", "1000", "/run/agent.sock", "true"});
  ASSERT_NE(std::get_if<Exit>(&p), nullptr);
  EXPECT_EQ(std::get<Exit>(p).exit_code, 2);
  for (auto args : {std::vector<const char*>{"supervise"},
                    std::vector<const char*>{"supervise", "--user", "1:1"},
                    std::vector<const char*>{"supervise", "--user"},
                    std::vector<const char*>{"supervise", "--bogus", "true"}}) {
    p = parse(args);
    const auto* exit = std::get_if<Exit>(&p);
    ASSERT_NE(exit, nullptr) << args.size();
    EXPECT_EQ(exit->exit_code, 2) << args.size();
    EXPECT_FALSE(exit->message.empty());
  }
  p = parse({"supervise", "--user", "1:1"});
  EXPECT_NE(std::get<Exit>(p).message.find("CMD is required"), std::string::npos);
}

TEST(OptionsTest, CopyHelpVersion) {
  auto p = parse({"copy", "/tmp/x"});
  ASSERT_NE(std::get_if<CopyOptions>(&p), nullptr);
  EXPECT_EQ(std::get<CopyOptions>(p).dest, "/tmp/x");
  p = parse({"--version"});
  ASSERT_NE(std::get_if<Exit>(&p), nullptr);
  EXPECT_EQ(std::get<Exit>(p).exit_code, 0);
  EXPECT_NE(std::get<Exit>(p).message.find("nano-init"), std::string::npos);
  p = parse({"--help"});
  EXPECT_EQ(std::get<Exit>(p).exit_code, 0);
}

TEST(BoundaryTest, VsockAndUnixPaths) {
  std::string why;
  auto b = parseBoundary("vsock://2:1080", &why);
  ASSERT_TRUE(b);
  EXPECT_TRUE(b->isVsock());
  EXPECT_EQ(b->vsock_cid, 2U);
  EXPECT_EQ(b->vsock_port, 1080U);
  b = parseBoundary("/run/agent.sock", &why);
  ASSERT_TRUE(b);
  EXPECT_FALSE(b->isVsock());
  for (const char* bad :
       {"vsock://1:1080", "vsock://0:1", "vsock://2:", "vsock://2:0", "vsock://x:1",
        "vsock://2:99999999999", "vsock://2", "tcp://1.2.3.4:5", ""}) {
    why.clear();
    EXPECT_FALSE(parseBoundary(bad, &why)) << bad;
    EXPECT_FALSE(why.empty()) << bad;
  }
  EXPECT_FALSE(parseBoundary(std::string(108, 'a'), &why));
}

TEST(BoundaryTest, Http2Forms) {
  std::string why;
  auto b = parseBoundary("h2+unix:///run/sam/agent.sock", &why);
  ASSERT_TRUE(b) << why;
  EXPECT_EQ(b->kind, Boundary::Kind::kH2Unix);
  EXPECT_EQ(b->unix_path, "/run/sam/agent.sock");
  EXPECT_FALSE(b->isVsock());
  b = parseBoundary("h2+dev:///dev/virtio-ports/sam", &why);
  ASSERT_TRUE(b) << why;
  EXPECT_EQ(b->kind, Boundary::Kind::kH2Dev);
  EXPECT_EQ(b->device_path, "/dev/virtio-ports/sam");
  for (const std::string& bad :
       {std::string("h2+unix://"), "h2+unix://" + std::string(108, 'a'), std::string("h2+dev://"),
        std::string("h2+dev://dev/vport"), "h2+dev:///" + std::string(4095, 'a'),
        std::string("h2+tcp://1.2.3.4:5"), std::string("h2://x")}) {
    why.clear();
    EXPECT_FALSE(parseBoundary(bad, &why)) << bad;
    EXPECT_FALSE(why.empty()) << bad;
  }
  // The command line takes them and leaves them for the netstack as written.
  auto p = parse({"run", "h2+dev:///dev/virtio-ports/sam", "true"});
  ASSERT_TRUE(std::holds_alternative<RunOptions>(p));
  EXPECT_EQ(std::get<RunOptions>(p).boundary, "h2+dev:///dev/virtio-ports/sam");
}

TEST(ResolvTest, RecognizesAFileThatAlreadyNamesTheVirtualDns) {
  EXPECT_TRUE(resolv::alreadyPointsAtVirtualDns("nameserver 100.127.255.253\n"));
  EXPECT_TRUE(resolv::alreadyPointsAtVirtualDns("# x\nsearch a\nnameserver 100.127.255.253"));
  EXPECT_FALSE(resolv::alreadyPointsAtVirtualDns("nameserver 127.0.0.53\n"));
  EXPECT_FALSE(
      resolv::alreadyPointsAtVirtualDns("nameserver 100.127.255.253\nnameserver 8.8.8.8\n"));
  EXPECT_FALSE(resolv::alreadyPointsAtVirtualDns(""));
  EXPECT_TRUE(resolv::alreadyPointsAtVirtualDns(resolv::generated()));
}

TEST(ResolvTest, HostsThatMapOnlyToLoopbackAreLeftAlone) {
  EXPECT_TRUE(resolv::onlyLoopback("127.0.0.1 localhost\n::1 localhost\n"));
  EXPECT_TRUE(resolv::onlyLoopback("# c\n\n127.0.1.1 box # comment\n127.9.9.9 a b c\n"));
  EXPECT_TRUE(resolv::onlyLoopback(""));
  EXPECT_TRUE(resolv::onlyLoopback(resolv::generatedHosts()));
  EXPECT_FALSE(resolv::onlyLoopback("127.0.0.1 localhost\n198.18.77.2 good.example\n"));
  EXPECT_FALSE(resolv::onlyLoopback("::ffff:10.0.0.1 mapped\n"));
  EXPECT_FALSE(resolv::onlyLoopback("fe80::1%eth0 linklocal\n"));
  EXPECT_FALSE(resolv::onlyLoopback("not-an-address name\n"));
}

TEST(OptionsTest, SuperviseTakesAGateDescriptor) {
  auto p = parse({"supervise", "--gate-fd", "3", "--user", "1:1", "sh", "-c", "x"});
  const auto* sup = std::get_if<SuperviseOptions>(&p);
  ASSERT_NE(sup, nullptr);
  EXPECT_EQ(sup->gate_fd, 3);
  EXPECT_EQ(sup->command, (std::vector<std::string>{"sh", "-c", "x"}));
  p = parse({"supervise", "--gate-fd=17", "true", "--gate-fd", "4"});  // the last two are CMD's
  sup = std::get_if<SuperviseOptions>(&p);
  ASSERT_NE(sup, nullptr);
  EXPECT_EQ(sup->gate_fd, 17);
  EXPECT_EQ(sup->command, (std::vector<std::string>{"true", "--gate-fd", "4"}));
  p = parse({"supervise", "true"});
  ASSERT_NE(std::get_if<SuperviseOptions>(&p), nullptr);
  EXPECT_FALSE(std::get<SuperviseOptions>(p).gate_fd.has_value());
}

TEST(OptionsTest, SuperviseRefusesAStdioOrMalformedGateDescriptor) {
  for (const char* bad : {"0", "1", "2", "-3", "x", "3x", "65536", "99999999999", ""}) {
    const auto p = parse({"supervise", "--gate-fd", bad, "true"});
    const auto* exit = std::get_if<Exit>(&p);
    ASSERT_NE(exit, nullptr) << bad;
    EXPECT_EQ(exit->exit_code, 2) << bad;
    EXPECT_NE(exit->message.find("--gate-fd"), std::string::npos) << bad;
  }
  for (const char* bad : {"2", "x", "65536"}) {
    const auto p = parse({"run", "--gate-fd", bad, "/run/agent.sock", "true"});
    const auto* exit = std::get_if<Exit>(&p);
    ASSERT_NE(exit, nullptr) << bad;
    EXPECT_EQ(exit->exit_code, 2) << bad;
    EXPECT_NE(exit->message.find("run: invalid --gate-fd"), std::string::npos) << bad;
  }
}

TEST(OptionsTest, RunTakesAGateDescriptorBeforeBoundary) {
  auto p = parse({"run", "--gate-fd", "3", "/run/sam/agent.sock", "sh", "--gate-fd", "4"});
  const auto* run = std::get_if<RunOptions>(&p);
  ASSERT_NE(run, nullptr);
  EXPECT_EQ(run->gate_fd, 3);
  EXPECT_EQ(run->boundary, "/run/sam/agent.sock");
  EXPECT_EQ(run->command, (std::vector<std::string>{"sh", "--gate-fd", "4"}));  // CMD's own
  p = parse({"run", "/run/sam/agent.sock", "true"});
  ASSERT_NE(std::get_if<RunOptions>(&p), nullptr);
  EXPECT_FALSE(std::get<RunOptions>(p).gate_fd.has_value());
}

TEST(OptionsTest, LifelineNeedsAGateDescriptor) {
  auto p = parse({"supervise", "--gate-fd", "3", "--lifeline", "--", "sh"});
  ASSERT_NE(std::get_if<SuperviseOptions>(&p), nullptr);
  EXPECT_TRUE(std::get<SuperviseOptions>(p).lifeline);
  p = parse({"supervise", "--gate-fd", "3", "sh", "--lifeline"});  // CMD's own word
  ASSERT_NE(std::get_if<SuperviseOptions>(&p), nullptr);
  EXPECT_FALSE(std::get<SuperviseOptions>(p).lifeline);
  p = parse({"run", "--lifeline", "--gate-fd", "3", "/run/sam/agent.sock", "sh"});
  ASSERT_NE(std::get_if<RunOptions>(&p), nullptr);
  EXPECT_TRUE(std::get<RunOptions>(p).lifeline);
  for (const char* sub : {"supervise", "run"}) {
    p = std::string(sub) == "run" ? parse({"run", "--lifeline", "/run/sam/agent.sock", "sh"})
                                  : parse({"supervise", "--lifeline", "sh"});
    const auto* exit = std::get_if<Exit>(&p);
    ASSERT_NE(exit, nullptr) << sub;
    EXPECT_EQ(exit->exit_code, 2) << sub;
    EXPECT_EQ(
        exit->message,
        std::string(sub) + ": --lifeline needs --gate-fd (the lifeline is the opened gate)\n");
  }
}

TEST(OptionsTest, DoubleDashEndsOurOptionsSoACommandMayBeginWithADash) {
  auto p = parse({"supervise", "--gate-fd", "3", "--", "--help"});
  const auto* sup = std::get_if<SuperviseOptions>(&p);
  ASSERT_NE(sup, nullptr);
  EXPECT_EQ(sup->gate_fd, 3);
  EXPECT_EQ(sup->command, (std::vector<std::string>{"--help"}));
  p = parse({"supervise", "--", "--user", "0:0", "id"});
  sup = std::get_if<SuperviseOptions>(&p);
  ASSERT_NE(sup, nullptr);
  EXPECT_FALSE(sup->user.has_value());
  EXPECT_EQ(sup->command, (std::vector<std::string>{"--user", "0:0", "id"}));
  p = parse({"run", "--", "/run/sam/agent.sock", "--help"});
  const auto* run = std::get_if<RunOptions>(&p);
  ASSERT_NE(run, nullptr);
  EXPECT_EQ(run->boundary, "/run/sam/agent.sock");
  EXPECT_EQ(run->command, (std::vector<std::string>{"--help"}));
  // One `--` between BOUNDARY and CMD separates them (as for compass-runner); a second is CMD's.
  for (auto args : {std::vector<const char*>{"run", "/run/sam/agent.sock", "--", "id", "-u"},
                    std::vector<const char*>{"run", "--", "/run/sam/agent.sock", "--", "id", "-u"},
                    std::vector<const char*>{"run", "--user", "1:1", "/s", "--", "id", "-u"}}) {
    p = parse(args);
    run = std::get_if<RunOptions>(&p);
    ASSERT_NE(run, nullptr) << args.size();
    EXPECT_EQ(run->command, (std::vector<std::string>{"id", "-u"})) << args.size();
  }
  p = parse({"run", "/s", "--", "--", "x"});
  run = std::get_if<RunOptions>(&p);
  ASSERT_NE(run, nullptr);
  EXPECT_EQ(run->command, (std::vector<std::string>{"--", "x"}));
  p = parse({"run", "/s", "--"});  // a separator and nothing after it: no CMD
  ASSERT_NE(std::get_if<Exit>(&p), nullptr);
  EXPECT_EQ(std::get<Exit>(p).exit_code, 2);
  p = parse({"supervise", "--"});  // nothing after it: still no CMD
  ASSERT_NE(std::get_if<Exit>(&p), nullptr);
  EXPECT_EQ(std::get<Exit>(p).exit_code, 2);
}

}  // namespace
}  // namespace nanoinit
