#pragma once
// What `compass-runner gc` (and stop after a killed runner) removes for the podman tier:
// everything one agent's start made, found from its record or derived from its id, so a
// runner killed at any step leaves nothing gc cannot find (issue 4, "kill -9 of the runner").

#include <sys/types.h>
#include <string>
#include <vector>

namespace runner::podman {

/// Removes what the start of agent `id` made: its container (`container`, or compass-<id>
/// when empty), its --rootfs overlay, its sam-box (`sam_box_pid`, only if that pid is still a
/// sam-box serving `state_dir`/agent.sock; -1 when unknown), its firewall (firewall::reap), its
/// netns (`ns`, or compass-<id> when empty) and its claimed id range. `conf` is the runner's
/// containers.conf (podman_conf.h). What could not be removed is said on stderr and left for
/// the next gc; throws only std::bad_alloc.
void reapAgent(const std::string& conf, const std::string& id, std::string container,
               std::string ns, pid_t sam_box_pid, const std::string& state_dir);

/// Reaps every agent of the podman tier that is not in `live_ids` and has no agent.json (a
/// runner killed before it wrote one; a record is checked after the listing, so an agent
/// started since `live_ids` was read is left alone): containers labelled compass.agent, netns
/// named compass-<id>, claimed id ranges, --rootfs overlays and sam-box processes serving a
/// socket under the tier's state root. Throws RunnerError if podman cannot
/// list the containers (podman_cli.h agentContainers()).
void reapOrphanAgents(const std::string& conf, const std::vector<std::string>& live_ids);

}  // namespace runner::podman
