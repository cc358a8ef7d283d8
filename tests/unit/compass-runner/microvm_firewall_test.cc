// Egress `firewall` in the microvm tier: the agent archive's firewall files
// (read back with a newc reader of the test's own), the firewall modules' load order and the
// firewall layer built from the real guest kernel and the host's nft. GuestRuleset's tests are
// in microvm_guest_ruleset_test.cc.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/unique_fd.h"
#include "compass-runner/backend.h"
#include "compass-runner/microvm_cache.h"
#include "compass-runner/microvm_control.h"
#include "compass-runner/microvm_egress.h"
#include "compass-runner/microvm_initramfs.h"
#include "compass-runner/ruleset.h"
#include "microvm_test_util.h"

namespace runner::microvm {
namespace {

namespace fs = std::filesystem;
using testing::readFile;
using testing::TempDir;
using testing::writeFile;

// ---------------------------------------------------------------------------------------------
// The agent's archive

struct Member {
  std::string name;
  uint32_t mode = 0;
  std::string data;
};

// Reads concatenated cpio "newc" archives: per entry the magic 070701, 13 fields of 8 hex
// digits, the name and its NUL padded to 4, the data padded to 4; TRAILER!!! ends one archive.
std::vector<Member> readCpio(const std::string& a) {
  const auto align = [](size_t p) { return (p + 3) & ~size_t{3}; };
  std::vector<Member> out;
  size_t pos = 0;
  while (pos < a.size()) {
    if (a.compare(pos, 6, "070701") != 0)
      throw std::runtime_error("bad magic at " + std::to_string(pos));
    if (pos + 110 > a.size()) throw std::runtime_error("short header");
    uint32_t f[13];
    for (int i = 0; i < 13; ++i) {
      const std::string hex = a.substr(pos + 6 + 8 * size_t(i), 8);
      if (hex.find_first_not_of("0123456789ABCDEFabcdef") != std::string::npos) {
        throw std::runtime_error("bad field " + hex);
      }
      f[i] = static_cast<uint32_t>(std::stoul(hex, nullptr, 16));
    }
    const size_t name_at = pos + 110, name_size = f[11], size = f[6];
    if (name_size == 0 || name_at + name_size > a.size() || a[name_at + name_size - 1] != '\0') {
      throw std::runtime_error("bad name at " + std::to_string(pos));
    }
    Member m{a.substr(name_at, name_size - 1), f[1], ""};
    const size_t data_at = align(name_at + name_size);
    if (data_at + size > a.size()) throw std::runtime_error("short data for " + m.name);
    m.data = a.substr(data_at, size);
    pos = align(data_at + size);
    if (m.name != "TRAILER!!!") out.push_back(std::move(m));
  }
  return out;
}

// By name, later entries over earlier ones (as the kernel unpacks them).
std::map<std::string, Member> byName(const std::vector<Member>& members) {
  std::map<std::string, Member> out;
  for (const auto& m : members) out[m.name] = m;
  return out;
}

GuestAgent agent() {
  GuestAgent a;
  a.command = {"sh", "-c", "echo hi"};
  return a;
}

GuestFirewall guestFirewall() {
  // As MicrovmBackend fills it, from a real slot.
  const firewall::Addressing net = firewall::addressingForSlot(1);
  GuestFirewall fw;
  // The pre-resolved elements follow the ruleset (MicrovmBackend appends armForGuest's batches).
  fw.ruleset =
      firewall::sandboxRuleset(net, {}) +
      firewall::addElementsBatch({{asio::ip::make_address("198.51.100.7"), 80, "a.example"}});
  fw.address4 = net.sandbox4 + "/30";
  fw.address6 = net.sandbox6 + "/64";
  fw.gateway4 = net.host4;
  fw.gateway6 = net.host6;
  return fw;
}

std::string sh(const std::string& script) {
  FILE* out = ::popen(("sh -c '" + script + "'").c_str(), "r");
  if (out == nullptr) return "popen failed";
  std::string got;
  char buf[256];
  while (size_t n = std::fread(buf, 1, sizeof buf, out)) got.append(buf, n);
  ::pclose(out);
  return got;
}

TEST(MicrovmFirewallInitramfsTest, AgentArchiveCarriesTheFirewall) {
  GuestAgent a = agent();
  a.firewall = guestFirewall();
  const GuestFirewall& fw = *a.firewall;
  const auto members = byName(readCpio(agentCpio(a)));
  ASSERT_EQ(members.count("compass/firewall.env"), 1U);
  ASSERT_EQ(members.count("compass/firewall.nft"), 1U);
  ASSERT_EQ(members.count("compass/agent.env"), 1U);
  EXPECT_EQ(members.at("compass/firewall.env").data,
            "FW_ADDR4=" + fw.address4 + "\nFW_ADDR6=" + fw.address6 + "\nFW_GW4=" + fw.gateway4 +
                "\nFW_GW6=" + fw.gateway6 + "\n");
  EXPECT_EQ(members.at("compass/firewall.nft").data, fw.ruleset);
  EXPECT_EQ(members.at("compass/firewall.nft").mode, uint32_t{S_IFREG | 0600});
  EXPECT_EQ(members.at("compass/firewall.env").mode, uint32_t{S_IFREG | 0600});
  const std::string& env = members.at("compass/agent.env").data;
  EXPECT_NE(env.find("\nCOMPASS_EGRESS=firewall\n"), std::string::npos) << env;
  EXPECT_EQ(env.rfind(agentEnv(a), 0), 0U) << env;  // the usual env, then the egress

  // Both files as the guest's shell reads them.
  TempDir dir;
  writeFile(dir.path() + "/firewall.env", members.at("compass/firewall.env").data);
  writeFile(dir.path() + "/agent.env", env);
  EXPECT_EQ(sh(". " + dir.path() + "/firewall.env && . " + dir.path() +
               "/agent.env && printf \"%s|\" \"$FW_ADDR4\" \"$FW_ADDR6\" \"$FW_GW4\" \"$FW_GW6\" "
               "\"$COMPASS_EGRESS\""),
            fw.address4 + "|" + fw.address6 + "|" + fw.gateway4 + "|" + fw.gateway6 + "|firewall|");
}

TEST(MicrovmFirewallInitramfsTest, NoFirewallNoFirewallFiles) {
  const auto members = byName(readCpio(agentCpio(agent())));
  EXPECT_EQ(members.count("compass/firewall.env"), 0U);
  EXPECT_EQ(members.count("compass/firewall.nft"), 0U);
  ASSERT_EQ(members.count("compass/agent.env"), 1U);
  EXPECT_EQ(members.at("compass/agent.env").data, agentEnv(agent()));
  EXPECT_EQ(members.at("compass/agent.env").data.find("COMPASS_EGRESS"), std::string::npos);
}

TEST(MicrovmFirewallInitramfsTest, HostileFieldsAreRefusedByName) {
  struct Case {
    const char* field;
    void (*set)(GuestFirewall&, const std::string&);
    std::vector<std::string> values;
  };
  const std::vector<Case> cases = {
      {"address4",
       [](GuestFirewall& f, const std::string& v) { f.address4 = v; },
       {"10.0.0.1/30; reboot", "$(x)", "10.0.0.1/30\nFW_GW4=1", "", "`id`", "10.0.0.1 "}},
      {"address6",
       [](GuestFirewall& f, const std::string& v) { f.address6 = v; },
       {"fd00::2/64;x", "$(x)", "fd00::2/64'"}},
      {"gateway4",
       [](GuestFirewall& f, const std::string& v) { f.gateway4 = v; },
       {"10.0.0.1|x", "$x", ""}},
      {"gateway6",
       [](GuestFirewall& f, const std::string& v) { f.gateway6 = v; },
       {"fd00::1&", "$(x)", "fd00::1\""}},
  };
  for (const auto& c : cases) {
    for (const auto& v : c.values) {
      GuestAgent a = agent();
      a.firewall = guestFirewall();
      c.set(*a.firewall, v);
      try {
        agentCpio(a);
        ADD_FAILURE() << c.field << " \"" << v << "\" was accepted";
      } catch (const RunnerError& e) {
        EXPECT_NE(std::string(e.what()).find(c.field), std::string::npos) << e.what();
      }
    }
  }
}

TEST(MicrovmFirewallInitramfsTest, WriteAgentInitramfsAppendsLayersThenTheAgent) {
  TempDir dir;
  const std::string base = dir.path() + "/base.cpio", layer = dir.path() + "/layer.cpio",
                    out = dir.path() + "/initrd.cpio";
  const std::string base_data = cpioArchive({{"init", S_IFREG | 0755, "#!/bin/sh\n", 0, 0},
                                             {"lib/modules/order", S_IFREG | 0644, "a\n", 0, 0}});
  const std::string layer_data =
      cpioArchive({{"lib/modules/order", S_IFREG | 0644, "a b\n", 0, 0}});
  writeFile(base, base_data);
  ::chmod(base.c_str(), 0644);
  writeFile(layer, layer_data);
  writeFile(out, "stale content that is longer than anything written here ...............");
  GuestAgent a = agent();
  a.firewall = guestFirewall();
  writeAgentInitramfs(base, {layer}, a, out);
  const std::string got = readFile(out);
  EXPECT_EQ(got, base_data + layer_data + agentCpio(a));
  struct stat st {};
  ASSERT_EQ(::stat(out.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600U);
  const auto members = byName(readCpio(got));
  EXPECT_EQ(members.at("lib/modules/order").data, "a b\n");  // the layer's, over the base's
  EXPECT_EQ(members.at("compass/firewall.nft").data, a.firewall->ruleset);
  EXPECT_THROW(writeAgentInitramfs(base, {dir.path() + "/missing.cpio"}, a, out), RunnerError);
}

// ---------------------------------------------------------------------------------------------
// The guest kernel's modules and the firewall layer

std::optional<GuestKernel> guestKernel() {
  try {
    return findGuestKernel();
  } catch (const RunnerError&) {
    return std::nullopt;
  }
}

std::string moduleName(const std::string& path) {
  std::string name = fs::path(path).filename().string();
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

// The `depends=` of a module's .modinfo: the modules it needs loaded first.
std::vector<std::string> moduleDepends(const std::string& ko) {
  const std::string data = readFile(ko);
  static const std::string kKey = std::string("\0depends=", 9);
  const size_t at = data.find(kKey);
  if (at == std::string::npos) throw std::runtime_error("no depends= in " + ko);
  const size_t start = at + kKey.size();
  const std::string list = data.substr(start, data.find('\0', start) - start);
  std::vector<std::string> deps;
  std::istringstream in(list);
  for (std::string d; std::getline(in, d, ',');) {
    if (!d.empty()) deps.push_back(moduleName(d));
  }
  return deps;
}

TEST(MicrovmFirewallModulesTest, OrderFileIsAValidLoadOrder) {
  const auto kernel = guestKernel();
  if (!kernel) GTEST_SKIP() << "no guest kernel in " << guestKernelDir();
  std::vector<std::string> all = guestModules();
  all.insert(all.end(), firewallModules().begin(), firewallModules().end());
  std::vector<std::string> loaded;
  for (size_t i = 0; i < all.size(); ++i) {
    const std::string name = moduleName(all[i]);
    EXPECT_EQ(std::count(loaded.begin(), loaded.end(), name), 0) << name << " twice";
    for (const auto& dep : moduleDepends(kernel->modules + "/" + all[i] + ".ko")) {
      EXPECT_NE(std::find(loaded.begin(), loaded.end(), dep), loaded.end())
          << all[i] << " needs " << dep << ", which is not loaded before it";
    }
    loaded.push_back(name);  // so the base alone (egress `boundary`) is a valid order too
  }
  for (const char* needed : {"virtio_net", "nf_tables", "nft_ct", "nft_reject_inet"}) {
    EXPECT_NE(std::find(loaded.begin(), loaded.end(), needed), loaded.end()) << needed;
  }
}

// `ldd BINARY`: (name, host path) of each library, and the loader as ("ld.so", path).
std::vector<std::pair<std::string, std::string>> ldd(const std::string& binary) {
  FILE* out = ::popen(("ldd " + binary).c_str(), "r");
  std::string text;
  char buf[512];
  while (size_t n = std::fread(buf, 1, sizeof buf, out)) text.append(buf, n);
  ::pclose(out);
  std::vector<std::pair<std::string, std::string>> libs;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string first, arrow, target;
    words >> first >> arrow >> target;
    if (arrow == "=>") {
      libs.emplace_back(first, target);
    } else if (first.starts_with("/")) {
      libs.emplace_back("ld.so", first);
    }
  }
  return libs;
}

TEST(MicrovmFirewallLayerTest, NftItsLibrariesAndTheModulesCached) {
  const auto kernel = guestKernel();
  if (!kernel) GTEST_SKIP() << "no guest kernel in " << guestKernelDir();
  const std::string nft = "/usr/sbin/nft";
  if (::access(nft.c_str(), X_OK) != 0) GTEST_SKIP() << "no " << nft;

  TempDir dir;
  const std::string cache = dir.path() + "/cache";
  const char* old = std::getenv("COMPASS_MICROVM_CACHE");
  const std::optional<std::string> saved =
      old != nullptr ? std::optional<std::string>(old) : std::nullopt;
  ::setenv("COMPASS_MICROVM_CACHE", cache.c_str(), 1);
  const std::string made = cacheDir();  // created ours, 0700
  if (saved) {
    ::setenv("COMPASS_MICROVM_CACHE", saved->c_str(), 1);
  } else {
    ::unsetenv("COMPASS_MICROVM_CACHE");
  }
  ASSERT_EQ(made, cache);
  struct stat st {};
  ASSERT_EQ(::stat(cache.c_str(), &st), 0);
  ASSERT_EQ(st.st_mode & 07777, 0700U);
  ASSERT_EQ(st.st_uid, ::geteuid());

  const std::string path = firewallLayer(*kernel, nft, cache);
  EXPECT_EQ(path.rfind(cache + "/fwlayer-", 0), 0U) << path;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600U);
  const ino_t inode = st.st_ino;
  const auto members = byName(readCpio(readFile(path)));

  ASSERT_EQ(members.count("compass/nft/nft"), 1U);
  EXPECT_EQ(members.at("compass/nft/nft").data, readFile(nft));
  EXPECT_EQ(members.at("compass/nft/nft").mode & 0111, 0100U);
  const auto libs = ldd(nft);
  ASSERT_FALSE(libs.empty());
  bool loader = false;
  for (const auto& [name, host] : libs) {
    loader = loader || name == "ld.so";
    ASSERT_EQ(members.count("compass/nft/" + name), 1U) << name << " (" << host << ")";
    EXPECT_EQ(members.at("compass/nft/" + name).data, readFile(host)) << name;
  }
  EXPECT_TRUE(loader);
  EXPECT_EQ(members.count("compass/nft/ld.so"), 1U);

  const std::string dir_in = "lib/modules/" + kernel->release + "/";
  for (const auto& m : firewallModules()) {
    const std::string name = dir_in + fs::path(m).filename().string() + ".ko";
    ASSERT_EQ(members.count(name), 1U) << name;
    // Without the distribution's appended signature (stripModuleSignature()).
    const std::string ko = kernel->modules + "/" + m + ".ko";
    EXPECT_TRUE(members.at(name).data == stripModuleSignature(readFile(ko), ko)) << name;
    EXPECT_FALSE(members.at(name).data.ends_with("~Module signature appended~\n")) << name;
  }
  ASSERT_EQ(members.count("lib/modules/order"), 1U);
  std::vector<std::string> words;
  std::istringstream order(members.at("lib/modules/order").data);
  for (std::string w; order >> w;) words.push_back(w);
  std::vector<std::string> expected;
  for (const auto& m : guestModules()) expected.push_back(fs::path(m).filename().string());
  for (const auto& m : firewallModules()) expected.push_back(fs::path(m).filename().string());
  EXPECT_EQ(words, expected);
  // modprobe -a finds each of them (no dependencies listed: the order file is the order).
  ASSERT_EQ(members.count(dir_in + "modules.dep"), 1U);
  for (const auto& w : expected) {
    EXPECT_NE(members.at(dir_in + "modules.dep").data.find(w + ".ko:\n"), std::string::npos) << w;
  }

  // Cached: the same file, not rebuilt.
  EXPECT_EQ(firewallLayer(*kernel, nft, cache), path);
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_ino, inode);
  size_t layers = 0;
  for (const auto& f : fs::directory_iterator(cache)) {
    layers += f.path().filename().string().rfind("fwlayer-", 0) == 0 ? 1 : 0;
  }
  EXPECT_EQ(layers, 1U);
}

TEST(MicrovmFirewallLayerTest, MissingNftIsNamed) {
  TempDir dir;
  try {
    firewallLayer(GuestKernel{}, dir.path() + "/no-nft", dir.path());
    ADD_FAILURE() << "a missing nft was accepted";
  } catch (const RunnerError& e) {
    EXPECT_NE(std::string(e.what()).find("nftables"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace runner::microvm
