#pragma once
// `--rootfs DIR` in the podman tier. The agent's user namespace maps container ids 0..65535 to
// host ids BASE..BASE+65535 (podman_userns.h), so a directory owned by host root is nobody's
// inside the container: runc (container root) cannot even create its mount points in it, and
// podman's own `DIR:O` overlay fails the same way. So the runner makes the overlay itself —
// DIR as the read-only lower layer, the upper and work dirs in the agent's state dir — and
// shifts every owner in the merged view by BASE (lchown; with overlayfs metacopy only the
// metadata is copied up, a few MiB for a Debian root). DIR itself is never written.
//
// The merged view is mounted under kMountDir, not in the 0700 state dir: runc, as the
// container's root (an unprivileged host uid), must be able to walk the path to it.

#include <cstdint>
#include <string>
#include <vector>

namespace runner::podman {

/// Where merged views are mounted: kMountDir/<id>. Mode 0711: walkable, not listable.
inline constexpr const char* kMountDir = "/run/compass-rootfs";

/// Mounts the overlay at kMountDir/<id> (upper/work in <state_dir>/rootfs.d, so the agent's
/// writes count against its memory limit on /run's tmpfs and go with its state dir) and
/// shifts ids below 65536 by `id_base` in it. Returns the merged path for `podman run
/// --rootfs`. Throws RunnerError naming the failing call (and unmounts what it mounted).
std::string mountShiftedRootfs(const std::string& dir, const std::string& id,
                               const std::string& state_dir, uint32_t id_base);

/// Unmounts kMountDir/<id> if mounted (lazily, so a process still inside cannot pin it) and
/// removes it and <state_dir>/rootfs.d (if `state_dir` is not empty). Idempotent; never
/// throws; false if it is still mounted.
bool unmountRootfs(const std::string& id, const std::string& state_dir) noexcept;

/// The ids with an entry in kMountDir (for gc).
std::vector<std::string> rootfsIds();

}  // namespace runner::podman
