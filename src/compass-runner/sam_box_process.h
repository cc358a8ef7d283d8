#pragma once
// One agent's sam-box (DESIGN.md: "starts sam-box (one per agent, host side)"): started by the
// podman tier for egress `boundary`, on a Unix socket in the agent's state dir that is then
// bind-mounted into the container. Flags as in docs/sam-box.md.

#include <sys/types.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "compass-runner/backend.h"

namespace runner {

/// How to run one sam-box.
struct SamBoxOptions {
  std::string binary;                     ///< sam-box path (findSamBox())
  std::string socket;                     ///< --socket: <state>/agent.sock
  std::string log;                        ///< stdout+stderr go here (<state>/sam-box.log)
  std::string metrics_addr;               ///< --metrics-addr "127.0.0.1:PORT"
  std::vector<std::string> egress_allow;  ///< one --egress-allow each
  std::string bundle;                     ///< --bundle; empty = none
  /// --credential-issuer/-audience/-path/-ca (empty members are not passed).
  Credential credential;
  /// --insecure-unverified-bundle: a bundle with no credential.issuer to verify it against, so
  /// its identity is taken as written (the launch banner says so).
  bool insecure_unverified_bundle = false;
  std::string sidecar_socket;  ///< --sidecar-socket; empty = none
};

/// sam-box's log (stdout and stderr) in the agent's state dir.
inline constexpr const char* kSamBoxLog = "sam-box.log";

/// The options of `spec`'s own sam-box in egress `boundary` (podman and microvm tiers): socket
/// `socket`, log <state_dir>/sam-box.log, metrics on a free loopback port, the effective
/// allowlist, the bundle, spec.credential and sam-node's socket. A bundle without a credential
/// issuer is taken as written (--insecure-unverified-bundle), and this says so on stderr, as
/// the launch banner. `binary` is findSamBox()'s answer.
SamBoxOptions boundarySamBoxOptions(const AgentSpec& spec, const std::string& binary,
                                    const std::string& socket);

/// Extra time SamBoxProcess::waitReady() gives a sam-box that verifies a credential: sam-box's
/// verifier bound (30 s, src/sam-box/verifier.h kVerifierTimeout) and a margin.
inline constexpr std::chrono::seconds kCredentialVerifyGrace{35};

/// The argv of `sam-box run` for `opts` (pure).
std::vector<std::string> samBoxArgv(const SamBoxOptions& opts);

/// A program shipped with compass-runner: $`env_var` if set (must exist), else `name` next to
/// /proc/self/exe (an install), else the build tree's ../`name`/`name` beside it. Throws
/// RunnerError naming where it looked. Used for sam-box (COMPASS_SAM_BOX) and nano-init
/// (COMPASS_NANO_INIT).
std::string findCompanion(const char* env_var, const std::string& name);

/// findCompanion("COMPASS_SAM_BOX", "sam-box").
std::string findSamBox();

/// A free TCP port on 127.0.0.1 (bound and released; sam-box then binds it).
int freeLocalPort();

/// A running sam-box, owned: the destructor stops it.
class SamBoxProcess {
 public:
  SamBoxProcess() = default;
  SamBoxProcess(const SamBoxProcess&) = delete;
  SamBoxProcess& operator=(const SamBoxProcess&) = delete;
  ~SamBoxProcess() { stop(); }

  /// spawn(), then waitReady(timeout).
  void start(const SamBoxOptions& opts, std::chrono::milliseconds timeout);
  /// Spawns sam-box (through process.h, from the calling thread, which must outlive it: its
  /// PDEATHSIG follows that thread) and returns at once, so the caller can prepare the rest
  /// of the sandbox while sam-box starts. Throws RunnerError if it cannot be started.
  void spawn(const SamBoxOptions& opts);
  /// Waits up to `timeout` for the socket of the sam-box spawn() started to appear, plus
  /// kCredentialVerifyGrace when it verifies a credential (OIDC discovery and JWKS over HTTPS
  /// come first), so a slow issuer fails with sam-box's own reason, not this wait's. Throws
  /// RunnerError with the last lines of its log if it exits first or the socket does not
  /// appear in time (then it is killed).
  void waitReady(std::chrono::milliseconds timeout);
  /// Throws RunnerError (with the last lines of its log) if the sam-box spawn() started has
  /// exited since, or was never started: checked just before the agent may run.
  void requireRunning();
  /// The pid, -1 when not running.
  [[nodiscard]] pid_t pid() const { return pid_; }
  /// From now until stop(), a thread watches the running sam-box: if it exits on its own,
  /// the runner says so on stderr at once ("warning: the agent's sam-box (pid N) exited ...
  /// every flow of the agent is refused from now on", with the end of its log). The agent
  /// keeps running, its egress closed (nothing fails open). No-op if not running.
  void watch();
  /// SIGTERM, SIGKILL after `grace` (2 s by default), reaped. Idempotent; never throws.
  void stop(std::chrono::milliseconds grace = std::chrono::seconds(2)) noexcept;

 private:
  void endWatch() noexcept;

  // Throws the RunnerError "sam-box <how it ended> <when>; the end of <log>: …" if it has
  // exited (reaping it), else returns.
  void throwIfExited(const char* when);

  pid_t pid_ = -1;
  bool verifies_ = false;  ///< the last spawn() passed a credential issuer
  std::string socket_;     ///< of the last spawn()
  std::string log_;
  std::thread watcher_;  ///< watch()'s thread; joined by stop()
  int watch_stop_ = -1;  ///< eventfd that ends it
};

/// The last `lines` lines of the file at `path` ("" if unreadable), for error messages.
std::string tailOfFile(const std::string& path, int lines = 10);

/// For gc: true if `pid` is a sam-box whose --socket is `socket` (guards against pid reuse).
bool isSamBoxFor(pid_t pid, const std::string& socket);

/// The pids of every running sam-box whose --socket lies under `dir` + "/", with the socket
/// path (for gc of sam-boxes whose runner died before writing a record).
std::vector<std::pair<pid_t, std::string>> samBoxesUnder(const std::string& dir);

/// Ends a sam-box that is not our child (gc): SIGTERM, SIGKILL after `grace`. Never throws.
void killSamBox(pid_t pid, std::chrono::milliseconds grace = std::chrono::seconds(2)) noexcept;

}  // namespace runner
