// The only file in the runner that forks and execs (process.h). The child is made the way
// posix_spawn(3) makes it: clone(CLONE_VM | CLONE_VFORK) on a stack of its own, so it shares
// the runner's memory until its execve() and the spawning thread waits until then. Nothing is
// copied, and neither side takes the copy-on-write page faults that fork(2) costs (about 20 µs
// each in a VM; bench/runner_bench.py). Everything the child does is a system call on data
// prepared before the clone, with no allocation: it must not change memory the runner's other
// threads (signal watcher, output relay) use, and it starts with every signal blocked so that
// no handler of the runner's runs in it before it has reset them all to SIG_DFL. Sanitizer
// builds use fork(2): their runtimes do not expect instrumented code on a borrowed stack.
#include "compass-runner/process.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <poll.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <pthread.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>

#include "compass-runner/backend.h"

extern char** environ;

namespace runner {
namespace {

constexpr size_t kOutputCap = size_t{1} << 20;
constexpr size_t kReadChunk = 64 * 1024;

// The step that failed in the child, reported through the error pipe with its errno.
enum ChildStep : int { kSignals, kSetsid, kSetns, kFds, kChdir, kExec };

const char* stepName(int step) {
  switch (step) {
    case kSignals:
      return "resetting signals";
    case kSetsid:
      return "setsid";
    case kSetns:
      return "setns into the network namespace";
    case kFds:
      return "arranging descriptors";
    case kChdir:
      return "chdir";
    case kExec:
      return "execve";
    default:
      return "unknown step";
  }
}

struct ChildError {
  int step;
  int err;
};

std::string errnoText(int err) { return std::strerror(err); }

bool isExecutableFile(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

// PATH lookup happens here, in the parent, so the child needs no allocation (execvpe may).
std::string resolveProgram(const SpawnOptions& opts) {
  const std::string& name = opts.argv.front();
  if (name.find('/') != std::string::npos) return name;
  std::string path;
  bool have_path = false;
  if (opts.env) {
    if (auto it = opts.env->find("PATH"); it != opts.env->end()) {
      path = it->second;
      have_path = true;
    }
  }
  if (!have_path) {
    const char* p = std::getenv("PATH");
    path = p != nullptr ? p : "/usr/local/bin:/usr/bin:/bin";
  }
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    const std::string dir = end == start ? "." : path.substr(start, end - start);
    const std::string candidate = dir + "/" + name;
    if (isExecutableFile(candidate)) return candidate;
    start = end + 1;
  }
  throw RunnerError("cannot run " + name + ": not found on PATH (" + path + ")");
}

common::UniqueFd openFor(const std::string& what, const std::string& path, int flags) {
  common::UniqueFd fd(::open(path.c_str(), flags | O_CLOEXEC, 0600));
  if (!fd.valid()) throw RunnerError("cannot open " + what + " " + path + ": " + errnoText(errno));
  return fd;
}

[[noreturn]] void childFail(int err_fd, int step) {
  const ChildError e{step, errno};
  [[maybe_unused]] ssize_t n = ::write(err_fd, &e, sizeof e);
  ::_exit(127);
}

// Runs in the child, which shares the runner's memory (see the top of the file): system calls
// only, every signal blocked on entry.
[[noreturn]] void childMain(const SpawnOptions& opts, pid_t parent, int err_fd, int netns_fd,
                            const int* sources, int nsources, const char* program,
                            char* const* argv, char* const* envp) {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) ::sigaction(sig, &dfl, nullptr);  // EINVAL for some
  }
  sigset_t none;
  sigemptyset(&none);
  if (::sigprocmask(SIG_SETMASK, &none, nullptr) != 0) childFail(err_fd, kSignals);
  if (opts.die_with_parent) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the parent died before the line above
  }
  if (opts.new_session && ::setsid() < 0) childFail(err_fd, kSetsid);
  if (netns_fd >= 0 && ::setns(netns_fd, CLONE_NEWNET) != 0) childFail(err_fd, kSetns);

  // Descriptors: sources[i] becomes i (0..2 may be -1: inherit). Everything is first moved
  // above every target and every source, so no dup2() overwrites a source still needed.
  int high = nsources;
  for (int i = 0; i < nsources; ++i) high = std::max(high, sources[i] + 1);
  high = std::max(high, err_fd + 1);
  const int moved_err = ::fcntl(err_fd, F_DUPFD_CLOEXEC, high);
  if (moved_err < 0) childFail(err_fd, kFds);  // the original is still open and ours
  err_fd = moved_err;
  int moved[3 + 256];
  for (int i = 0; i < nsources; ++i) {
    moved[i] = -1;
    if (sources[i] < 0) continue;
    moved[i] = ::fcntl(sources[i], F_DUPFD_CLOEXEC, high);
    if (moved[i] < 0) childFail(err_fd, kFds);
  }
  for (int i = 0; i < nsources; ++i) {
    if (moved[i] >= 0 && ::dup2(moved[i], i) < 0) childFail(err_fd, kFds);
  }
  // Everything above the given descriptors closes at exec; err_fd stays usable until then.
  if (::syscall(SYS_close_range, nsources, ~0U, CLOSE_RANGE_CLOEXEC) != 0) {
    childFail(err_fd, kFds);
  }
  if (!opts.cwd.empty() && ::chdir(opts.cwd.c_str()) != 0) childFail(err_fd, kChdir);
  ::execve(program, argv, envp);
  childFail(err_fd, kExec);
}

