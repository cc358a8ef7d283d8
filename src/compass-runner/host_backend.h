#pragma once
// The host tier (seed 002, "host"): the agent is a child of the runner under the runner's own
// uid, with no boundary at all. What it does get, each in its own step of start():
//   1. refusals: uid 0 (real or effective), any configured egress policy, and the flags only
//      a sandbox can honour (--image, --rootfs, limits, --sidecar-socket);
//   2. a private state dir (made by the runner, 0700) holding its own $HOME (home/), its
//      $TMPDIR (tmp/) and a read-only config view (config/: spec.json, bundle.yaml);
//   3. no operator terminal: stdin /dev/null, a session of its own, stdout/stderr through
//      pipes the runner relays to its own stdout/stderr.
// The state dir holds no socket: the socket of the other tiers is sam-box's agent.sock, and
// the host tier has no sam-box (egress is unenforced).

#include <sys/types.h>

#include <string>
#include <string_view>

namespace runner::host {

/// The environment variable that names the agent's sandbox id in every host-tier agent
/// process (and its descendants); gc finds a dead runner's leftover processes by it.
inline constexpr const char* kAgentIdEnv = "COMPASS_AGENT_ID";

/// The lines printed on stderr when an agent starts with egress unenforced: says plainly that
/// nothing limits where it connects, and how to graduate (--backend podman).
std::string unenforcedBanner();

/// The refusal for a configured egress policy on the host tier (seed 002: "The runner refuses
/// any configured egress policy rather than ignore it"). `what` names the setting.
std::string egressRefusal(std::string_view what);

/// SIGKILLs every process owned by `uid` whose initial environment holds
/// COMPASS_AGENT_ID=<id>, until none is left (bounded rounds). Returns how many it killed.
/// Processes of other uids are never touched, so a forged record cannot aim it elsewhere.
int killAgentProcesses(const std::string& id, uid_t uid);

}  // namespace runner::host
