#include "nano-init/pid1.h"

#include <dirent.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <asio/read.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>

#include "nano-init/agent_filter.h"
#include "nano-init/errors.h"

namespace nanoinit {

sigset_t handledSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  for (int sig : kForwardedSignals) sigaddset(&set, sig);
  return set;
}

void blockHandledSignals() {
  const sigset_t set = handledSignals();
  if (::sigprocmask(SIG_BLOCK, &set, nullptr) != 0) throwErrno("sigprocmask(SIG_BLOCK)");
}

namespace {

int makeSignalFd(sigset_t* old_mask) {
  const sigset_t set = handledSignals();
  // Blocked, not ignored: for PID 1 the kernel drops signals with default action unless they
  // are blocked (and then pending for the signalfd).
  if (::sigprocmask(SIG_BLOCK, &set, old_mask) != 0) throwErrno("sigprocmask(SIG_BLOCK)");
  const int fd = ::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  if (fd < 0) throwErrno("signalfd");
  return fd;
}

// Every descendant of `root`, from /proc (used when not PID 1, where kill(-1) would reach
// processes outside the sandbox). setsid'd processes are still descendants: their parents
// died and the subreaper adopted them.
std::set<pid_t> descendantsOf(pid_t root) {
  std::map<pid_t, std::vector<pid_t>> children;
  DIR* dir = ::opendir("/proc");
  if (dir == nullptr) return {};
  while (dirent* e = ::readdir(dir)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (*end != '\0' || pid <= 0) continue;
    std::ifstream stat(std::string("/proc/") + e->d_name + "/stat");
    std::string content;
    std::getline(stat, content);
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses; the last ')' ends it.
    const size_t close = content.rfind(')');
    if (close == std::string::npos) continue;
    char state = 0;
    int ppid = 0;
    if (std::sscanf(content.c_str() + close + 1, " %c %d", &state, &ppid) != 2) continue;
    children[ppid].push_back(static_cast<pid_t>(pid));
  }
  ::closedir(dir);
  std::set<pid_t> out;
  std::vector<pid_t> todo{root};
  while (!todo.empty()) {
    const pid_t p = todo.back();
    todo.pop_back();
    for (pid_t c : children[p]) {
      if (out.insert(c).second) todo.push_back(c);
    }
  }
  return out;
}

// Descriptors nano-init wants: two per flow at the netstack's cap (4096 TCP flows; a flow
// over HTTP/2 holds a socketpair), plus UDP flows and its own.
constexpr rlim_t kFlowDescriptors = 16384;

// Raises RLIMIT_NOFILE as far as allowed (best effort: a lower limit only means fewer flows,
// refused once it is reached) and returns the limit as it was.
rlimit raiseNofile() {
  rlimit found{};
  if (::getrlimit(RLIMIT_NOFILE, &found) != 0) return found;
  if (found.rlim_cur >= kFlowDescriptors) return found;
  rlimit want{kFlowDescriptors, std::max(found.rlim_max, kFlowDescriptors)};
  if (found.rlim_max == RLIM_INFINITY) want.rlim_max = RLIM_INFINITY;
  if (::setrlimit(RLIMIT_NOFILE, &want) != 0) {
    want = {std::min(found.rlim_max, kFlowDescriptors), found.rlim_max};  // no CAP_SYS_RESOURCE
    ::setrlimit(RLIMIT_NOFILE, &want);
  }
  return found;
}

}  // namespace

Supervisor::Supervisor(asio::io_context& io, std::chrono::milliseconds grace)
    : io_(io),
      grace_(grace),
      pid1_(::getpid() == 1),
      agent_nofile_(raiseNofile()),
      signals_(io, makeSignalFd(&old_mask_)),
      grace_timer_(io) {
  if (!pid1_ && ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0) {
    throwErrno("prctl(PR_SET_CHILD_SUBREAPER)");
  }
}

Supervisor::~Supervisor() { ::sigprocmask(SIG_SETMASK, &old_mask_, nullptr); }

int Supervisor::exitCodeOf(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return 255;
}

