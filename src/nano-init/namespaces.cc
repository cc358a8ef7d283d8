#include "nano-init/namespaces.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "common/unique_fd.h"
#include "nano-init/errors.h"
#include "nano-init/pid1.h"

namespace nanoinit::namespaces {
namespace {

void writeFile(const char* path, const std::string& content) {
  common::UniqueFd fd(::open(path, O_WRONLY | O_CLOEXEC));
  if (!fd.valid()) throwErrno(std::string("open(") + path + ")");
  if (::write(fd.get(), content.data(), content.size()) != static_cast<ssize_t>(content.size())) {
    throwErrno(std::string("write(") + path + ", \"" + content.substr(0, content.size() - 1) +
               "\")");
  }
}

}  // namespace

void enterUserNamespace(const std::optional<std::pair<uint32_t, uint32_t>>& user) {
  const uid_t uid = ::geteuid();
  const gid_t gid = ::getegid();
  if (user && (user->first != uid || user->second != gid)) {
    // A process may map only its own ids into a namespace it makes (user_namespaces(7)).
    throw StepError("--user " + std::to_string(user->first) + ":" + std::to_string(user->second) +
                    " cannot be taken: the user namespace made here maps only nano-init's own "
                    "ids " +
                    std::to_string(uid) + ":" + std::to_string(gid) +
                    " (other ids need root with CAP_SYS_ADMIN, or a launcher that makes the "
                    "namespaces)");
  }
  if (::unshare(CLONE_NEWUSER) != 0) {
    throwErrno("unshare(CLONE_NEWUSER)",
               " (user namespaces are denied here: on Ubuntu 24.04 hosts the likely cause is "
               "kernel.apparmor_restrict_unprivileged_userns=1; also check "
               "user.max_user_namespaces and that no seccomp profile blocks unshare)");
  }
  // An unprivileged process may write its gid_map only after giving up setgroups(2).
  writeFile("/proc/self/setgroups", "deny\n");
  writeFile("/proc/self/uid_map", std::to_string(uid) + " " + std::to_string(uid) + " 1\n");
  writeFile("/proc/self/gid_map", std::to_string(gid) + " " + std::to_string(gid) + " 1\n");
}

void enterNetworkNamespace() {
  // IPC and UTS too: the agent shares no System V IPC or hostname with the containers beside
  // it (a Kubernetes pod shares both between its containers).
  if (::unshare(CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS) != 0) {
    throwErrno("unshare(CLONE_NEWNET|CLONE_NEWIPC|CLONE_NEWUTS)");
  }
}

bool enterMountNamespace(std::string* why) {
  if (::unshare(CLONE_NEWNS) != 0) {
    *why = std::string("unshare(CLONE_NEWNS): ") + std::strerror(errno);
    return false;
  }
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    // Owning a namespace whose mounts still propagate to the host's would be worse than
    // owning none: report it and let the caller skip every mount.
    *why = std::string("mount(/, MS_REC|MS_PRIVATE): ") + std::strerror(errno);
    return false;
  }
  return true;
}

void enterPidNamespace() {
  // Blocked before the fork, so that none is lost between the fork and the parent's wait; the
  // child keeps them blocked (pending) until its Supervisor reads them.
  const sigset_t set = handledSignals();
  if (::sigprocmask(SIG_BLOCK, &set, nullptr) != 0) throwErrno("sigprocmask");
  if (::unshare(CLONE_NEWPID) != 0) throwErrno("unshare(CLONE_NEWPID)");
  // The child cannot name its parent (getppid() is 0 across the namespace): a pidfd can.
  common::UniqueFd parent(static_cast<int>(::syscall(SYS_pidfd_open, ::getpid(), 0)));
  if (!parent.valid()) throwErrno("pidfd_open");
  const pid_t child = ::fork();
  if (child < 0) throwErrno("fork (the PID namespace's PID 1)");
  if (child == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    pollfd gone{parent.get(), POLLIN, 0};
    if (::poll(&gone, 1, 0) != 0) ::_exit(137);  // the parent died before the line above
    parent.reset();
    return;
  }
  parent.reset();
  // The parent: nothing of the sandbox is here; forward, wait, and exit as the child did.
  ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  for (;;) {
    siginfo_t info{};
    const int sig = ::sigwaitinfo(&set, &info);
    if (sig < 0) continue;  // EINTR
    if (sig != SIGCHLD) {
      ::kill(child, sig);
      continue;
    }
    int status = 0;
    const pid_t done = ::waitpid(child, &status, WNOHANG);
    if (done != child) continue;
    if (WIFEXITED(status)) ::_exit(WEXITSTATUS(status));
    ::_exit(WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 255);
  }
}

bool mountOwnProc(std::string* why) {
  if (::mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0) {
    *why = std::string("mount(proc, /proc): ") + std::strerror(errno);
    return false;
  }
  return true;
}

}  // namespace nanoinit::namespaces
