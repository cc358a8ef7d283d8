#pragma once
// The microVM guest's root file system (issue 5: "the same local image as the podman tier"):
// a read-only erofs image (mkfs.erofs, uncompressed: the guest reads it through virtio-blk),
// overlaid in the guest by a tmpfs for writes that die with the VM. The guest kernel has no
// 9p, so a directory cannot be shared as is.
//
//   --image IMG (default localhost/compass-agent:latest): `podman image mount`, mkfs.erofs,
//     cached as <cache>/rootfs-<image id>.erofs — built once per image id (~10 s for the
//     default image), reused by every later agent;
//   --rootfs DIR: an erofs image of DIR in the agent's state dir, built at each start (DIR may
//     change between runs; DIR is only read).

#include <string>

#include "compass-runner/microvm_cache.h"

namespace runner::microvm {

/// The cached erofs image of podman image `image` (podman reads the runner's containers.conf
/// `conf`). The image's id comes from podman's default store's images.json when the name is
/// there (no podman process on the agent's path), else from `podman image inspect`. Concurrent
/// starts build it once (an flock on <cache_dir>/rootfs.lock); the one holding it first removes
/// what a killed build left (removeDeadTemporaries()). Throws SpecRefused if podman has no such
/// image (saying how to build the default one), RunnerError naming the failed step otherwise.
std::string imageRootfs(const std::string& image, bool default_image, const std::string& conf,
                        const std::string& cache_dir);

/// `podman image unmount ID` with the runner's containers.conf `conf`, for
/// removeDeadTemporaries() (microvm_cache.h).
ImageUnmount podmanUnmount(const std::string& conf);

/// Builds the erofs image of directory `dir` at `out`. Throws RunnerError.
void dirRootfs(const std::string& dir, const std::string& out);

}  // namespace runner::microvm
