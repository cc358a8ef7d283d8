// The microvm tier's pure parts: QEMU's command line, the kernel command line, the cpio writer,
// the modules' signature stripping, the agent's env file (run through a real /bin/sh), the
// accelerator and stdio choices.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "compass-runner/backend.h"
#include "compass-runner/microvm_initramfs.h"
#include "compass-runner/microvm_qemu.h"
#include "microvm_test_util.h"

namespace runner::microvm {
namespace {

bool has(const std::vector<std::string>& argv, const std::string& a, const std::string& b) {
  for (size_t i = 0; i + 1 < argv.size(); ++i) {
    if (argv[i] == a && argv[i + 1] == b) return true;
  }
  return false;
}

QemuConfig config() {
  QemuConfig c;
  c.kernel = "/k/vmlinuz";
  c.initrd = "/s/initrd.cpio";
  c.root_image = "/c/root,1.erofs";
  c.memory_mib = 256;
  c.cpus = 2;
  c.console_log = "/s/console.log";
  c.control_socket = "/s/control.sock";
  c.boundary_socket = "/s/agent.sock";
  c.pidfile = "/s/qemu.pid";
  return c;
}

TEST(MicrovmQemuTest, NoNetworkDeviceAndEveryPortNamed) {
  QemuConfig c = config();
  c.accel = Accel::kTcg;
  const auto argv = qemuArgv(c);
  EXPECT_EQ(argv.front(), "qemu-system-x86_64");
  EXPECT_TRUE(has(argv, "-M", "microvm,pit=on,pic=on,rtc=on,isa-serial=on"));
  EXPECT_TRUE(has(argv, "-accel", "tcg"));
  EXPECT_TRUE(has(argv, "-m", "256M"));
  EXPECT_TRUE(has(argv, "-smp", "2"));
  EXPECT_TRUE(has(argv, "-pidfile", "/s/qemu.pid"));
  for (const char* flag : {"-nodefaults", "-no-user-config", "-nographic", "-no-reboot"}) {
    EXPECT_NE(std::find(argv.begin(), argv.end(), flag), argv.end()) << flag;
  }
  // A ',' in a path is doubled, so it cannot add an option.
  EXPECT_TRUE(has(argv, "-drive", "if=none,id=root,format=raw,readonly=on,file=/c/root,,1.erofs"));
  EXPECT_TRUE(has(argv, "-device", "virtserialport,chardev=boundary,name=compass.boundary"));
  EXPECT_TRUE(has(argv, "-chardev", "socket,id=boundary,reconnect=1,path=/s/agent.sock"));
  EXPECT_TRUE(has(argv, "-chardev", "socket,id=control,path=/s/control.sock"));
  for (const auto& a : argv) {
    EXPECT_EQ(a.find("netdev"), std::string::npos) << a;
    EXPECT_EQ(a.find("virtio-net"), std::string::npos) << a;
  }
  EXPECT_NE(kernelCommandLine(Accel::kTcg).find("tsc_early_khz=2000000 lpj=8000000"),
            std::string::npos);
  EXPECT_EQ(kernelCommandLine(Accel::kKvm).find("lpj="), std::string::npos);
}

TEST(MicrovmQemuTest, EgressFirewallGetsATapNicAndNoBoundaryPort) {
  QemuConfig c = config();
  c.boundary_socket.clear();
  c.tap = "tap0";
  const auto argv = qemuArgv(c);
  EXPECT_TRUE(has(argv, "-netdev", "tap,id=net0,ifname=tap0,script=no,downscript=no,vhost=off"));
  EXPECT_TRUE(has(argv, "-device", "virtio-net-device,netdev=net0"));
  const auto mentions = [&argv](const std::string& text) {
    return std::any_of(argv.begin(), argv.end(),
                       [&](const std::string& a) { return a.find(text) != std::string::npos; });
  };
  EXPECT_FALSE(mentions(kBoundaryPort));
  EXPECT_FALSE(mentions("id=boundary"));
  // The other ports are all there.
  EXPECT_TRUE(
      has(argv, "-device", std::string("virtserialport,chardev=control,name=") + kControlPort));
  EXPECT_TRUE(mentions(kStdoutPort));
  EXPECT_TRUE(mentions(kStderrPort));
}

TEST(MicrovmQemuTest, AddFdComesFirstAndFdSetsAreUsed) {
  QemuConfig c = config();
  c.add_fds = {{3, 1}, {4, 2}};
  c.stdout_path = "/dev/fdset/1";
  c.stderr_path = "/dev/fdset/2";
  const auto argv = qemuArgv(c);
  EXPECT_EQ(argv[1], "-add-fd");
  EXPECT_EQ(argv[2], "fd=3,set=1");
  EXPECT_TRUE(has(argv, "-chardev", "file,id=stdout,append=on,path=/dev/fdset/1"));
  EXPECT_TRUE(has(argv, "-chardev", "file,id=stderr,append=on,path=/dev/fdset/2"));
}

TEST(MicrovmQemuTest, AccelIsKvmUnlessTcgIsAskedFor) {
  EXPECT_EQ(parseAccel(""), Accel::kKvm);
  EXPECT_EQ(parseAccel("kvm"), Accel::kKvm);
  EXPECT_EQ(parseAccel("tcg"), Accel::kTcg);
  EXPECT_FALSE(parseAccel("TCG"));
  EXPECT_FALSE(parseAccel("hvf"));
}

TEST(MicrovmQemuTest, BootTimeoutFromTheEnvironment) {
  ::unsetenv("COMPASS_MICROVM_BOOT_TIMEOUT");
  EXPECT_EQ(bootTimeout(Accel::kKvm).count(), 30);
  EXPECT_EQ(bootTimeout(Accel::kTcg).count(), 180);
  ::setenv("COMPASS_MICROVM_BOOT_TIMEOUT", "7", 1);
  EXPECT_EQ(bootTimeout(Accel::kKvm).count(), 7);
  for (const char* bad : {"0", "-1", "3601", "5s", " 5"}) {
    ::setenv("COMPASS_MICROVM_BOOT_TIMEOUT", bad, 1);
    EXPECT_THROW(bootTimeout(Accel::kKvm), RunnerError) << bad;
  }
  ::unsetenv("COMPASS_MICROVM_BOOT_TIMEOUT");
}

TEST(MicrovmQemuTest, KvmProbeNamesTheDevice) {
  const KvmProbe p = probeKvm("/nonexistent/kvm");
  EXPECT_FALSE(p.usable);
  EXPECT_NE(p.reason.find("/nonexistent/kvm"), std::string::npos) << p.reason;
  const KvmProbe null = probeKvm("/dev/null");  // opens, but answers no KVM ioctl
  EXPECT_FALSE(null.usable);
  EXPECT_NE(null.reason.find("KVM_GET_API_VERSION"), std::string::npos) << null.reason;
}

TEST(MicrovmQemuTest, StdioTargetSharesAWriteOnlyDescriptor) {
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  bool pass = false;
  EXPECT_EQ(stdioTarget(p[1], 1, &pass), "/dev/fdset/1");
  EXPECT_TRUE(pass);
  const int rw = ::open("/dev/null", O_RDWR);
  EXPECT_EQ(stdioTarget(rw, 2, &pass), "/proc/self/fd/" + std::to_string(rw));
  EXPECT_FALSE(pass);
  ::close(rw);
  EXPECT_EQ(stdioTarget(rw, 2, &pass), "/dev/null");
  ::close(p[0]);
  ::close(p[1]);
}

TEST(MicrovmInitramfsTest, CpioNewcLayout) {
  const std::string a = cpioArchive({{"bin", S_IFDIR | 0755, "", 0, 0},
                                     {"bin/x", S_IFREG | 0700, "hello", 0, 0},
                                     {"dev/console", S_IFCHR | 0600, "", 5, 1}});
  EXPECT_EQ(a.size() % 4, 0U);
  EXPECT_EQ(a.substr(0, 6), "070701");
  // Header: magic + 13 fields of 8 hex digits; then the name with its NUL, padded to 4.
  EXPECT_EQ(a.substr(6 + 8, 8), "000041ED");  // S_IFDIR | 0755
  EXPECT_NE(a.find("bin/x"), std::string::npos);
  EXPECT_NE(a.find("hello"), std::string::npos);
  EXPECT_NE(a.find("TRAILER!!!"), std::string::npos);
  EXPECT_THROW(cpioArchive({{std::string("a\0b", 3), S_IFREG, "", 0, 0}}), RunnerError);
}

// A module as Debian ships it: body, signature, struct module_signature (id_type 2 = PKCS#7,
// the length big-endian in its last 4 bytes), the marker.
std::string signedModule(const std::string& body, const std::string& sig, uint32_t claimed_len) {
  std::string info(12, '\0');
  info[2] = 2;
  for (int i = 0; i < 4; ++i) info[8 + i] = static_cast<char>((claimed_len >> (24 - 8 * i)) & 0xff);
  return body + sig + info + "~Module signature appended~\n";
}

TEST(MicrovmInitramfsTest, ModuleSignatureIsStrippedAndUnsignedModulesStayAsTheyAre) {
  const std::string body = std::string(
                               "\x7f"
                               "ELF",
                               4) +
                           std::string(200, 'm');
  const std::string sig(681, 's');
  EXPECT_EQ(stripModuleSignature(signedModule(body, sig, 681), "x.ko"), body);
  // Unsigned: unchanged, also when it merely mentions the marker somewhere inside.
  EXPECT_EQ(stripModuleSignature(body, "x.ko"), body);
  const std::string inside = body + "~Module signature appended~\n" + "tail";
  EXPECT_EQ(stripModuleSignature(inside, "x.ko"), inside);
  EXPECT_EQ(stripModuleSignature("", "x.ko"), "");
}

TEST(MicrovmInitramfsTest, ModuleSignatureLongerThanTheFileIsAnErrorNamingIt) {
  const std::string body(100, 'm');
  const std::string sig(50, 's');
  // The kernel's bound: the signature must leave at least one byte of module.
  EXPECT_EQ(stripModuleSignature(signedModule(body, sig, 149), "ok.ko"), std::string(1, 'm'));
  for (uint32_t bad : {150U, 151U, 0xffffffffU}) {
    try {
      stripModuleSignature(signedModule(body, sig, bad), "/k/bad.ko");
      ADD_FAILURE() << "no error for a claimed length of " << bad;
    } catch (const RunnerError& e) {
      EXPECT_NE(std::string(e.what()).find("/k/bad.ko"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(std::to_string(bad)), std::string::npos) << e.what();
    }
  }
  // The marker alone, or with less than a whole struct module_signature before it.
  EXPECT_THROW(stripModuleSignature("~Module signature appended~\n", "m.ko"), RunnerError);
  EXPECT_THROW(stripModuleSignature("12345~Module signature appended~\n", "m.ko"), RunnerError);
}

TEST(MicrovmInitramfsTest, TheGuestKernelsModulesStripToTheirElfImage) {
  GuestKernel kernel;
  try {
    kernel = findGuestKernel();
  } catch (const RunnerError& e) {
    GTEST_SKIP() << e.what();
  }
  for (const auto& m : guestModules()) {
    const std::string path = kernel.modules + "/" + m + ".ko";
    const std::string ko = testing::readFile(path);
    const std::string stripped = stripModuleSignature(ko, path);
    EXPECT_EQ(stripped.substr(0, 4),
              "\x7f"
              "ELF")
        << path;
    EXPECT_FALSE(stripped.ends_with("~Module signature appended~\n")) << path;
    EXPECT_LE(stripped.size(), ko.size()) << path;
    EXPECT_EQ(stripModuleSignature(stripped, path), stripped) << path;
  }
}

TEST(MicrovmInitramfsTest, AgentEnvQuotesEveryArgumentForARealShell) {
  GuestAgent agent;
  agent.workdir = "/work dir";
  agent.pids = 64;
  agent.command = {"printf", "%s|", "it's", "$(id)", "a b", "`x`", "\\n", ""};
  char path[] = "/tmp/microvm-env-XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  const std::string env = agentEnv(agent);
  ASSERT_EQ(::write(fd, env.data(), env.size()), static_cast<ssize_t>(env.size()));
  ::close(fd);
  const std::string cmd = std::string("sh -c '. ") + path +
                          " && echo \"$COMPASS_UID:$COMPASS_GID:$COMPASS_WORKDIR:$COMPASS_PIDS\" "
                          "&& \"$@\"' sh";
  FILE* out = ::popen(cmd.c_str(), "r");
  ASSERT_NE(out, nullptr);
  std::string got;
  char buf[256];
  while (size_t n = std::fread(buf, 1, sizeof buf, out)) got.append(buf, n);
  ::pclose(out);
  ::unlink(path);
  EXPECT_EQ(got, "1000:1000:/work dir:64\nit's|$(id)|a b|`x`|\\n||");
}

}  // namespace
}  // namespace runner::microvm