pid_t Supervisor::spawn(const std::vector<std::string>& argv,
                        const std::function<void()>& in_child) {
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throwErrno("fork");
  if (pid == 0) {
    // The child: the agent must not outlive the boundary it depends on.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    // Nothing blocked, and the signals nano-init forwards at their defaults: a launcher that
    // blocked or ignored one (a shell's `&` ignores SIGINT) must not make forwarding a no-op.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int sig : kForwardedSignals) ::signal(sig, SIG_DFL);
    if (agent_nofile_.rlim_cur != 0) ::setrlimit(RLIMIT_NOFILE, &agent_nofile_);
    try {
      in_child();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "nano-init: refusing to start %s: %s\n", args[0], e.what());
      ::_exit(126);
    }
    // Nothing but stdio crosses into the agent: a descriptor its launcher leaked (a socket in
    // the host's netns, say) would be a way around tun0 that no check can see.
    if (::close_range(3, ~0U, 0) != 0) {
      std::fprintf(stderr, "nano-init: refusing to start %s: close_range: %s\n", args[0],
                   std::strerror(errno));
      ::_exit(126);
    }
    // Last before the exec: the filter holds for the agent and everything it starts.
    if (const std::string e = installAgentFilter(); !e.empty()) {
      std::fprintf(stderr, "nano-init: refusing to start %s: seccomp: %s\n", args[0], e.c_str());
      ::_exit(126);
    }
    ::execvp(args[0], args.data());
    std::fprintf(stderr, "nano-init: exec %s: %s\n", args[0], std::strerror(errno));
    ::_exit(errno == ENOENT ? 127 : 126);
  }
  child_ = pid;
  return pid;
}

void Supervisor::start(std::function<void(int)> done) {
  done_ = std::move(done);
  readSignal();
  reap();  // the child may have exited before the signalfd was first read
}

void Supervisor::readSignal() {
  asio::async_read(signals_, asio::buffer(&info_, sizeof info_),
                   [this](const std::error_code& ec, size_t) {
                     if (ec) return;  // closed on shutdown
                     onSignal(info_);
                     if (!finished_) readSignal();
                   });
}

void Supervisor::onSignal(const signalfd_siginfo& info) {
  const int sig = static_cast<int>(info.ssi_signo);
  if (sig == SIGCHLD) {
    reap();
    return;
  }
  if (!shutting_down_ && child_ > 0) {
    ::kill(child_, sig);
  } else if (shutting_down_ && (sig == SIGTERM || sig == SIGINT)) {
    // Asked again while waiting out the grace period: do not wait any longer.
    grace_timer_.cancel();
    signalEveryoneElse(SIGKILL);
  }
}

void Supervisor::reap() {
  while (true) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) break;
    if (pid == child_) {
      child_exit_code_ = exitCodeOf(status);
      child_ = -1;
      beginShutdown();
    }
  }
  finishIfEmpty();
}

void Supervisor::beginShutdown() {
  if (shutting_down_) return;
  shutting_down_ = true;
  signalEveryoneElse(SIGTERM);
  signalEveryoneElse(SIGCONT);  // a stopped process cannot act on SIGTERM
  armKill(grace_);
}

void Supervisor::armKill(std::chrono::milliseconds after) {
  grace_timer_.expires_after(after);
  grace_timer_.async_wait([this](const std::error_code& ec) {
    if (ec || finished_) return;
    signalEveryoneElse(SIGKILL);
    // Again until none is left: a process may have forked between the scan and the kill.
    armKill(std::chrono::milliseconds(100));
  });
}

void Supervisor::signalEveryoneElse(int sig) {
  if (pid1_) {
    // Every process of the PID namespace except PID 1 itself, whatever its session.
    ::kill(-1, sig);
    return;
  }
  for (pid_t p : descendantsOf(::getpid())) ::kill(p, sig);
}

void Supervisor::finishIfEmpty() {
  if (!shutting_down_ || finished_) return;
  // With no child left there is no descendant left: orphans are re-parented to us.
  siginfo_t info{};
  if (::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT | __WALL) == -1 && errno == ECHILD) {
    finished_ = true;
    grace_timer_.cancel();
    std::error_code ignored;
    signals_.cancel(ignored);
    if (done_) done_(child_exit_code_);
  }
}

}  // namespace nanoinit
