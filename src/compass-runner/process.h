#pragma once
// The only place the runner starts a subprocess (seed 002, podman: "the only place a
// subprocess is spawned"). podman, nft, ip, sam-box and the host-tier agent all start here,
// so a reviewer audits one file for what the runner executes and with which environment.

#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/unique_fd.h"

namespace runner {

/// How to start a child. argv[0] is looked up on PATH when it has no slash.
struct SpawnOptions {
  std::vector<std::string> argv;
  /// Environment of the child; nullopt = inherit the runner's.
  std::optional<std::map<std::string, std::string>> env;
  /// "NAME=value" entries set in the child's environment on top of `env` (or the inherited
  /// one), replacing a variable of the same name: e.g. CONTAINERS_CONF for podman, without
  /// an extra exec of /usr/bin/env on the agent's path to start.
  std::vector<std::string> set_env;
  std::string cwd;  ///< empty = the runner's
  /// Descriptors given to the child as 3, 4, … in this order (e.g. tun0 for podman
  /// --preserve-fds); every other descriptor above 2 is closed in the child.
  std::vector<int> pass_fds;
  std::string netns_path;                ///< setns(CLONE_NEWNET) to this file first; empty = none
  std::string stdin_path = "/dev/null";  ///< empty = inherit
  std::string stdout_path;               ///< empty = inherit; else opened O_APPEND|O_CREAT 0600
  std::string stderr_path;               ///< empty = inherit; else opened O_APPEND|O_CREAT 0600
  bool new_session = false;              ///< setsid() in the child (detach from the terminal)
  /// PR_SET_PDEATHSIG SIGKILL. The kernel fires it when the *thread* that called spawn()
  /// exits (prctl(2)), so spawn from a thread that outlives the child (the main thread).
  bool die_with_parent = true;
  /// Descriptors to give the child as its stdin/stdout/stderr instead of the paths above
  /// (-1 = use the path). The caller keeps ownership (e.g. pipe ends to relay or capture).
  int stdin_fd = -1;
  int stdout_fd = -1;
  int stderr_fd = -1;
};

/// Starts a child and returns its pid. Throws RunnerError naming argv[0] and errno (exec
/// failure is reported from the child through a CLOEXEC pipe, so a missing program is an
/// error here, not a silent exit 127). The child starts with every signal at its default
/// disposition and none blocked, whatever the runner ignores or blocks (fork(2), execve(2)).
/// Order in the child: signals, PDEATHSIG, setsid, setns, descriptors, chdir, execve.
pid_t spawn(const SpawnOptions& opts);

/// write(2) that reports a closed reader as EPIPE without raising SIGPIPE, whatever the
/// process's SIGPIPE disposition (SIGPIPE is blocked in the calling thread for the call and the
/// one it raised is consumed). Returns what write(2) returns, errno as it set it.
ssize_t writeNoSigpipe(int fd, const char* data, size_t size);

/// A pidfd for `pid` (pidfd_open(2)): poll(2) reports it readable once the process has
/// exited, before it is reaped, so a waiter can time out without racing the reaper. Throws
/// RunnerError if the kernel refuses.
common::UniqueFd pidFd(pid_t pid);

/// The result of a command run to completion.
struct CommandResult {
  int status = -1;  ///< exit code, 128+N for signal N, -1 if killed for the timeout
  std::string out;  ///< stdout (capped at 1 MiB)
  std::string err;  ///< stderr (capped at 1 MiB)
};

/// The file spawn() would execute for `name`: `name` itself when it holds a '/', else the first
/// executable file of that name in a directory of the runner's PATH. Throws RunnerError("cannot
/// run NAME: not found on PATH (…)").
std::string findProgram(const std::string& name);

/// Runs argv to completion with `input` on its stdin and output captured; kills it (and its
/// process group: it runs in a session of its own) after `timeout`. Returns once argv[0]
/// has exited, with what it wrote; a descendant that keeps the pipes open does not delay it.
/// `netns_path` and `set_env` as in SpawnOptions. Throws RunnerError if it cannot start.
CommandResult runCommand(const std::vector<std::string>& argv, const std::string& input = "",
                         std::chrono::milliseconds timeout = std::chrono::seconds(60),
                         const std::string& netns_path = "",
                         const std::vector<std::string>& set_env = {});

/// runCommand(), throwing RunnerError("<what>: <argv joined>: exit N: <stderr>") unless it
/// exits 0. Returns stdout.
std::string runChecked(const std::string& what, const std::vector<std::string>& argv,
                       const std::string& input = "",
                       std::chrono::milliseconds timeout = std::chrono::seconds(60),
                       const std::string& netns_path = "",
                       const std::vector<std::string>& set_env = {});

/// waitpid() for `pid`, retrying EINTR; returns the shell-style status (128+N for signal N).
int waitExit(pid_t pid);

}  // namespace runner
