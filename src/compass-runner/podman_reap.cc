// gc for the podman tier (podman_reap.h).
#include "compass-runner/podman_reap.h"

#include <cstdio>
#include <set>

#include "compass-runner/backend.h"
#include "compass-runner/firewall.h"
#include "compass-runner/netns.h"
#include "compass-runner/podman_backend.h"
#include "compass-runner/podman_cli.h"
#include "compass-runner/podman_rootfs.h"
#include "compass-runner/podman_userns.h"
#include "compass-runner/sam_box_process.h"
#include "compass-runner/state.h"
#include "compass-runner/state_roots.h"

namespace runner::podman {

void reapAgent(const std::string& conf, const std::string& id, std::string container,
               std::string ns, pid_t sam_box_pid, const std::string& state_dir) {
  if (container.empty()) container = netns::nameFor(id);
  if (ns.empty()) ns = netns::nameFor(id);
  // A container that could not be removed may still run: its rootfs stays mounted and its
  // host ids claimed (the next gc retries), so that no other agent is given them meanwhile.
  const bool gone = removeContainer(conf, container);
  if (!gone) {
    note("gc: could not remove container " + container + "; its host ids stay claimed");
  } else if (!unmountRootfs(id, state_dir)) {
    note("gc: could not unmount the --rootfs overlay of " + id);
  }
  const std::string socket = state_dir + "/" + kSocketFile;
  if (sam_box_pid > 0 && isSamBoxFor(sam_box_pid, socket)) killSamBox(sam_box_pid);
  firewall::reap(id);
  if (!netns::remove(ns)) note("gc: could not remove netns " + ns);
  if (gone) releaseIds(id);
}

void reapOrphanAgents(const std::string& conf, const std::vector<std::string>& live_ids) {
  const std::set<std::string> live(live_ids.begin(), live_ids.end());
  const std::string root = stateRoot("podman");
  // Every root in use (COMPASS_STATE_DIR may differ between runners): an agent whose record
  // is under another root is that root's, live or not (state_roots.h).
  const std::vector<std::string> roots = knownStateRoots(root);
  std::set<std::string> elsewhere;  // ids with a record under another root, said once
  // Asked after each listing, not only from `live_ids` (read before it): a runner that
  // started since wrote its agent.json before it made anything listed here. A record whose
  // runner is dead was reaped by gc through the record already.
  auto orphan = [&](const std::string& id) {
    if (id.empty() || live.count(id) != 0 || hasRecordFile(root + "/" + id)) return false;
    for (const auto& other : roots) {
      if (other == root) continue;
      const std::string dir = std::string(other).append("/").append(id);
      if (!hasRecordFile(dir)) continue;
      if (auto rec = readRecord(dir)) {
        if (!runnerAlive(*rec) && elsewhere.insert(id).second) {
          std::string text = "gc: agent ";
          text.append(id).append(" belongs to state root ").append(other);
          text.append(" and its runner is gone; run `COMPASS_STATE_DIR=").append(other);
          text.append(" compass-runner gc` to remove it");
          note(text);
        }
      }
      return false;
    }
    return true;
  };
  std::set<std::string> dead;
  auto consider = [&](const std::string& id) {
    if (orphan(id)) dead.insert(id);
  };
  for (const auto& id : agentContainers(conf)) consider(id);
  for (const auto& id : netns::listAgentIds()) consider(id);
  for (const auto& id : claimedIds()) consider(id);
  for (const auto& id : rootfsIds()) consider(id);
  for (const auto& [pid, sock] : samBoxesUnder(root)) {
    // <root>/<id>/sam/agent.sock: the id is the first component under root.
    const std::string rest = sock.substr(root.size() + 1);
    if (orphan(rest.substr(0, rest.find('/')))) killSamBox(pid);
  }
  for (const auto& id : dead) {
    reapAgent(conf, id, "", "", -1, std::string(root).append("/").append(id));
    std::printf("removed leftovers of agent %s (tier podman; no record under any state root)\n",
                id.c_str());
  }
}

}  // namespace runner::podman
