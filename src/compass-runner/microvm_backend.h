#pragma once
// The microVM tier (seed 002 "microVM"; issue 5): one QEMU `-M microvm` guest per agent, with
// its own Debian kernel, and egress `boundary`: the guest has no network device at all; its
// nano-init reaches this agent's sam-box over one virtio-serial port (HTTP/2, one stream per
// flow). Pieces: microvm_qemu.h (command line, KVM probe), microvm_initramfs.h (the launch
// step), microvm_rootfs.h (the erofs root), microvm_cache.h (the image cache and what a killed
// build leaves in it), microvm_control.h (the control port).
//
// KVM floor, no silent degrade: without a usable /dev/kvm, start is refused; a KVM that opens
// but cannot run the guest (this host's paravirtual kvm_pvm) is found by the bounded wait for
// the guest's first line; `--accel tcg` is the only way to software emulation.
//
// See makeMicrovmBackend() in backend.h for the factory.

#include <chrono>
#include <string>

namespace runner::microvm {

/// Files in the agent's state dir.
inline constexpr const char* kSocketFile = "agent.sock";     ///< sam-box (QEMU dials it)
inline constexpr const char* kControlFile = "control.sock";  ///< the runner listens
inline constexpr const char* kConsoleLog = "console.log";    ///< the guest kernel's console
inline constexpr const char* kPidFile = "qemu.pid";          ///< QEMU -pidfile
inline constexpr const char* kInitrdFile = "initrd.cpio";
inline constexpr const char* kRootfsFile = "rootfs.erofs";  ///< --rootfs DIR's image
inline constexpr const char* kInfoFile = "microvm.json";    ///< accelerator, QEMU pid, images

/// sam-box's start, QEMU's connection to the control socket, the guest's power-off after it
/// reported the agent's status.
inline constexpr std::chrono::seconds kSamBoxStartTimeout{5};
inline constexpr std::chrono::seconds kConnectTimeout{20};
inline constexpr std::chrono::seconds kPowerOffTimeout{15};

/// For a failed start's message: "the end of the guest's console:" and the last lines of
/// `console_log`, or "the guest printed nothing on its console" when it holds nothing. The state
/// dir goes with a failed start, so the log is quoted, never named.
std::string consoleExcerpt(const std::string& console_log);

/// The agent's ids in the guest: the default image's `agent` user (as in the podman tier).
inline constexpr unsigned kAgentUid = 1000;
inline constexpr unsigned kAgentGid = 1000;

}  // namespace runner::microvm
