#include "sam-node/spawn_child.h"

#include "common/log.h"
#include "common/unique_fd.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <thread>

extern char** environ;

namespace samnode {

namespace log = common::log;

namespace {

/// Longest stderr line kept whole (bytes); a longer one is cut (it is only ever logged).
constexpr size_t kMaxLineBytes = 16 * 1024;
/// Without a pidfd (kernel < 5.3) the watcher polls waitid at this period.
constexpr int kReapPollMs = 200;

constexpr std::string_view kRunningPrefix = "compass-runner: agent ";

}  // namespace

std::optional<std::string> parseRunningLine(std::string_view line) {
  if (!line.starts_with(kRunningPrefix)) return std::nullopt;
  line.remove_prefix(kRunningPrefix.size());
  size_t end = line.find(' ');
  if (end == 0 || end == std::string_view::npos) return std::nullopt;
  std::string_view id = line.substr(0, end);
  std::string_view rest = line.substr(end + 1);
  if (rest != "running" && !rest.starts_with("running ")) return std::nullopt;
  for (char c : id) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) return std::nullopt;
  }
  return std::string(id);
}

struct SpawnedRunners::Child {
  pid_t pid = -1;
  common::UniqueFd pidfd, out, err;
  std::string label, caller;
  std::thread watcher;

  std::mutex mu;
  std::condition_variable cv;
  bool reported = false;  ///< the spawn request has its outcome
  SpawnOutcome outcome;
  bool exited = false;  ///< waitid saw the exit; the pid is no longer signalled
  std::string last_line;
  std::string partial;  ///< stderr bytes after the last newline

  void report(SpawnOutcome o) {
    std::lock_guard lock(mu);
    if (reported) return;
    outcome = std::move(o);
    reported = true;
    cv.notify_all();
  }

  void signal(int sig) {
    std::lock_guard lock(mu);
    if (!exited) ::kill(pid, sig);
  }

  void onStderr(std::string_view data) {
    partial.append(data);
    size_t start = 0;
    for (size_t nl; (nl = partial.find('\n', start)) != std::string::npos; start = nl + 1) {
      std::string line = partial.substr(start, nl - start);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      onLine(line);
    }
    partial.erase(0, start);
    if (partial.size() > kMaxLineBytes) {
      onLine(partial.substr(0, kMaxLineBytes));
      partial.clear();
    }
  }

  void onLine(const std::string& line) {
    if (line.empty()) return;
    last_line = line;
    log::debug("runner stderr", {{"template", label}, {"pid", pid}, {"line", line}});
    if (auto id = parseRunningLine(line)) {
      SpawnOutcome o;
      o.kind = SpawnOutcome::kRunning;
      o.id = *id;
      o.pid = pid;
      report(std::move(o));
    }
  }

  /// Reads what `fd` has now; false on EOF or error (the fd is then released).
  bool drain(common::UniqueFd& fd, bool is_stderr) {
    char buf[4096];
    for (;;) {
      ssize_t n = ::read(fd.get(), buf, sizeof buf);
      if (n > 0) {
        if (is_stderr) onStderr(std::string_view(buf, static_cast<size_t>(n)));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      fd.reset();
      return false;
    }
  }

  /// The watcher thread: output until exit, then the reap.
  void watch() {
    for (;;) {
      pollfd fds[3] = {{err.get(), POLLIN, 0}, {out.get(), POLLIN, 0}, {pidfd.get(), POLLIN, 0}};
      int timeout = pidfd.valid() ? -1 : kReapPollMs;
      int n = ::poll(fds, 3, timeout);
      if (n < 0 && errno != EINTR) {
        log::error("poll on a runner's output failed",
                   {{"pid", pid}, {"error", std::strerror(errno)}});
        break;
      }
      if (err.valid() && (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) != 0) drain(err, true);
      if (out.valid() && (fds[1].revents & (POLLIN | POLLHUP | POLLERR)) != 0) drain(out, false);
      // WNOWAIT: the pid stays a zombie (not reusable) until `exited` is set, so signal()
      // never reaches a stranger.
      siginfo_t info{};
      if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
          info.si_pid == pid) {
        break;
      }
      if (!pidfd.valid() && !err.valid() && !out.valid()) {
        // Nothing left to poll: block on the exit itself.
        ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT);
        break;
      }
    }
    // The pipes may be held open by the runner's own children; take what is there and stop.
    if (err.valid()) drain(err, true);
    if (!partial.empty()) onLine(partial);
    int status = 0;
    {
      std::lock_guard lock(mu);
      exited = true;
    }
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    std::string how = WIFEXITED(status)     ? "exit status " + std::to_string(WEXITSTATUS(status))
                      : WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status))
                                            : "unknown status";
    log::info("spawned runner exited", {{"template", label},
                                        {"caller", caller},
                                        {"pid", pid},
                                        {"status", how},
                                        {"last_line", last_line}});
    SpawnOutcome o;
    o.kind = SpawnOutcome::kExited;
    o.detail = last_line.empty() ? how : last_line + " (" + how + ")";
    report(std::move(o));
    std::lock_guard lock(mu);
    cv.notify_all();
  }
};