// What the clone()d child starts with: childMain's arguments.
struct ChildArgs {
  const SpawnOptions* opts;
  pid_t parent;
  int err_fd;
  int netns_fd;
  const int* sources;
  int nsources;
  const char* program;
  char* const* argv;
  char* const* envp;
};

int childEntry(void* arg) {
  const auto* a = static_cast<const ChildArgs*>(arg);
  childMain(*a->opts, a->parent, a->err_fd, a->netns_fd, a->sources, a->nsources, a->program,
            a->argv, a->envp);
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

// The child's stack while it shares the runner's memory: childMain needs about 2 KiB.
constexpr size_t kChildStack = size_t{64} * 1024;

// Starts the child (see the top of the file); returns its pid, or -1 with errno set.
pid_t startChild(ChildArgs& args) {
  if (kSanitized) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      sigset_t all;
      sigfillset(&all);
      ::sigprocmask(SIG_SETMASK, &all, nullptr);
      childEntry(&args);
    }
    return pid;
  }
  sigset_t all, old;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);
  alignas(64) char stack[kChildStack];  // the calling thread waits until the child execs
  const pid_t pid =
      ::clone(childEntry, stack + kChildStack, CLONE_VM | CLONE_VFORK | SIGCHLD, &args);
  const int saved = errno;
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  errno = saved;
  return pid;
}

}  // namespace

// write(2) that turns a closed reader into EPIPE without SIGPIPE, whatever the process's
// disposition: SIGPIPE is blocked in this thread for the call and a pending one it raised is
// consumed (the usual idiom; a pipe has no MSG_NOSIGNAL).
ssize_t writeNoSigpipe(int fd, const char* data, size_t size) {
  sigset_t pipe_set, old;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  sigset_t pending;
  sigpending(&pending);
  const bool was_pending = sigismember(&pending, SIGPIPE) == 1;
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
  const ssize_t n = ::write(fd, data, size);
  const int saved = errno;
  if (n < 0 && errno == EPIPE && !was_pending) {
    const timespec zero{};
    while (sigtimedwait(&pipe_set, nullptr, &zero) < 0 && errno == EINTR) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  errno = saved;
  return n;
}

namespace {

void setNonBlocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

// Appends what `fd` has (up to `cap` kept); false at EOF or error.
bool readInto(int fd, std::string& out) {
  char buf[kReadChunk];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      const size_t keep = std::min(static_cast<size_t>(n), kOutputCap - out.size());
      out.append(buf, keep);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return true;
    return false;
  }
}

}  // namespace

