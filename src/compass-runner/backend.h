#pragma once
// The backend seam (seed 002, "The tiers"): every tier implements Backend, and selectBackend()
// is the one function that picks it (the seed's SelectBackend). Nothing above this header
// knows which tier runs an agent.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "compass-runner/state.h"

namespace runner {

/// A start-up or configuration refusal. what() names the flag, field or step and the reason;
/// the CLI prints it and exits non-zero. Nothing is left running when it is thrown from
/// Backend::start().
class RunnerError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// `step`: `what`, the message of a failure in a tier's start step `step` (e.g. "netns"), said
/// once: a `what` that already begins with "<step>: " is returned as it is, so the operator
/// reads "netns: create …", not "netns: netns: create …".
inline std::string stepMessage(std::string_view step, std::string_view what) {
  const std::string prefix = std::string(step) + ": ";
  if (what.substr(0, prefix.size()) == prefix) return std::string(what);
  return prefix + std::string(what);
}

/// A refusal of the request itself (like validate()'s) that a tier can only see once it is
/// starting: e.g. podman's `run --pull never` finding no such image, which the podman tier
/// asks podman run itself rather than spending a second podman process on every start. The
/// CLI reports it as "refusing to start: …" with kExitUsage, and, as for every throw from
/// start(), nothing is left running.
class SpecRefused : public RunnerError {
 public:
  using RunnerError::RunnerError;
};

/// Says `text` on stderr as "compass-runner: <text>": something the operator should know that
/// does not stop what is being done (an undo that failed, a leftover gc could not remove).
inline void note(const std::string& text) {
  (void)std::fprintf(stderr, "compass-runner: %s\n", text.c_str());
}

/// Runs the undos a failed start registered, newest first, then forgets them. An undo that
/// throws is said (note()) and the rest still run.
inline void undoNewestFirst(std::vector<std::function<void()>>& undos) noexcept {
  for (size_t i = undos.size(); i-- > 0;) {
    try {
      undos[i]();
    } catch (const std::exception& e) {
      note(std::string("undo after a failed start: ") + e.what());
    }
  }
  undos.clear();
}

/// start() saw, before the agent was executed, that the runner had been asked to stop
/// (AgentSpec::stop_signal): what it made is undone and the agent never ran. `signal()` is the
/// signal number (the runner exits 128 + it, as for a stop before start()).
class StoppedBeforeStart : public RunnerError {
 public:
  explicit StoppedBeforeStart(int sig)
      : RunnerError("stopped by signal " + std::to_string(sig) + " before the agent started"),
        sig_(sig) {}
  [[nodiscard]] int signal() const { return sig_; }

