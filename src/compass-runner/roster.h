#pragma once
// The roster (issue 4, "Roster"; seed 002: "compass agent and the agent roster show the
// posture as unenforced, so a green launch is never read as contained"): `agents`, `stop`,
// `resize` and `gc` over the agent.json records of state.h. A record counts as live while its
// runner is (runnerAlive()).
//
// Records are written by runners, but a host-tier agent runs under its runner's uid and could
// edit its own: so a record is trusted only for what its writer's uid could do anyway. `stop`
// signals a runner only if it runs under the uid that owns the state dir, gc kills host-tier
// leftovers only of that uid, and metrics are scraped only from a loopback address.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "compass-runner/options.h"
#include "compass-runner/state.h"

namespace runner {

/// How long `agents` waits for one sam-box's /metrics (connect + answer).
inline constexpr std::chrono::milliseconds kScrapeTimeout{1000};
/// How long `stop` waits for the runner to end (its agent gets kStopGrace, 10 s, first).
inline constexpr std::chrono::seconds kStopWait{30};

/// Flow counts of one sam-box: sam_box_flows_total summed over routes, by outcome
/// (docs/sam-box.md: outcome = allowed, denied, error).
struct FlowCounts {
  uint64_t allowed = 0;
  uint64_t denied = 0;
};

/// Sums sam_box_flows_total{outcome="allowed"|"denied",...} over the Prometheus text
/// exposition (format 0.0.4) `text`. Other metrics, comments and malformed lines are skipped;
/// no series at all means zero flows.
FlowCounts parseFlowCounts(std::string_view text);

/// The body of an HTTP/1.x response held whole in `response`, if its status is 200 and it is
/// not chunked (Content-Length honoured when present). nullopt otherwise.
std::optional<std::string> httpBody(std::string_view response);

/// GET /metrics from `addr` ("127.0.0.1:PORT" or "[::1]:PORT"; any other host is refused)
/// within `timeout`, and parseFlowCounts() of it. nullopt on any failure.
std::optional<FlowCounts> scrapeFlowCounts(const std::string& addr,
                                           std::chrono::milliseconds timeout = kScrapeTimeout);

/// One live agent as `agents` shows it.
struct RosterEntry {
  AgentRecord rec;
  int64_t uptime_s = 0;
  std::optional<FlowCounts> flows;  ///< nullopt: no sam-box, or it did not answer
};

/// "45s", "3m07s", "2h05m", "3d04h".
std::string formatUptime(int64_t seconds);

/// The table `agents` prints: a header line (ID TIER EGRESS PID UPTIME ALLOWED DENIED COMMAND)
/// and one line per entry; "-" where there are no flow counts.
std::string formatTable(const std::vector<RosterEntry>& entries);

/// The JSON array `agents --json` prints: objects with id, tier, egress, pid, uptime_s,
/// allowed, denied (numbers, or null without a sam-box), command (array), agent_id,
/// runner_pid, state_dir.
std::string formatJson(const std::vector<RosterEntry>& entries);

/// Every live agent, with uptimes taken now and flow counts scraped.
std::vector<RosterEntry> liveAgents();

/// `compass-runner agents [--json]`; returns the exit code.
int listAgents(const AgentsOptions& opts);

/// `compass-runner stop ID`: SIGTERM to the agent's runner, then waits (up to kStopWait) for
/// the runner to end and its record to go. Exit 1 naming the id if it is not a live agent,
/// or if it did not stop in time.
int stopAgent(const StopOptions& opts);

/// `compass-runner resize ID …`: Backend::resize() of the agent's tier. Exit 1 with the
/// tier's reason if it cannot (host: no cgroup).
int resizeAgent(const ResizeOptions& opts);

/// `compass-runner gc`: for each record whose runner is dead, the tier's reap() and the state
/// dir's removal; then every available tier's reapOrphans() with the live ids — skipping, with
/// a note, a tier whose state root belongs to another uid unless the caller is root. Prints
/// one line per thing removed. Exit 0, or 1 if something could not be removed (it says what).
int collectGarbage();

}  // namespace runner
