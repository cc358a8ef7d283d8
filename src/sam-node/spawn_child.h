#pragma once
// The compass-runner processes that POST /ops/spawn starts (ops.cc): each is started with
// posix_spawn, watched by one thread that reads its stderr for the line
// "compass-runner: agent <id> running (...)" (compass-runner's run.cc prints it once the agent
// runs), keeps draining its output afterwards, and reaps it. Destroying SpawnedRunners stops
// (SIGTERM, then SIGKILL after kStopGrace) those still running.

#include <sys/types.h>

#include <chrono>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace samnode {

/// How long a runner has to report its agent running before it is stopped.
inline constexpr std::chrono::milliseconds kSpawnDeadline{60000};
/// How long runners get after SIGTERM at shutdown before SIGKILL.
inline constexpr std::chrono::milliseconds kStopGrace{10000};

struct SpawnOutcome {
  enum Kind { kRunning, kCannotStart, kExited, kTimeout };
  Kind kind = kCannotStart;
  std::string id;      ///< kRunning: the agent id the runner printed
  pid_t pid = -1;      ///< the runner's pid (kRunning)
  std::string detail;  ///< kCannotStart: errno text; kExited: the runner's last stderr line
};

/// Returns the agent id of a line "compass-runner: agent <id> running..." (the id is
/// [A-Za-z0-9._-]+), or nullopt for any other line.
std::optional<std::string> parseRunningLine(std::string_view line);

class SpawnedRunners {
 public:
  SpawnedRunners() = default;
  ~SpawnedRunners();
  SpawnedRunners(const SpawnedRunners&) = delete;
  SpawnedRunners& operator=(const SpawnedRunners&) = delete;

  /// Starts argv (argv[0] searched on PATH; stdin /dev/null; stdout and stderr to pipes; a
  /// new session; no descriptor of the node inherited) and waits up to `deadline` for the
  /// running line. On kTimeout the runner has been sent SIGTERM. `label` and `caller` go into
  /// the log lines of this runner. Thread-safe.
  SpawnOutcome start(const std::vector<std::string>& argv, std::string_view label,
                     std::string_view caller, std::chrono::milliseconds deadline = kSpawnDeadline);

  /// Runners started and not yet reaped.
  [[nodiscard]] size_t running() const;

 private:
  struct Child;
  mutable std::mutex mu_;
  std::list<std::shared_ptr<Child>> children_;
};

}  // namespace samnode
