#pragma once
// The microVM tier's cache of built images (COMPASS_MICROVM_CACHE): root images
// (rootfs-<image id>.erofs, microvm_rootfs.h) and initramfs archives (initramfs-*.cpio,
// fwlayer-*.cpio, microvm_initramfs.h). What is cached here is booted for later agents, so the
// directory must be the runner's alone; and every file is written under a temporary name
// (tempPathFor()) and renamed, so a writer killed half-way leaves only a temporary, which
// removeDeadTemporaries() (gc, and the next root-image build) removes once its writer is gone.

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace runner::microvm {

/// $COMPASS_MICROVM_CACHE (trailing slashes dropped), else /var/lib/compass/microvm; nothing is
/// created. Throws SpecRefused naming the variable if it is not an absolute path (QEMU runs in
/// the agent's state dir: it would not find an image cached under a relative one).
std::string cacheDirSetting();

/// cacheDirSetting(), created 0700 if missing, checked on the opened directory (fstat): not a
/// symlink, owned by the runner's euid, not writable by its group or others (anyone who could
/// write it could plant what later guests boot; an existing such directory is refused, not
/// repaired, since something may have been planted already). Group or other read bits are
/// taken away. Throws SpecRefused naming COMPASS_MICROVM_CACHE and the reason.
std::string cacheDir();

/// The lock a root-image build holds (flock) from before `podman image mount` until after the
/// unmount: <cache_dir>/rootfs.lock.
std::string rootfsLockPath(const std::string& cache_dir);

/// The temporary name a writer gives `path` while it writes it: PATH.tmp.PID, PID its own.
std::string tempPathFor(const std::string& path);

/// The writer's pid of a temporary in the cache: `name` is rootfs-*.tmp.PID, initramfs-*.tmp.PID,
/// fwlayer-*.tmp.PID or nano-init.strip.PID (a stripped nano-init being read back). nullopt for
/// any other name (never removed).
std::optional<pid_t> temporaryWriter(std::string_view name);

/// Whether a process with id `pid` exists (kill(pid, 0)), zombies included. A pid reused by
/// another process counts as existing: a temporary is then only kept longer.
bool processExists(pid_t pid);

/// Unmounts podman image `image_id` once (`podman image unmount ID`: podman counts mounts, so
/// this undoes exactly the dead build's mount). Returns "" or what failed.
using ImageUnmount = std::function<std::string(const std::string& image_id)>;

/// Removes the temporaries of `cache_dir` (temporaryWriter()) whose writer no longer exists
/// (processExists()) and that no process has open (a child the writer left, such as its
/// mkfs.erofs, may still be writing it): a root image's (rootfs-ID.erofs.tmp.PID, about 200 MB)
/// only when `builds_idle` (the caller holds rootfs.lock, so no build in this or another pid
/// namespace is writing one), after `unmount(ID)` (the build died with the image mounted); an
/// initramfs's or nano-init's once untouched for 10 minutes (a writer in another pid namespace,
/// whose pid means nothing here, writes one in seconds). The directory is opened once and used by
/// its descriptor; one not owned by the runner's euid is left alone. Returns the names removed, and
/// in `*notes` what the operator should know (an unmount that failed). Never throws.
std::vector<std::string> removeDeadTemporaries(const std::string& cache_dir, bool builds_idle,
                                               const ImageUnmount& unmount,
                                               std::vector<std::string>* notes);

/// For gc: removeDeadTemporaries() of `cache_dir` if it exists, with `builds_idle` when
/// rootfs.lock can be taken without waiting (held meanwhile, so no build starts). Prints what it
/// removed on stdout and the notes on stderr. Never throws.
void reapCacheLeftovers(const std::string& cache_dir, const ImageUnmount& unmount);

}  // namespace runner::microvm
