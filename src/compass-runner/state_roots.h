#pragma once
// The state roots in use on this host by the podman and microvm tiers. Their leftovers
// (containers, netns `compass-<id>`, uid-range claims, rootfs mounts) are host-wide and named
// only by agent id, so `gc` under one root (COMPASS_STATE_DIR) must not take an agent whose
// record lies under another root for an orphan: each runner lists its root here before it
// makes anything, and gc looks for a record under every listed root.

#include <string>
#include <vector>

namespace runner {

/// One file per root, named by a hash of its path, holding the path: root-owned, mode 0700.
inline constexpr const char* kStateRootsDir = "/run/compass-roots";

/// Lists `root` (an absolute path) in `registry`; cheap when it already is (one stat).
/// Throws RunnerError if the registry is not a directory of the caller's, not group- or
/// world-writable, or cannot be written.
void registerStateRoot(const std::string& root, const std::string& registry = kStateRootsDir);

/// `own` and every listed root that is still a directory, without duplicates. Entries of roots
/// that no longer exist are removed. Never throws: an unreadable registry gives `own` alone.
std::vector<std::string> knownStateRoots(const std::string& own,
                                         const std::string& registry = kStateRootsDir);

}  // namespace runner
