#pragma once
// Every podman invocation of the runner (seed 002, podman: "a thin WorkloadRuntime over the
// podman CLI"). The argv builders are pure (unit-tested); the calls go through process.h,
// the only place that forks. Each call reads only the runner's containers.conf
// (CONTAINERS_CONF, podman_conf.h), set with `env` in front of podman so the environment
// of the runner itself is never modified.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "compass-runner/backend.h"
#include "compass-runner/process.h"

namespace runner::podman {

/// The label every agent container carries: compass.agent=<id> (gc finds them by it).
inline constexpr const char* kAgentLabel = "compass.agent";
/// The container's sysfs network views, masked (podman `--security-opt mask=`, colon-separated).
inline constexpr const char* kMaskedSysNet = "/sys/class/net:/sys/devices/virtual/net";
/// Where the sandbox sees its boundary and nano-init (read-only bind mounts): egress
/// `boundary` mounts the agent's <state>/sam directory (sam-box's socket) at /run/sam.
inline constexpr const char* kSandboxBoundaryDir = "/run/sam";
inline constexpr const char* kSandboxSocket = "/run/sam/agent.sock";
inline constexpr const char* kSandboxNanoInit = "/run/sam/nano-init";
/// podman's exit status when podman itself failed (bad flag, no such image), not the
/// container's command (podman-run(1), "Exit Status").
inline constexpr int kPodmanError = 125;
/// podman run's exit status when the container's command could not be invoked (podman-run(1)
/// "Exit Status": 126), e.g. a --workdir the image does not hold.
inline constexpr int kPodmanCannotInvoke = 126;
/// The pids limit when --pids is not given (same as our containers.conf's pids_limit).
inline constexpr uint64_t kDefaultPids = 2048;

/// `podman ARGS…` (looked up on PATH).
std::vector<std::string> podmanArgv(const std::vector<std::string>& args);

/// The environment entries every podman call gets on top of the runner's:
/// {"CONTAINERS_CONF=<conf>"}, set in the child by process.h (SpawnOptions::set_env), so no
/// /usr/bin/env process sits between the runner and podman.
std::vector<std::string> podmanEnv(const std::string& conf);

/// A bind mount: host path → container path.
struct Mount {
  std::string host;
  std::string container;
  bool read_only = false;
};

/// Everything `podman run` needs for one agent.
struct RunSpec {
  std::string name;              ///< container name, "compass-<id>"
  std::string agent_id;          ///< for the compass.agent label
  std::string image;             ///< image reference (ignored when rootfs is set)
  std::string rootfs;            ///< --rootfs DIR (mounted as an overlay, so DIR is never written)
  std::string netns_path;        ///< --network ns:<path>
  uint32_t id_base = 0;          ///< --uidmap/--gidmap 0:<id_base>:65536
  std::string user;              ///< --user "uid:gid" inside the container
  int pass_fds = 0;              ///< --preserve-fds N (tun0 = 1)
  std::vector<std::string> dns;  ///< one --dns each, in order
  std::vector<Mount> mounts;
  Resources resources;
  std::string workdir;  ///< -w; empty = the image's
  std::string pidfile;  ///< --pidfile: the container's first process's host pid
  /// The process to run: argv[0] becomes --entrypoint, the rest follow the image, so neither
  /// the image's ENTRYPOINT nor its CMD is ever added to it.
  std::vector<std::string> argv;
};

/// `podman run` arguments (without the podman/env prefix) for `spec`: --name, --label,
/// --network ns:, --preserve-fds, --uidmap/--gidmap, --user, --cap-drop all,
/// --security-opt no-new-privileges, --dns, --no-hosts (the host's /etc/hosts never reaches the
/// sandbox: its names must go through the sandbox's resolver), --no-healthcheck, --image-volume
/// ignore, --stop-signal SIGTERM (the image's HEALTHCHECK, VOLUME and STOPSIGNAL are not
/// obeyed), --pull never (no registry),
/// limits, mounts, -w, --pidfile, --entrypoint. Never -t or -i: the agent sees no terminal.
std::vector<std::string> runArgs(const RunSpec& spec);

/// `podman update` arguments for the memory and cpu limits in `r` (pids are not supported by
/// podman 4.3's update: see setPidsLimit). Empty if neither is set.
std::vector<std::string> updateArgs(const std::string& container, const Resources& r);

/// Bytes and CPUs as podman's flags spell them ("67108864b", "0.5").
std::string memoryFlag(uint64_t bytes);
std::string cpusFlag(double cpus);

/// Runs podman with `args` (through process.h) and returns its result.
CommandResult run(const std::string& conf, const std::vector<std::string>& args,
                  std::chrono::milliseconds timeout = std::chrono::seconds(60));

/// Runs podman; throws RunnerError("<what>: … exit N: <stderr>") unless it exits 0.
std::string runChecked(const std::string& what, const std::string& conf,
                       const std::vector<std::string>& args,
                       std::chrono::milliseconds timeout = std::chrono::seconds(60));

/// True if the container exists (any state).
bool containerExists(const std::string& conf, const std::string& name);

/// `podman rm -f -v -t 0 --ignore` (anonymous volumes too); if that fails, checks whether the
/// container is gone all the same. Returns false (never throws) if it is still there.
bool removeContainer(const std::string& conf, const std::string& name) noexcept;

/// The agent ids of every container labelled compass.agent (any state).
std::vector<std::string> agentContainers(const std::string& conf);

/// Writes `pids` to the pids cgroup of the process `pid` (cgroup v1 `pids.max`, or v2's
/// unified `pids.max`). Throws RunnerError naming the file.
void setPidsLimit(pid_t pid, uint64_t pids);

}  // namespace runner::podman
