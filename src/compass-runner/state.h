#pragma once
// Per-agent state directories and the roster (seed 002: "Each agent gets a private 0700
// state dir"; issue 4 "Roster"). Each live agent has <root>/<id>/agent.json; the roster is
// the set of those files whose runner is still alive. Roots: host tier
// `${TMPDIR:-/tmp}/compass-host` (seed 002), podman/microvm
// `${COMPASS_STATE_DIR:-/run/compass-runner}`.

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace runner {

/// What the roster knows of one agent (agent.json in its state dir).
struct AgentRecord {
  std::string id;                 ///< sandbox id
  std::string tier;               ///< "host" | "podman" | "microvm"
  std::string posture;            ///< "boundary" | "firewall" | "unenforced"
  std::string agent_id;           ///< the bundle's agent.id, empty without a bundle
  pid_t runner_pid = -1;          ///< the compass-runner that owns it (stop = SIGTERM to it)
  uint64_t runner_starttime = 0;  ///< /proc/<runner_pid>/stat field 22, against pid reuse
  pid_t pid = -1;                 ///< the agent's (or VM's) host pid
  int64_t started_unix_ms = 0;
  std::string state_dir;
  std::string metrics_addr;  ///< sam-box metrics "127.0.0.1:PORT"; empty = none
  std::string container;     ///< podman container name; empty = none
  std::string netns;         ///< netns name under /run/netns; empty = none
  std::string veth;          ///< host-side veth name; empty = none
  int sam_box_pid = -1;      ///< the agent's sam-box; -1 = none
  /// Seed 002's in-guest-armed marker: the backend armed egress inside the guest itself (the
  /// microvm tier's `firewall`), so no host-side arming step ran. False for every other tier.
  bool egress_armed_in_guest = false;
  std::vector<std::string> command;
};

/// The state root for a tier (see file comment). Never empty. Throws RunnerError naming TMPDIR
/// or COMPASS_STATE_DIR if the root is not absolute or holds a control byte.
std::string stateRoot(const std::string& tier);

/// The longest socket path a tier binds below a state dir, relative to it ("<id>/sam/agent.sock",
/// podman_backend.h): with the root it must fit sockaddr_un (107 bytes, unix(7)).
inline constexpr size_t kLongestStateSocket = 26;
/// The longest state root of a tier that binds sockets: 107 - 1 - kLongestStateSocket = 80.
inline constexpr size_t kMaxStateRootBytes = 107 - 1 - kLongestStateSocket;

/// Refuses (throws RunnerError naming TMPDIR or COMPASS_STATE_DIR) a state root the runner
/// cannot use whatever the disk holds: not absolute or holding a control byte; and where the
/// tier binds sockets in its state dirs and mounts them into the sandbox (`binds_sockets`:
/// podman, microvm), holding ':' or bytes that are not UTF-8, or so long that root + "/" +
/// kLongestStateSocket passes 107 bytes. Checked before anything is made, so the refusal is
/// a usage error (exit 2), not a failed start.
void checkStateRoot(const std::string& root, bool binds_sockets);

/// A new random sandbox id "a" + 10 lower-case hex digits (short enough for interface
/// names: netns `compass-<id>`, veth `cv<id>`).
std::string newAgentId();

/// Creates <root>/<id> with mode 0700 (and <root> with 0700 if missing). Refuses (throws
/// RunnerError) if <root> is a symlink, is not owned by the caller, or is group/world
/// writable, or if <root>/<id> exists. Returns the path.
std::string createStateDir(const std::string& root, const std::string& id);

/// Removes the state root `root` if it is empty (rmdir(2); any failure, ENOTEMPTY first, is
/// ignored). The host tier's root, $TMPDIR/compass-host, goes with its user's last agent: left
/// behind in a shared /tmp, it would make every other user's host-tier start fail.
void removeStateRootIfEmpty(const std::string& root) noexcept;

/// Writes `rec` to <rec.state_dir>/agent.json atomically (temp file + rename), mode 0600.
void writeRecord(const AgentRecord& rec);

/// Every agent.json under every state root the caller can read, live or not. A record whose
/// id is not its directory's name, or one under the host root that does not say tier "host",
/// is skipped; state_dir is set to where the record was found, whatever the file says. The
/// state dirs whose agent.json is there but skipped (unreadable, over 1 MiB, not a record, or
/// one of those lies) are added to `*unreadable` when it is given.
std::vector<AgentRecord> readRecords(std::vector<std::string>* unreadable = nullptr);

/// True if the record's runner is still running (kill(pid, 0) and the same start time).
bool runnerAlive(const AgentRecord& rec);

/// True for a C0 control byte or DEL (0x00–0x1f, 0x7f): what a line of a record file or of
/// the roster must not hold.
constexpr bool isControlByte(char c) {
  return static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) == 0x7f;
}

/// True if `id` has the shape newAgentId() makes ("a" + 10 lower-case hex digits).
bool isAgentId(std::string_view id);

/// Field 22 of /proc/<pid>/stat (start time in clock ticks since boot); 0 if there is no
/// such process or it is a zombie.
uint64_t processStartTime(pid_t pid);

/// agent.json's text for `rec` (a JSON object; keys as the member names).
std::string recordText(const AgentRecord& rec);

/// Parses agent.json's text. Throws RunnerError naming the missing or mistyped key.
AgentRecord parseRecord(std::string_view text);

/// Reads <dir>/agent.json; nullopt if it is missing or does not parse.
std::optional<AgentRecord> readRecord(const std::string& dir);

/// True if <dir>/agent.json exists, readable or not. gc asks this, not readRecord(), before it
/// takes an agent for an orphan: an agent whose record cannot be read may still be running.
bool hasRecordFile(const std::string& dir);

/// The command as agent.json keeps it: whole arguments while they fit in 8 KiB (each counted
/// with 8 bytes more, for its JSON), then the part of the next one that fits and "[N more
/// arguments, M more bytes not recorded]" (N counts the cut argument only if none of it is
/// kept).
std::vector<std::string> recordedCommand(const std::vector<std::string>& command);

/// Removes a state dir and everything in it. Never follows symlinks out of it.
void removeStateDir(const std::string& dir);

/// Makes `dir` (mode 0700) if it is missing, then checks that it is a directory of the
/// caller's that no one else may write (not a symlink). Throws RunnerError starting with
/// `what` otherwise.
void ensurePrivateDir(const std::string& dir, const std::string& what);

/// Writes `text` to `path` through `path`.tmp.<pid> and rename(2), so that readers see the old
/// file or the new one, never a part. The temporary is removed if a step fails; throws
/// RunnerError starting with `what`, naming the step and errno.
void writeFileAtomically(const std::string& path, std::string_view text, mode_t mode,
                         const std::string& what);

}  // namespace runner