 private:
  int sig_;
};

/// Runs `f`, the step `name` of a tier's start, and returns what it returns. A SpecRefused or
/// StoppedBeforeStart passes as it is (a refusal worded for the operator already, or a stop);
/// any other failure becomes RunnerError(stepMessage(name, what)).
template <typename F>
auto step(const char* name, F&& f) {
  try {
    return f();
  } catch (const SpecRefused&) {
    throw;
  } catch (const StoppedBeforeStart&) {
    throw;
  } catch (const std::exception& e) {
    throw RunnerError(stepMessage(name, e.what()));
  }
}

/// Runs each of a preflight's `checks` (look-ups that throw RunnerError naming what is missing)
/// and throws one error naming every failure, joined by "; ", so the operator installs
/// everything missing at once rather than one thing per attempt: a SpecRefused if any check
/// threw one (the request is refused), else a RunnerError. A StoppedBeforeStart passes at once.
inline void checkAll(const std::vector<std::function<void()>>& checks) {
  std::string failures;
  bool refused = false;
  for (const auto& check : checks) {
    try {
      check();
    } catch (const StoppedBeforeStart&) {
      throw;
    } catch (const std::exception& e) {
      refused = refused || dynamic_cast<const SpecRefused*>(&e) != nullptr;
      failures += (failures.empty() ? "" : "; ") + std::string(e.what());
    }
  }
  if (refused) throw SpecRefused(failures);
  if (!failures.empty()) throw RunnerError(failures);
}

/// How egress is held (seed 002 "Egress"; DESIGN.md "Two egress mechanisms").
enum class Posture { kBoundary, kFirewall, kUnenforced };
/// "boundary", "firewall", "unenforced" (the roster's words).
std::string_view postureName(Posture p);

/// Resource limits. Absent = the tier's default (no limit set by us).
struct Resources {
  std::optional<uint64_t> memory_bytes;  ///< --memory, bytes
  std::optional<double> cpus;            ///< --cpus, CPUs (may be fractional)
  std::optional<uint64_t> pids;          ///< --pids, max tasks
};

/// The platform credential that the agent's sam-box verifies its bundle against (seed 003,
/// "Identity"; docs/sam-box.md): `--credential-issuer`, `--credential-audience`,
/// `--credential-path`, `--credential-ca` of `compass-runner run`, passed on as sam-box's flags
/// of the same names. Without an issuer, a bundle's identity is taken as written
/// (--insecure-unverified-bundle, and the launch says so).
struct Credential {
  std::string issuer;    ///< https:// URL of the OIDC issuer; empty = no credential
  std::string audience;  ///< the token's required `aud`; set whenever `issuer` is
  std::string path;      ///< absolute path of the token file; empty = sam-box's default
  std::string ca;        ///< absolute path of a PEM CA file; empty = the system's CAs
};

/// One agent to run, as the operator asked for it (already syntax-checked by the CLI).
struct AgentSpec {
  std::string id;  ///< sandbox id (state.h newAgentId()); unique on this host
  /// The agent's private 0700 state dir, created by the runner (state.h createStateDir())
  /// under stateRoot(tier) before start(); the backend puts its sockets, logs, $HOME there.
  std::string state_dir;
  std::string bundle_path;  ///< --bundle FILE, empty if none
  std::string agent_id;     ///< the bundle's agent.id; empty without a bundle
  std::string external_id;  ///< the bundle's agent.external_id; empty if none or no bundle
  Credential credential;    ///< verifies the bundle; needs one, and egress boundary
  /// The effective allowlist, each entry normalized (policy::AllowRule::text()): the
  /// --egress-allow entries in the order given, then the bundle's egress.allow, duplicates
  /// dropped. sam-box gets both the bundle and these (it ignores duplicates); the firewall
  /// needs them all here. An explicitly empty `--egress-allow ""` adds no entry.
  std::vector<std::string> egress_allow;
  /// True when the operator configured an egress policy at all: --egress-allow given (even
  /// an explicitly empty value), --egress given, or a bundle with an `egress` section. The
  /// host tier refuses any of these (seed 002, "host": refuse rather than ignore).
  bool egress_configured = false;
  std::optional<Posture> egress;  ///< --egress boundary|firewall; absent = tier default
  std::string image;              ///< --image IMG; empty = default image (podman/microvm)
  std::string rootfs;             ///< --rootfs DIR; empty = use image
  Resources resources;
  std::string workdir;               ///< --workdir DIR; empty = tier default
  std::vector<std::string> command;  ///< CMD ARGS… after `--`; never empty
  std::string sidecar_socket;        ///< sam-node's API socket for mesh.sam.alt; empty = none
  std::string accel;  ///< --accel kvm|tcg (microvm tier only); empty = kvm, never tcg silently
  /// The first stop signal (SIGINT, SIGTERM, SIGHUP) the runner has received so far, 0 if none;
  /// may be empty. A backend that holds the agent at an exec gate asks it just before opening
  /// the gate, and throws StoppedBeforeStart instead of starting an agent only to stop it.
  std::function<int()> stop_signal;
};

/// What a started agent looks like to the roster (written to its state dir's agent.json).
struct Started {
  int pid = -1;              ///< host pid of the agent's first process (or the VM)
  std::string state_dir;     ///< the agent's private 0700 directory
  std::string metrics_addr;  ///< sam-box's "127.0.0.1:PORT"; empty when no sam-box
};

/// One tier. A Backend object runs at most one agent. Thread-compatible, not thread-safe:
/// the runner calls it from one thread, except stop(), which may come from a signal watcher.
class Backend {
 public:
  virtual ~Backend() = default;
  /// The tier's name as --backend spells it ("host", "podman", "microvm").
  [[nodiscard]] virtual std::string_view name() const = 0;
  /// The egress posture this backend gives `spec` (before or after start).
  [[nodiscard]] virtual Posture posture(const AgentSpec& spec) const = 0;
  /// Refuses (throws RunnerError with the reason and what to do instead) a spec this tier
  /// cannot honour, before anything is created: no state dir, no process. `spec.id` and
  /// `spec.state_dir` are still empty here. start() checks the same again.
  virtual void validate(const AgentSpec& spec) const { (void)spec; }
  /// Arms everything, in order, then execs the agent. Throws RunnerError naming the failed
  /// step; on throw, everything already set up is torn down (fail closed).
  virtual Started start(const AgentSpec& spec) = 0;
  /// Puts `rec`'s tier-specific fields (container, netns, veth) in place; called after
  /// start() so the record written to agent.json lets gc reap a dead runner's leftovers.
  virtual void describe(AgentRecord& rec) const = 0;
  /// Blocks until the agent exits; returns its status as a shell reports it (0..255; 128+N
  /// when a signal N ended it). Tears the sandbox down before returning.
  virtual int wait() = 0;
  /// Asks the agent to end (SIGTERM, then SIGKILL after `grace`); wait() then returns.
  virtual void stop(std::chrono::milliseconds grace) = 0;
  /// Changes the limits of the running agent described by `rec` (any process may call it:
  /// `compass-runner resize ID`). Throws RunnerError where the tier has no means to (host: no
  /// cgroup) — never pretends.
  virtual void resize(const AgentRecord& rec, const Resources& resources) = 0;
  /// Removes whatever a dead runner left of `rec` (container, netns, veth, nft state, sam-box,
  /// state dir) for `compass-runner gc`. Idempotent; missing pieces are not errors.
  virtual void reap(const AgentRecord& rec) = 0;
  /// For gc: removes what this tier left for sandboxes whose id is not in `live_ids` and
  /// that have no agent.json at all (a runner killed before it wrote one). Names are
  /// derived from the id (container/netns `compass-<id>`, veth `cv<id>`), so they are found.
  virtual void reapOrphans(const std::vector<std::string>& live_ids) { (void)live_ids; }
};

/// The seed's SelectBackend: `flag` (--backend; nullopt when not given) wins over `env`
/// (COMPASS_RUNTIME_BACKEND; nullptr when unset). ""/"podman" → podman (default), "microvm",
/// "host"; "apple-container" is valid but throws RunnerError saying it needs macOS; any other
/// name throws RunnerError listing the valid ones.
std::unique_ptr<Backend> selectBackend(const std::optional<std::string>& flag, const char* env);

/// Factories, one per tier (host_backend.cc, podman_backend.cc, microvm_backend.cc).
std::unique_ptr<Backend> makeHostBackend();
std::unique_ptr<Backend> makePodmanBackend();
std::unique_ptr<Backend> makeMicrovmBackend();

/// The names selectBackend() accepts, in the order the error message lists them.
const std::vector<std::string>& validBackendNames();

}  // namespace runner