std::vector<std::string> runnerEnvironment(char* const* env,
                                           const std::set<std::string, std::less<>>& secret_vars) {
  static constexpr std::string_view kNames[] = {"PATH", "HOME",     "USER", "LOGNAME", "SHELL",
                                                "LANG", "LANGUAGE", "TZ",   "TMPDIR"};
  static constexpr std::string_view kPrefixes[] = {"LC_", "COMPASS_", "CONTAINERS_"};
  std::vector<std::string> out;
  for (char* const* e = env; e != nullptr && *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const size_t eq = entry.find('=');
    if (eq == std::string_view::npos || eq == 0) continue;
    const std::string_view name = entry.substr(0, eq);
    bool kept = false;
    for (auto n : kNames) kept = kept || name == n;
    for (auto p : kPrefixes) kept = kept || name.starts_with(p);
    if (kept && !secret_vars.contains(name)) out.emplace_back(entry);
  }
  return out;
}

SpawnOutcome SpawnedRunners::start(const std::vector<std::string>& argv, std::string_view label,
                                   std::string_view caller, std::chrono::milliseconds deadline) {
  SpawnOutcome fail;
  fail.kind = SpawnOutcome::kCannotStart;
  if (argv.empty()) {
    fail.detail = "empty command";
    return fail;
  }
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    fail.detail = std::string("pipe2: ") + std::strerror(errno);
    return fail;
  }
  common::UniqueFd out_r(out_pipe[0]), out_w(out_pipe[1]);
  if (::pipe2(err_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    fail.detail = std::string("pipe2: ") + std::strerror(errno);
    return fail;
  }
  common::UniqueFd err_r(err_pipe[0]), err_w(err_pipe[1]);
  // The child's ends must block: the runner does not expect non-blocking stdio.
  ::fcntl(out_w.get(), F_SETFL, 0);
  ::fcntl(err_w.get(), F_SETFL, 0);

  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&actions);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out_w.get(), 1);
  posix_spawn_file_actions_adddup2(&actions, err_w.get(), 2);
  // Nothing of the node (API socket, client connections) leaks into the runner.
  posix_spawn_file_actions_addclosefrom_np(&actions, 3);
  sigset_t empty, defaults;
  sigemptyset(&empty);
  sigemptyset(&defaults);
  for (int sig : {SIGPIPE, SIGTERM, SIGINT, SIGHUP, SIGCHLD}) sigaddset(&defaults, sig);
  posix_spawnattr_setsigmask(&attr, &empty);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  // Its own session: a terminal's ^C reaches the node, which stops runners itself.
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSID);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& e : env_) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  // posix_spawnp searches the node's PATH for argv[0]; the child gets only envp.
  pid_t pid = -1;
  int rc = posix_spawnp(&pid, argv[0].c_str(), &actions, &attr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    fail.detail = argv[0] + ": " + std::strerror(rc);
    return fail;
  }
  out_w.reset();
  err_w.reset();

  auto child = std::make_shared<Child>();
  child->pid = pid;
  // glibc 2.36's <sys/pidfd.h> lacks extern "C", so the system call is made directly. -1 on
  // kernels before 5.3: the watcher then polls instead.
  child->pidfd.reset(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  child->out = std::move(out_r);
  child->err = std::move(err_r);
  child->label = label;
  child->caller = caller;
  log::info("runner started", {{"template", label}, {"caller", caller}, {"pid", pid}});
  // Started before the child is listed, so whoever finds it in children_ can join it.
  child->watcher = std::thread([child] { child->watch(); });
  std::list<std::shared_ptr<Child>> reaped;
  {
    std::lock_guard lock(mu_);
    // Runners already reaped are forgotten here (their watchers are finishing or done).
    for (auto it = children_.begin(); it != children_.end();) {
      std::lock_guard child_lock((*it)->mu);
      auto next = std::next(it);
      if ((*it)->exited) reaped.splice(reaped.end(), children_, it);
      it = next;
    }
    children_.push_back(child);
  }
  for (auto& old : reaped) old->watcher.join();

  std::unique_lock lock(child->mu);
  if (!child->cv.wait_for(lock, deadline, [&] { return child->reported; })) {
    child->reported = true;  // a later running line no longer answers anyone
    lock.unlock();
    log::warn("runner did not report its agent running in time; stopping it",
              {{"template", label}, {"caller", caller}, {"pid", pid}});
    child->signal(SIGTERM);
    SpawnOutcome timeout;
    timeout.kind = SpawnOutcome::kTimeout;
    timeout.pid = pid;
    return timeout;
  }
  return child->outcome;
}

