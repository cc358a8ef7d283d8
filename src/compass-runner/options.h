#pragma once
// compass-runner's command line (issue 4, "The seam" and "Roster"):
//   compass-runner run [--backend NAME] [--bundle FILE] [--egress-allow HOST …]
//                      [--egress boundary|firewall] [--image IMG | --rootfs DIR]
//                      [--memory BYTES] [--cpus N] [--pids N] [--workdir DIR]
//                      [--sidecar-socket PATH] [--accel kvm|tcg]
//                      [--credential-issuer URL --credential-audience AUD
//                       [--credential-path FILE] [--credential-ca FILE]] -- CMD [ARGS…]
//   compass-runner agents [--json]
//   compass-runner stop ID
//   compass-runner resize ID [--memory BYTES] [--cpus N] [--pids N]
//   compass-runner gc
//   compass-runner image build [--force] [--name IMG]
// Parsing is pure apart from reading the bundle file, so tests check every refusal. Every
// refusal names the flag (or bundle field) and the reason.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "compass-runner/backend.h"
#include "compass-runner/image.h"

namespace runner {

/// Largest --memory accepted: 1 TiB (more is a typo, not a limit).
inline constexpr uint64_t kMaxMemoryBytes = uint64_t{1} << 40;
/// The least --memory accepted: runc refuses a smaller limit (6 MiB).
inline constexpr uint64_t kMinMemoryBytes = uint64_t{6} << 20;
/// The least --pids accepted: the sandbox's PID 1 (nano-init) and the agent it starts.
inline constexpr uint64_t kMinPids = 2;
/// Largest --pids accepted.
inline constexpr uint64_t kMaxPids = 4194304;  // the kernel's PID_MAX_LIMIT on 64-bit

/// `run`: the spec (id and state_dir still empty) and the backend as the flag gave it.
struct RunOptions {
  std::optional<std::string> backend;  ///< --backend; nullopt when not given
  AgentSpec spec;
};

struct AgentsOptions {
  bool json = false;
};

struct StopOptions {
  std::string id;
};

struct ResizeOptions {
  std::string id;
  Resources resources;  ///< at least one member set
};

struct GcOptions {};

struct ImageBuildOptions {
  image::BuildOptions build;
};

/// Exit at once with `exit_code` after printing `message` (stdout if 0, else stderr):
/// --help, --version and every refusal.
struct Exit {
  int exit_code = 0;
  std::string message;
};

using Command = std::variant<RunOptions, AgentsOptions, StopOptions, ResizeOptions, GcOptions,
                             ImageBuildOptions, Exit>;

/// Exit code of a refused command line or configuration.
inline constexpr int kExitUsage = 2;

/// Parses the command line. Never throws for bad input: returns Exit{kExitUsage, reason}.
/// Loads and checks --bundle (policy::loadBundle, strict) and every --egress-allow entry
/// (policy::parseAllowRule) here, so a bad policy is refused before anything starts.
Command parseCommandLine(int argc, const char* const* argv);

/// Parses a byte count: decimal digits with an optional binary suffix k, m or g (either
/// case; KiB, MiB, GiB). Refuses (throws RunnerError naming `flag`) anything else, zero, and
/// values over kMaxMemoryBytes.
uint64_t parseBytes(std::string_view flag, std::string_view text);

/// Parses a CPU count: a positive decimal (fractions allowed, e.g. "0.5") from 0.01 up to
/// the number of CPUs online. Throws RunnerError naming `flag`.
double parseCpus(std::string_view flag, std::string_view text);

/// Parses a task limit: decimal kMinPids..kMaxPids. Throws RunnerError naming `flag`.
uint64_t parsePids(std::string_view flag, std::string_view text);

}  // namespace runner