common::UniqueFd pidFd(pid_t pid) {
  common::UniqueFd fd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (!fd.valid()) {
    throw RunnerError("pidfd_open(" + std::to_string(pid) + "): " + errnoText(errno));
  }
  return fd;
}

pid_t spawn(const SpawnOptions& opts) {
  if (opts.argv.empty() || opts.argv.front().empty()) throw RunnerError("spawn: empty argv");
  if (opts.pass_fds.size() > 256) throw RunnerError("spawn: more than 256 pass_fds");
  const std::string program = resolveProgram(opts);

  std::vector<char*> argv;
  for (const auto& a : opts.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<std::string> env_strings;
  std::vector<char*> envp;
  char* const* env = environ;
  if (opts.env || !opts.set_env.empty()) {
    if (opts.env) {
      for (const auto& [k, v] : *opts.env) env_strings.push_back(k + "=" + v);
    } else {
      for (char* const* e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
    }
    for (const auto& entry : opts.set_env) {
      const size_t eq = entry.find('=');
      if (eq == std::string::npos || eq == 0) {
        throw RunnerError("spawn: set_env entry \"" + entry + "\" is not NAME=value");
      }
      const std::string prefix = entry.substr(0, eq + 1);
      std::erase_if(env_strings, [&](const std::string& s) { return s.starts_with(prefix); });
      env_strings.push_back(entry);
    }
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    env = envp.data();
  }

  common::UniqueFd netns;
  if (!opts.netns_path.empty()) netns = openFor("network namespace", opts.netns_path, O_RDONLY);
  common::UniqueFd in, out, err;
  int sources[3 + 256];
  sources[0] = opts.stdin_fd;
  sources[1] = opts.stdout_fd;
  sources[2] = opts.stderr_fd;
  if (sources[0] < 0 && !opts.stdin_path.empty()) {
    in = openFor("stdin", opts.stdin_path, O_RDONLY);
    sources[0] = in.get();
  }
  if (sources[1] < 0 && !opts.stdout_path.empty()) {
    out = openFor("stdout", opts.stdout_path, O_WRONLY | O_APPEND | O_CREAT);
    sources[1] = out.get();
  }
  if (sources[2] < 0 && !opts.stderr_path.empty()) {
    err = openFor("stderr", opts.stderr_path, O_WRONLY | O_APPEND | O_CREAT);
    sources[2] = err.get();
  }
  const int nsources = 3 + static_cast<int>(opts.pass_fds.size());
  for (size_t i = 0; i < opts.pass_fds.size(); ++i) {
    if (opts.pass_fds[i] < 0) throw RunnerError("spawn: pass_fds holds a negative descriptor");
    sources[3 + i] = opts.pass_fds[i];
  }

  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) throw RunnerError("pipe2: " + errnoText(errno));
  common::UniqueFd err_r(pipe_fds[0]);
  common::UniqueFd err_w(pipe_fds[1]);

  ChildArgs args{&opts,    ::getpid(),      err_w.get(), netns.get(), sources,
                 nsources, program.c_str(), argv.data(), env};
  const pid_t pid = startChild(args);
  if (pid < 0) throw RunnerError("clone for " + opts.argv.front() + ": " + errnoText(errno));
  err_w.reset();
  ChildError e{};
  ssize_t n;
  do {
    n = ::read(err_r.get(), &e, sizeof e);
  } while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof e)) {
    waitExit(pid);
    throw RunnerError("cannot run " + opts.argv.front() + ": " + stepName(e.step) + ": " +
                      errnoText(e.err));
  }
  return pid;
}