size_t SpawnedRunners::running() const {
  std::lock_guard lock(mu_);
  size_t n = 0;
  for (const auto& child : children_) {
    std::lock_guard child_lock(child->mu);
    if (!child->exited) ++n;
  }
  return n;
}

SpawnedRunners::~SpawnedRunners() {
  std::list<std::shared_ptr<Child>> children;
  {
    std::lock_guard lock(mu_);
    children.swap(children_);
  }
  for (auto& child : children) child->signal(SIGTERM);
  auto deadline = std::chrono::steady_clock::now() + kStopGrace;
  for (auto& child : children) {
    std::unique_lock lock(child->mu);
    if (!child->cv.wait_until(lock, deadline, [&] { return child->exited; })) {
      lock.unlock();
      log::warn("runner ignored SIGTERM; killing it", {{"pid", child->pid}});
      child->signal(SIGKILL);
    }
  }
  for (auto& child : children) {
    if (child->watcher.joinable()) child->watcher.join();
  }
}

PendingSpawns::Slot::~Slot() {
  if (owner_ != nullptr) owner_->release(caller_);
}

std::optional<PendingSpawns::Slot> PendingSpawns::tryAcquire(std::string_view caller,
                                                             std::string* why) {
  std::lock_guard lock(mu_);
  auto it = by_caller_.find(caller);
  const size_t mine = it == by_caller_.end() ? 0 : it->second;
  if (mine >= max_per_agent_) {
    if (why != nullptr)
      *why = "agent " + std::string(caller) + " already has " + std::to_string(mine) +
             " spawns in progress (the most one agent may have)";
    return std::nullopt;
  }
  if (total_ >= max_total_) {
    if (why != nullptr)
      *why = "the node already has " + std::to_string(total_) +
             " spawns in progress (the most it runs at once)";
    return std::nullopt;
  }
  ++total_;
  if (it == by_caller_.end()) {
    by_caller_.emplace(std::string(caller), 1);
  } else {
    ++it->second;
  }
  return Slot(this, std::string(caller));
}

void PendingSpawns::release(const std::string& caller) {
  std::lock_guard lock(mu_);
  --total_;
  auto it = by_caller_.find(caller);
  if (it != by_caller_.end() && --it->second == 0) by_caller_.erase(it);
}

size_t PendingSpawns::pending() const {
  std::lock_guard lock(mu_);
  return total_;
}

}  // namespace samnode
