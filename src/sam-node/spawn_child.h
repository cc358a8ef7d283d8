#pragma once
// The compass-runner processes that POST /ops/spawn starts (ops.cc): each is started with
// posix_spawn, watched by one thread that reads its stderr for the line
// "compass-runner: agent <id> running (...)" (compass-runner's run.cc prints it once the agent
// runs), keeps draining its output afterwards, and reaps it. Destroying SpawnedRunners stops
// (SIGTERM, then SIGKILL after kStopGrace) those still running.

#include <sys/types.h>

#include <chrono>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
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

/// Most spawns waiting for their runner's "running" line at once, node-wide. Each holds a
/// connection thread of the node for up to kSpawnDeadline and a runner that is building a
/// sandbox (pulling and starting a container, booting a VM): a few at a time already fill the
/// small hosts the node runs on, and more only push every one of them towards the deadline.
inline constexpr size_t kMaxPendingSpawns = 4;
/// Most pending spawns of one agent: half the node's, so one agent (looping, or hostile) cannot
/// take every slot and lock the other agents of the node out of spawning.
inline constexpr size_t kMaxPendingSpawnsPerAgent = 2;

/// Admission for POST /ops/spawn: counts spawns in progress, node-wide and per caller, against
/// kMaxPendingSpawns and kMaxPendingSpawnsPerAgent (or the limits given). Thread-safe.
class PendingSpawns {
 public:
  /// A spawn in progress; the slot is given back when the Slot is destroyed.
  class Slot {
   public:
    Slot(Slot&& other) noexcept : owner_(other.owner_), caller_(std::move(other.caller_)) {
      other.owner_ = nullptr;
    }
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    Slot& operator=(Slot&&) = delete;
    ~Slot();

   private:
    friend class PendingSpawns;
    Slot(PendingSpawns* owner, std::string caller) : owner_(owner), caller_(std::move(caller)) {}
    PendingSpawns* owner_;
    std::string caller_;
  };

  explicit PendingSpawns(size_t max_total = kMaxPendingSpawns,
                         size_t max_per_agent = kMaxPendingSpawnsPerAgent)
      : max_total_(max_total), max_per_agent_(max_per_agent) {}

  /// A slot for `caller` (an agent id), or nullopt when the node or the caller is at its cap;
  /// then `why` (if given) says which, e.g. "agent a.example already has 2 spawns in
  /// progress (the most one agent may have)".
  std::optional<Slot> tryAcquire(std::string_view caller, std::string* why = nullptr);

  /// Spawns in progress, node-wide.
  [[nodiscard]] size_t pending() const;

 private:
  void release(const std::string& caller);
  size_t max_total_;
  size_t max_per_agent_;
  mutable std::mutex mu_;
  size_t total_ = 0;
  std::map<std::string, size_t, std::less<>> by_caller_;
};

/// The environment a spawned runner gets, from `env` (the node's own, as `environ`): only
/// what a runner and the tools it starts read (PATH, HOME, USER, LOGNAME, SHELL, LANG,
/// LANGUAGE, LC_*, TZ, TMPDIR, COMPASS_*, CONTAINERS_*; not XDG_RUNTIME_DIR: the
/// node user's session bus and keyring), and of those none
/// named in `secret_vars` (the variables behind env:// secrets and API keys). Everything else
/// of the node's environment, its secrets above all, stays out: the host tier hands the
/// runner's environment to the agent.
std::vector<std::string> runnerEnvironment(char* const* env,
                                           const std::set<std::string, std::less<>>& secret_vars);

class SpawnedRunners {
 public:
  /// `env`: each runner's whole environment, NAME=value entries (runnerEnvironment()).
  explicit SpawnedRunners(std::vector<std::string> env = {}) : env_(std::move(env)) {}
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
  std::vector<std::string> env_;
  mutable std::mutex mu_;
  std::list<std::shared_ptr<Child>> children_;
};

}  // namespace samnode