int waitExit(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

CommandResult runCommand(const std::vector<std::string>& argv, const std::string& input,
                         std::chrono::milliseconds timeout, const std::string& netns_path,
                         const std::vector<std::string>& set_env) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) throw RunnerError("pipe2: " + errnoText(errno));
  common::UniqueFd in_r(p[0]), in_w(p[1]);
  if (::pipe2(p, O_CLOEXEC) != 0) throw RunnerError("pipe2: " + errnoText(errno));
  common::UniqueFd out_r(p[0]), out_w(p[1]);
  if (::pipe2(p, O_CLOEXEC) != 0) throw RunnerError("pipe2: " + errnoText(errno));
  common::UniqueFd err_r(p[0]), err_w(p[1]);

  SpawnOptions opts;
  opts.argv = argv;
  opts.netns_path = netns_path;
  opts.set_env = set_env;
  opts.stdin_fd = in_r.get();
  opts.stdout_fd = out_w.get();
  opts.stderr_fd = err_w.get();
  // Its own process group, so a timeout kills what it started too.
  opts.new_session = true;
  const pid_t pid = spawn(opts);
  in_r.reset();
  out_w.reset();
  err_w.reset();
  common::UniqueFd exited = pidFd(pid);
  setNonBlocking(in_w.get());
  setNonBlocking(out_r.get());
  setNonBlocking(err_r.get());
  if (input.empty()) in_w.reset();

  CommandResult result;
  size_t written = 0;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool timed_out = false;
  for (;;) {
    pollfd fds[4];
    nfds_t nfds = 0;
    fds[nfds++] = {exited.get(), POLLIN, 0};
    const nfds_t out_i = out_r.valid() ? nfds++ : 99;
    if (out_i != 99) fds[out_i] = {out_r.get(), POLLIN, 0};
    const nfds_t err_i = err_r.valid() ? nfds++ : 99;
    if (err_i != 99) fds[err_i] = {err_r.get(), POLLIN, 0};
    const nfds_t in_i = in_w.valid() ? nfds++ : 99;
    if (in_i != 99) fds[in_i] = {in_w.get(), POLLOUT, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    const int ready = ::poll(fds, nfds, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (ready < 0 && errno != EINTR) throw RunnerError("poll: " + errnoText(errno));
    if (ready <= 0) continue;
    if (out_i != 99 && fds[out_i].revents != 0 && !readInto(out_r.get(), result.out)) {
      out_r.reset();
    }
    if (err_i != 99 && fds[err_i].revents != 0 && !readInto(err_r.get(), result.err)) {
      err_r.reset();
    }
    if (in_i != 99 && fds[in_i].revents != 0) {
      const ssize_t n = writeNoSigpipe(in_w.get(), input.data() + written, input.size() - written);
      if (n > 0) written += static_cast<size_t>(n);
      // EPIPE: the command does not read its input; that is its business.
      if ((n < 0 && errno != EAGAIN && errno != EINTR) || written == input.size()) in_w.reset();
    }
    if (fds[0].revents != 0) {
      // The command has exited: what it wrote is in the pipes already. Take what is there
      // and stop; a descendant that still holds the pipes open does not hold us.
      if (out_r.valid()) readInto(out_r.get(), result.out);
      if (err_r.valid()) readInto(err_r.get(), result.err);
      break;
    }
  }
  if (timed_out) {
    ::kill(-pid, SIGKILL);  // the leader is not reaped yet, so the group id is still ours
    waitExit(pid);
    result.status = -1;
    return result;
  }
  result.status = waitExit(pid);
  return result;
}

std::string runChecked(const std::string& what, const std::vector<std::string>& argv,
                       const std::string& input, std::chrono::milliseconds timeout,
                       const std::string& netns_path, const std::vector<std::string>& set_env) {
  CommandResult r = runCommand(argv, input, timeout, netns_path, set_env);
  if (r.status == 0) return std::move(r.out);
  std::string joined;
  for (const auto& a : argv) joined += (joined.empty() ? "" : " ") + a;
  std::string err = r.err;
  while (!err.empty() && (err.back() == '\n' || err.back() == ' ')) err.pop_back();
  const std::string status = r.status == -1
                                 ? "timed out after " + std::to_string(timeout.count()) + " ms"
                                 : "exit " + std::to_string(r.status);
  throw RunnerError(what + ": " + joined + ": " + status + (err.empty() ? "" : ": " + err));
}

std::string findProgram(const std::string& name) {
  SpawnOptions opts;
  opts.argv = {name};
  return resolveProgram(opts);
}

}  // namespace runner
