#pragma once
// The microVM guest's initramfs (issue 5: "an initramfs the runner builds holding nano-init,
// the kernel modules it needs and the agent launch step"). Two cpio archives, concatenated
// (the kernel unpacks every archive it finds, later files over earlier ones:
// Documentation/driver-api/early-userspace/buffer-format.rst):
//
//   base (cached per kernel + nano-init + busybox + scripts)   agent (per start, < 4 KiB)
//     /init               stage 1 (busybox sh)                   /compass/agent.env
//                                                                [/compass/firewall.nft]
//     /compass/busybox    Debian's busybox-static (/bin/busybox links to it)
//     /lib/modules/*.ko   virtio, virtio-mmio, console, blk, erofs, overlay, tun (unsigned)
//     /compass/nano-init  stripped copy of the runner's nano-init
//     /compass/stage2     stage 2 (busybox sh)
//
//   firewall layer (egress `firewall` only, cached): more modules, /compass/nft/ (nft + libs)
//
// Stage 1 (PID 1 in the initramfs) loads the modules, says "boot" on the control port; with
// egress `firewall` it loads the ruleset, checks that both chains drop by default, configures
// eth0 and says "armed" (seed 002's in-guest-armed marker); it sets kernel.modules_disabled
// (no module loads after this, for anyone); then it mounts
// the erofs root read-only under a tmpfs overlay (writable scratch that dies with the VM) and
// switch_roots into it. Stage 2 (PID 1 in the agent's root) writes the virtual DNS's
// resolv.conf (or, with egress `firewall`, the host end as resolver), says "up", runs `nano-init
// run --user UID:GID h2+dev://<boundary port> CMD…` (`nano-init supervise --user UID:GID CMD…` with
// egress `firewall`) with stdout/stderr on their ports, stops it on "stop", applies "allow" batches
// to the ruleset, reports "exit N", powers off.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace runner::microvm {

/// One file, directory, symlink or device node of a cpio archive.
struct CpioEntry {
  std::string name;   ///< path without a leading '/', e.g. "bin/busybox"
  uint32_t mode = 0;  ///< st_mode: type bits (S_IFREG, S_IFDIR, S_IFLNK, S_IFCHR), permissions
  std::string data;   ///< a regular file's content, a symlink's target
  uint32_t rdev_major = 0;
  uint32_t rdev_minor = 0;
};

/// A cpio "newc" archive (SVR4, magic 070701) of `entries`, in order, with its TRAILER!!!
/// entry. Owners are 0:0, mtimes 0. Throws RunnerError for a name with a NUL or over 4 KiB.
std::string cpioArchive(const std::vector<CpioEntry>& entries);

/// `text` as one POSIX shell word: single-quoted, each ' written as '\''.
std::string shellQuote(std::string_view text);

/// Egress `firewall` in the guest (issue 5): what stage 1 arms before the root is mounted and
/// stage 2 uses. Addresses as in firewall::Addressing (ruleset.h).
struct GuestFirewall {
  /// sandboxRuleset() text and the pre-resolved `add element` lines, loaded with one `nft -f`
  std::string ruleset;
  std::string address4;  ///< eth0's IPv4 with prefix, "10.231.0.6/30"
  std::string address6;  ///< eth0's IPv6 with prefix, "fd5a:7c3e:91b4:1::2/64"
  std::string gateway4;  ///< the host end, also the resolver: "10.231.0.5"
  std::string gateway6;  ///< "fd5a:7c3e:91b4:1::1"
};

/// What stage 2 needs of the agent.
struct GuestAgent {
  uint32_t uid = 1000;  ///< the agent's ids in the guest (the default image's `agent`)
  uint32_t gid = 1000;
  std::string workdir = "/";         ///< absolute
  std::optional<uint64_t> pids;      ///< RLIMIT_NPROC of the agent's uid in the guest
  std::vector<std::string> command;  ///< never empty
  /// Egress `firewall`: armed in the guest; nullopt = egress `boundary` (nano-init, sam-box).
  std::optional<GuestFirewall> firewall;
};

/// /compass/agent.env: shell assignments and `set -- CMD…`, every value shellQuote()d.
std::string agentEnv(const GuestAgent& agent);

/// The agent's archive (/compass/agent.env, and /compass/firewall.nft with egress firewall).
/// Throws RunnerError if a firewall field holds a character a shell or nft could misread.
std::string agentCpio(const GuestAgent& agent);

/// The guest kernel: `dir` holds boot/vmlinuz-RELEASE and lib/modules/RELEASE/ (Debian's
/// linux-image-*-cloud-amd64 unpacked by scripts/install-deps).
struct GuestKernel {
  std::string dir;
  std::string vmlinuz;
  std::string modules;  ///< lib/modules/RELEASE/kernel
  std::string release;
};

/// $COMPASS_GUEST_KERNEL, else /usr/local/lib/compass/guest-kernel.
std::string guestKernelDir();

/// Finds the kernel in guestKernelDir() (the newest release when several). Throws RunnerError
/// saying to run scripts/install-deps if it is missing.
GuestKernel findGuestKernel();

/// The modules stage 1 loads, in dependency order (paths under GuestKernel::modules, no .ko).
const std::vector<std::string>& guestModules();

/// A .ko file's bytes without the signature its distribution appended (include/linux/
/// module_signature.h: the signature, a 12-byte struct module_signature whose last 4 bytes are
/// the signature's length, big-endian, then "~Module signature appended~\n"), for the
/// initramfs: under TCG the guest would check each signature (hash + RSA) emulated; the guest
/// kernel does not force signatures, loads the module unsigned and taints itself 'E' once.
/// A file without the trailer comes back unchanged. Throws RunnerError naming `what` if the
/// trailer is there but its length does not fit the file (the guest kernel would refuse such a
/// module, signatures forced or not: failing here says which file, before any guest boots).
std::string stripModuleSignature(std::string ko, const std::string& what);

/// The base initramfs for `kernel`, `nano_init` and `busybox`, built once into `cache_dir`
/// (atomic rename; the name carries a hash of every input's path, size and mtime and of the
/// scripts) and reused. nano-init is stripped with `strip` when that exists. Returns its path.
/// Throws RunnerError naming the missing input.
std::string baseInitramfs(const GuestKernel& kernel, const std::string& nano_init,
                          const std::string& busybox, const std::string& cache_dir);

/// The modules stage 1 loads with egress `firewall` besides guestModules(): virtio-net and
/// nftables with conntrack and reject, in dependency order.
const std::vector<std::string>& firewallModules();

/// The firewall layer, an archive laid over the base (egress `firewall` only): the modules of
/// guestModules() and firewallModules() with their order file (replacing the base's), and the
/// host's `nft` (`nft`, found as findProgram() finds it) with its shared libraries and loader
/// (from ldd(1)) under /compass/nft/. Cached in `cache_dir` like baseInitramfs(). Throws
/// RunnerError naming what is missing (nft: apt-get install nftables).
std::string firewallLayer(const GuestKernel& kernel, const std::string& nft,
                          const std::string& cache_dir);

/// Writes `base`, then each of `layers`, then agentCpio(agent) to `out` (mode 0600). Throws
/// RunnerError.
void writeAgentInitramfs(const std::string& base, const std::vector<std::string>& layers,
                         const GuestAgent& agent, const std::string& out);

/// Debian's busybox-static: $COMPASS_BUSYBOX, else /bin/busybox. Throws RunnerError if it is
/// not a static executable (stage 2 runs it in the agent's root, which has no libc of ours).
std::string findBusybox();

}  // namespace runner::microvm
