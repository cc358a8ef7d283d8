#pragma once
// The microVM tier's QEMU (issue 5; DESIGN.md "Known facts": QEMU `-M microvm` with a Debian
// guest kernel). One guest per agent, no network device:
//
//   virtio-blk  (read-only)  the agent's root file system, an erofs image (microvm_rootfs.h)
//   virtio-serial ports      compass.control   runner ⇄ guest: "boot", "up", "exit N" / "stop"
//                            compass.boundary  the agent's sam-box socket (HTTP/2, nano-init)
//                            compass.stdout    the agent's stdout (the runner's stdout)
//                            compass.stderr    the agent's stderr (the runner's stderr)
//   ttyS0                    the kernel console → <state>/console.log
//
// Everything here is pure except probeKvm() and the environment readers.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace runner::microvm {

/// The accelerator: KVM (the default; never replaced silently) or TCG (software emulation,
/// only when asked for with --accel tcg: slow, for tests).
enum class Accel { kKvm, kTcg };

/// "kvm" or "tcg".
std::string_view accelName(Accel a);

/// Parses --accel: "kvm" or "tcg"; "" = kvm (the default). nullopt for anything else.
std::optional<Accel> parseAccel(std::string_view text);

/// The virtio-serial port names the guest looks for in /sys/class/virtio-ports/*/name.
inline constexpr const char* kControlPort = "compass.control";
inline constexpr const char* kBoundaryPort = "compass.boundary";
inline constexpr const char* kStdoutPort = "compass.stdout";
inline constexpr const char* kStderrPort = "compass.stderr";

/// Default guest memory when --memory is not given, and the least accepted (MiB).
inline constexpr uint64_t kDefaultMemoryMiB = 512;
inline constexpr uint64_t kMinMemoryMiB = 128;

/// One guest's QEMU command line.
struct QemuConfig {
  std::string qemu = "qemu-system-x86_64";  ///< binary (PATH lookup without a slash)
  Accel accel = Accel::kKvm;
  std::string kernel;                       ///< the guest kernel (vmlinuz)
  std::string initrd;                       ///< the agent's initramfs (microvm_initramfs.h)
  std::string root_image;                   ///< erofs image, attached read-only as /dev/vda
  uint64_t memory_mib = kDefaultMemoryMiB;  ///< -m, MiB
  int cpus = 1;                             ///< -smp
  std::string console_log;                  ///< ttyS0 (kernel console) → this file
  std::string control_socket;               ///< Unix socket the runner listens on; QEMU connects
  std::string boundary_socket;  ///< sam-box's socket; QEMU connects (reconnect=1); empty = none
  /// Egress `firewall`: the tap device (in the netns QEMU runs in) behind the guest's
  /// virtio-net NIC; empty = the guest has no network device at all.
  std::string tap;
  std::string pidfile;  ///< -pidfile
  /// Where the agent's stdout and stderr go: a path QEMU opens (O_APPEND), or
  /// "/dev/fdset/N" for a descriptor handed over with `-add-fd` (add_fds), which shares the
  /// runner's file offset (stdoutTarget()).
  std::string stdout_path = "/proc/self/fd/1";
  std::string stderr_path = "/proc/self/fd/2";
  /// -add-fd fd=FD,set=SET for each pair (descriptors QEMU inherits).
  std::vector<std::pair<int, int>> add_fds;
};

/// Where QEMU should write what the agent writes to the runner's descriptor `runner_fd` (1 or
/// 2), if the runner passes a duplicate of it to QEMU in fd set `set` (QemuConfig::add_fds):
/// "/dev/fdset/SET" when `runner_fd` is open write-only (a file or pipe: QEMU then writes through
/// the runner's own open file, at its offset), "/proc/self/fd/N" when it is read-write (a terminal;
/// QEMU's fd set wants the exact access mode), "/dev/null" when it is closed. `*pass` says whether
/// the duplicate is to be passed.
std::string stdioTarget(int runner_fd, int set, bool* pass);

/// The kernel command line: console on ttyS0 (quiet), power off instead of rebooting
/// (panic=-1 with QEMU -no-reboot), and for TCG the fixed TSC/loop calibration this host
/// needs (`tsc_early_khz=2000000 lpj=8000000`). Nothing of the agent is on it (its command
/// goes in the initramfs: microvm_initramfs.h).
std::string kernelCommandLine(Accel accel);

/// `qemu-system-x86_64 -M microvm,… -nodefaults -no-user-config -nographic …` for `cfg`
/// (argv, argv[0] = cfg.qemu). Option values are escaped for QEMU (a ',' doubled).
std::vector<std::string> qemuArgv(const QemuConfig& cfg);

/// An option value as QEMU's parser needs it: every ',' doubled (qemu(1), "-drive").
std::string qemuEscape(std::string_view value);

/// Whether /dev/kvm can be used at all: `device` exists, opens O_RDWR and answers
/// KVM_GET_API_VERSION with 12 (Documentation/virt/kvm/api.rst). This cannot tell a KVM
/// that hangs stock guests (this host's paravirtual kvm_pvm): the boot timeout does that.
struct KvmProbe {
  bool usable = false;
  std::string reason;  ///< why not, naming the device and errno; empty when usable
};
KvmProbe probeKvm(const std::string& device);

/// $COMPASS_KVM_DEVICE, else "/dev/kvm" (tests point it at a missing path).
std::string kvmDevice();

/// How long the guest may take from QEMU's start to the "up" line of its launch step:
/// $COMPASS_MICROVM_BOOT_TIMEOUT (whole seconds, 1..3600) if set, else 30 s for KVM and
/// 180 s for TCG (a loaded 2-CPU host boots a TCG guest in 5 to 40 s). Throws RunnerError
/// naming the variable if it is malformed.
std::chrono::seconds bootTimeout(Accel accel);

/// QEMU's binary: $COMPASS_QEMU, else "qemu-system-x86_64" on PATH.
std::string qemuBinary();

/// qemuBinary() as the file that would run (a path as it is, a name looked up on PATH), checked
/// to be an executable file before anything is made. Throws SpecRefused naming COMPASS_QEMU
/// (when set) and the reason.
std::string findQemu();

}  // namespace runner::microvm
