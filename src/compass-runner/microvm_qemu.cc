#include "compass-runner/microvm_qemu.h"

#include <fcntl.h>
#include <linux/kvm.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "common/unique_fd.h"
#include "compass-runner/backend.h"
#include "compass-runner/process.h"

namespace runner::microvm {
namespace {

std::string envOr(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : std::string(fallback);
}

}  // namespace

std::string_view accelName(Accel a) { return a == Accel::kTcg ? "tcg" : "kvm"; }

std::optional<Accel> parseAccel(std::string_view text) {
  if (text.empty() || text == "kvm") return Accel::kKvm;
  if (text == "tcg") return Accel::kTcg;
  return std::nullopt;
}

std::string qemuEscape(std::string_view value) {
  std::string out;
  for (char c : value) {
    out += c;
    if (c == ',') out += ',';
  }
  return out;
}

std::string kernelCommandLine(Accel accel) {
  // quiet: every console byte is an emulated UART write. panic=-1: a guest that panics
  // reboots at once, and -no-reboot turns that into QEMU exiting. reboot=t: a triple fault,
  // which needs no device, when poweroff cannot be had.
  std::string line = "console=ttyS0 quiet panic=-1 reboot=t rdinit=/init";
  if (accel == Accel::kTcg) line += " tsc_early_khz=2000000 lpj=8000000";
  return line;
}

std::vector<std::string> qemuArgv(const QemuConfig& cfg) {
  std::vector<std::string> a = {cfg.qemu};
  for (const auto& [fd, set] : cfg.add_fds) {
    a.insert(a.end(), {"-add-fd", "fd=" + std::to_string(fd) + ",set=" + std::to_string(set)});
  }
  const std::vector<std::string> rest = {
      "-M",
      "microvm,pit=on,pic=on,rtc=on,isa-serial=on",
      "-accel",
      std::string(accelName(cfg.accel)),
      "-m",
      std::to_string(cfg.memory_mib) + "M",
      "-smp",
      std::to_string(cfg.cpus),
      "-nodefaults",
      "-no-user-config",
      "-nographic",
      "-no-reboot",
      // QEMU's own seccomp filter: no exec, no privilege changes, no obsolete syscalls.
      "-sandbox",
      "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
      "-kernel",
      cfg.kernel,
      "-initrd",
      cfg.initrd,
      "-append",
      kernelCommandLine(cfg.accel),
      "-chardev",
      "file,id=console,path=" + qemuEscape(cfg.console_log),
      "-serial",
      "chardev:console",
      "-drive",
      "if=none,id=root,format=raw,readonly=on,file=" + qemuEscape(cfg.root_image),
      "-device",
      "virtio-blk-device,drive=root",
      "-device",
      "virtio-serial-device,max_ports=8",
      "-chardev",
      "socket,id=control,path=" + qemuEscape(cfg.control_socket),
      "-device",
      std::string("virtserialport,chardev=control,name=") + kControlPort,
      "-chardev",
      "file,id=stdout,append=on,path=" + qemuEscape(cfg.stdout_path),
      "-device",
      std::string("virtserialport,chardev=stdout,name=") + kStdoutPort,
      "-chardev",
      "file,id=stderr,append=on,path=" + qemuEscape(cfg.stderr_path),
      "-device",
      std::string("virtserialport,chardev=stderr,name=") + kStderrPort,
      "-pidfile",
      cfg.pidfile,
  };
  a.insert(a.end(), rest.begin(), rest.end());
  if (!cfg.boundary_socket.empty()) {
    // sam-box closes a connection that sends nothing for 10 s, and the guest opens the port
    // only once it has booted: reconnect=1 makes QEMU dial again, and the guest's writes wait
    // for a connected host end.
    a.insert(a.end(),
             {"-chardev", "socket,id=boundary,reconnect=1,path=" + qemuEscape(cfg.boundary_socket),
              "-device", std::string("virtserialport,chardev=boundary,name=") + kBoundaryPort});
  }
  if (!cfg.tap.empty()) {
    // No vhost (no /dev/vhost-net use), no helper scripts: QEMU attaches to the tap the runner
    // made in the netns it runs in.
    a.insert(a.end(),
             {"-netdev",
              "tap,id=net0,ifname=" + qemuEscape(cfg.tap) + ",script=no,downscript=no,vhost=off",
              "-device", "virtio-net-device,netdev=net0"});
  }
  return a;
}

KvmProbe probeKvm(const std::string& device) {
  KvmProbe p;
  common::UniqueFd fd(::open(device.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd.valid()) {
    const int err = errno;
    p.reason = device + ": " + std::strerror(err) +
               (err == ENOENT ? " (no KVM: the CPU has no hardware virtualization, it is "
                                "disabled, or the kvm module is not loaded)"
                              : "");
    return p;
  }
  const int version = ::ioctl(fd.get(), KVM_GET_API_VERSION, 0);
  if (version != KVM_API_VERSION) {
    p.reason = device + ": KVM_GET_API_VERSION answered " + std::to_string(version) +
               " (expected " + std::to_string(KVM_API_VERSION) + "): not a usable KVM device";
    return p;
  }
  p.usable = true;
  return p;
}

std::string stdioTarget(int runner_fd, int set, bool* pass) {
  *pass = false;
  const int flags = ::fcntl(runner_fd, F_GETFL);
  if (flags < 0) return "/dev/null";
  if ((flags & O_ACCMODE) == O_WRONLY) {
    *pass = true;
    return "/dev/fdset/" + std::to_string(set);
  }
  return "/proc/self/fd/" + std::to_string(runner_fd);
}

std::string kvmDevice() { return envOr("COMPASS_KVM_DEVICE", "/dev/kvm"); }

std::string qemuBinary() { return envOr("COMPASS_QEMU", "qemu-system-x86_64"); }

std::string findQemu() {
  const std::string qemu = qemuBinary();
  const char* set = std::getenv("COMPASS_QEMU");
  const std::string what = set != nullptr && *set != '\0' ? "COMPASS_QEMU=\"" + qemu + "\"" : qemu;
  const std::string fix = set != nullptr && *set != '\0'
                              ? "point COMPASS_QEMU at qemu-system-x86_64, or unset it to use the "
                                "one on PATH"
                              : "apt-get install qemu-system-x86, or set COMPASS_QEMU to its path";
  std::string path;
  try {
    path = findProgram(qemu);
  } catch (const RunnerError&) {
    throw SpecRefused(what + ": not found on PATH; the microvm tier runs QEMU (" + fix + ")");
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw SpecRefused(what + ": " + std::strerror(errno) + "; the microvm tier runs QEMU (" + fix +
                      ")");
  }
  if (!S_ISREG(st.st_mode) || ::access(path.c_str(), X_OK) != 0) {
    throw SpecRefused(what + ": not an executable file; the microvm tier runs QEMU (" + fix + ")");
  }
  // QEMU runs in the agent's state dir: a relative path is resolved here, as the operator meant.
  return path.front() == '/' ? path : std::filesystem::absolute(path).string();
}

std::chrono::seconds bootTimeout(Accel accel) {
  const char* v = std::getenv("COMPASS_MICROVM_BOOT_TIMEOUT");
  if (v == nullptr || *v == '\0') {
    return accel == Accel::kTcg ? std::chrono::seconds(180) : std::chrono::seconds(30);
  }
  const std::string_view text(v);
  long secs = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), secs);
  if (ec != std::errc() || ptr != text.data() + text.size() || secs < 1 || secs > 3600) {
    throw RunnerError("COMPASS_MICROVM_BOOT_TIMEOUT=\"" + std::string(text) +
                      "\": expected whole seconds from 1 to 3600");
  }
  return std::chrono::seconds(secs);
}

}  // namespace runner::microvm
