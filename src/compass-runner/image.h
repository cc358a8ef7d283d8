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

}  // namespace runner::image
