#pragma once
// `compass-runner image build`: the default local image (issue 4: no registry is reachable).
// A small Debian rootfs (shell, curl, python3, node, dig) made with debootstrap from Debian's
// archive and `podman import`ed. nano-init is NOT baked in: the podman backend bind-mounts the
// host's nano-init read-only, so any image (or --rootfs) works.

#include <string>

namespace runner::image {

/// The image `run` uses when neither --image nor --rootfs is given.
inline constexpr const char* kDefaultImage = "localhost/compass-agent:latest";

struct BuildOptions {
  std::string name = kDefaultImage;  ///< image reference to create
  bool force = false;                ///< rebuild even if the image exists
};

/// Builds the image unless it exists (or force). Progress lines go to stderr. Throws
/// RunnerError naming the failed step (debootstrap, import) and its stderr.
void build(const BuildOptions& opts);

/// True if podman has image `name`.
bool exists(const std::string& name);

/// True if `path` (absolute, as `--workdir` takes it) names a directory inside the root file
/// system at `root`, every symlink on the way resolved as if `root` were `/` (openat2(2)
/// RESOLVE_IN_ROOT), so an image's absolute links never lead to the host's files. False if it
/// is missing, not a directory, a symlink loop or too long a name; throws RunnerError for any
/// other failure (`root` unreadable, a kernel before 5.6).
bool isDirectoryIn(const std::string& root, const std::string& path);

/// isDirectoryIn() over image `name`'s file system: mounts it read-only for the check (`podman
/// image mount`, then `podman image unmount`), two podman starts, so it is asked only after a
/// start failed. Throws RunnerError if podman cannot mount it.
bool hasDirectory(const std::string& name, const std::string& path);

}  // namespace runner::image
