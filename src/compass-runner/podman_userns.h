#pragma once
// Host id ranges for the podman tier's user namespaces (issue 4: "the container in its own
// user namespace so container root is not host root"). Each agent gets its own 65536 host
// uids/gids (`podman run --uidmap 0:BASE:65536 --gidmap 0:BASE:65536`), so no two agents —
// and no agent and the host — share a uid: a process that escapes one container is nobody
// to the others and to the host.
//
// Why the runner allocates and not `--userns=auto`: the sam-box socket must be chowned to the
// host uid of the agent's user *before* the container starts (the socket stays 0600, so
// only that sandbox can use it), and `--userns=auto` reveals the range only once the
// container exists. The range is claimed by creating kClaimDir/<slot> with O_EXCL (atomic
// across concurrent runners) and released at teardown or by gc.

#include <cstdint>
#include <string>
#include <vector>

namespace runner::podman {

/// First host id of the first range: [0x70000000, 0x80000000) holds kSlots ranges, far above
/// /etc/subuid's usual 100000.. allocations, and below 2^31 (tools that read uids as signed).
inline constexpr uint32_t kIdBase = 0x70000000;
inline constexpr uint32_t kIdsPerAgent = 65536;
inline constexpr uint32_t kSlots = 4096;
/// The agent's user inside the container (the image's "agent" user, image.cc).
inline constexpr uint32_t kAgentUid = 1000;
/// Claimed slots: one file per slot holding the agent id. Root-only, host-global (not under a
/// state root: two runners with different COMPASS_STATE_DIR share the host's uids).
inline constexpr const char* kClaimDir = "/run/compass-uidmap";

struct IdRange {
  uint32_t base = 0;  ///< host id of container id 0
  /// The host uid (and gid) the container's agent user (kAgentUid) maps to.
  [[nodiscard]] uint32_t agentHostId() const { return base + kAgentUid; }
};

/// Claims the first free slot for agent `id` in `claim_dir`. Throws RunnerError when every
/// slot is taken or the directory cannot be used.
IdRange claimIds(const std::string& id, const std::string& claim_dir = kClaimDir);

/// Releases the slot(s) `id` holds. Idempotent; never throws.
void releaseIds(const std::string& id, const std::string& claim_dir = kClaimDir) noexcept;

/// The agent ids holding a slot (for gc).
std::vector<std::string> claimedIds(const std::string& claim_dir = kClaimDir);

}  // namespace runner::podman
