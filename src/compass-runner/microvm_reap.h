#pragma once
// What `compass-runner gc` removes of a microVM agent whose runner died (microvm_backend.h).
// A runner killed with SIGKILL takes its QEMU and sam-box with it (PR_SET_PDEATHSIG), so
// normally only the state dir is left; these also find a QEMU or sam-box that survived (a
// runner killed between fork and prctl, or a process re-parented before it).

#include <string>
#include <vector>

namespace runner::microvm {

/// The pids of running QEMU processes whose `-pidfile` lies in `state_dir` (matched on
/// /proc/PID/cmdline, so a reused pid is never taken for the guest).
std::vector<int> qemuProcessesIn(const std::string& state_dir);

/// Kills (SIGKILL, then waits up to 5 s for it to go) the agent's QEMU and its sam-box
/// (`sam_box_pid` if it is still that agent's sam-box, and any other sam-box serving
/// `state_dir`/agent.sock). The caller removes the state dir. Never throws.
void reapAgent(const std::string& id, const std::string& state_dir, int sam_box_pid) noexcept;

/// For gc: the same for every agent under `root` with a QEMU or sam-box running, no id in
/// `live_ids` and no agent.json (asked after the listing: an agent started since `live_ids`
/// was read is left alone), and removes such an agent's state dir.
void reapOrphanGuests(const std::string& root, const std::vector<std::string>& live_ids);

}  // namespace runner::microvm
