#include "compass-runner/sam_box_process.h"

#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include "common/socket_path.h"
#include "common/unique_fd.h"
#include "compass-runner/backend.h"
#include "compass-runner/process.h"

namespace runner {

SamBoxOptions boundarySamBoxOptions(const AgentSpec& spec, const std::string& binary,
                                    const std::string& socket) {
  SamBoxOptions o;
  o.binary = binary;
  o.socket = socket;
  o.log = spec.state_dir + "/" + kSamBoxLog;
  o.metrics_addr = "127.0.0.1:" + std::to_string(freeLocalPort());
  o.egress_allow = spec.egress_allow;
  o.bundle = spec.bundle_path;
  o.credential = spec.credential;
  o.insecure_unverified_bundle = !spec.bundle_path.empty() && spec.credential.issuer.empty();
  o.sidecar_socket = spec.sidecar_socket;
  if (o.insecure_unverified_bundle) {
    (void)std::fprintf(
        stderr,
        "compass-runner: the bundle's agent identity is NOT verified (no platform "
        "credential is configured); sam-box runs with --insecure-unverified-bundle. Give "
        "--credential-issuer and --credential-audience to verify it\n");
  }
  return o;
}

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
constexpr auto kPoll = std::chrono::milliseconds(10);

bool isExecutable(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec) && ::access(p.c_str(), X_OK) == 0;
}

// argv of a process from /proc (NUL-separated); empty if gone or unreadable.
std::vector<std::string> cmdlineOf(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
  std::vector<std::string> argv;
  for (std::string arg; std::getline(in, arg, '\0');) argv.push_back(arg);
  return argv;
}

// The --socket of a sam-box command line, or "" if `argv` is not `sam-box run … --socket P`.
std::string socketOf(const std::vector<std::string>& argv) {
  if (argv.size() < 2 || fs::path(argv[0]).filename() != "sam-box" || argv[1] != "run") return "";
  for (size_t i = 2; i + 1 < argv.size(); ++i) {
    if (argv[i] == "--socket") return argv[i + 1];
  }
  return "";
}

// Running, not a zombie waiting for a parent that is not us.
bool alive(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno != EPERM) return false;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::getline(in, stat);
  const size_t paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] != 'Z';
}

}  // namespace

std::vector<std::string> samBoxArgv(const SamBoxOptions& opts) {
  std::vector<std::string> argv = {opts.binary, "run", "--socket", opts.socket};
  if (!opts.metrics_addr.empty()) argv.insert(argv.end(), {"--metrics-addr", opts.metrics_addr});
  for (const auto& a : opts.egress_allow) argv.insert(argv.end(), {"--egress-allow", a});
  if (!opts.bundle.empty()) {
    argv.insert(argv.end(), {"--bundle", opts.bundle});
    if (opts.insecure_unverified_bundle) argv.emplace_back("--insecure-unverified-bundle");
  }
  const Credential& c = opts.credential;
  for (const auto& [flag, value] :
       {std::pair{"--credential-issuer", &c.issuer},
        std::pair{"--credential-audience", &c.audience}, std::pair{"--credential-path", &c.path},
        std::pair{"--credential-ca", &c.ca}}) {
    if (!value->empty()) argv.insert(argv.end(), {flag, *value});
  }
  if (!opts.sidecar_socket.empty()) {
    argv.insert(argv.end(), {"--sidecar-socket", opts.sidecar_socket});
  }
  return argv;
}

std::string findCompanion(const char* env_var, const std::string& name) {
  if (const char* env = std::getenv(env_var); env != nullptr && *env != '\0') {
    if (!isExecutable(env)) {
      throw RunnerError(std::string(env_var) + "=" + env + ": not an executable file");
    }
    return env;
  }
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) throw RunnerError("cannot find " + name + ": readlink(/proc/self/exe): " + ec.message());
  const fs::path beside = self.parent_path() / name;
  const fs::path in_build = self.parent_path().parent_path() / name / name;
  for (const auto& p : {beside, in_build}) {
    if (isExecutable(p)) return p.string();
  }
  throw RunnerError("cannot find " + name + ": not at " + beside.string() + " nor " +
                    in_build.string() + "; set " + env_var + " to its path");
}

std::string findSamBox() { return findCompanion("COMPASS_SAM_BOX", "sam-box"); }

int freeLocalPort() {
  common::UniqueFd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) throw RunnerError(std::string("metrics port: socket: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (::bind(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(s.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    throw RunnerError(std::string("metrics port: bind 127.0.0.1:0: ") + std::strerror(errno));
  }
  return ntohs(addr.sin_port);
}

std::string tailOfFile(const std::string& path, int lines) {
  std::ifstream in(path);
  std::deque<std::string> last;
  for (std::string line; std::getline(in, line);) {
    last.push_back(line);
    if (static_cast<int>(last.size()) > lines) last.pop_front();
  }
  std::string out;
  for (const auto& l : last) out += l + "\n";
  return out;
}

void SamBoxProcess::start(const SamBoxOptions& opts, std::chrono::milliseconds timeout) {
  spawn(opts);
  waitReady(timeout);
}

void SamBoxProcess::spawn(const SamBoxOptions& opts) {
  SpawnOptions spawn_opts;
  spawn_opts.argv = samBoxArgv(opts);
  spawn_opts.stdout_path = opts.log;
  spawn_opts.stderr_path = opts.log;
  // Its own session: an operator's Ctrl-C reaches the runner, which stops things in order.
  spawn_opts.new_session = true;
  spawn_opts.die_with_parent = true;  // a killed runner leaves no boundary serving nobody
  socket_ = opts.socket;
  log_ = opts.log;
  verifies_ = !opts.credential.issuer.empty();
  pid_ = ::runner::spawn(spawn_opts);
}

void SamBoxProcess::waitReady(std::chrono::milliseconds timeout) {
  if (pid_ <= 0) throw RunnerError("sam-box is not running (it was not started)");
  const std::chrono::milliseconds limit =
      timeout + (verifies_ ? std::chrono::milliseconds(kCredentialVerifyGrace)
                           : std::chrono::milliseconds(0));
  const auto deadline = Clock::now() + limit;
  // A stat() every millisecond, woken at once by sam-box's exit (pidfd): this wait is on the
  // agent's path to exec, and sam-box makes its socket within 1 to 2 ms. (Not inotify: closing
  // an inotify instance waits for an SRCU grace period, 10 to 20 ms of the agent's start.)
  const common::UniqueFd exited = pidFd(pid_);
  while (true) {
    throwIfExited("before its socket was ready");
    if (common::isSocket(socket_)) return;
    if (Clock::now() > deadline) {
      stop();
      throw RunnerError("sam-box did not create " + socket_ + " within " +
                        std::to_string(limit.count()) + " ms; the last lines of its log:\n" +
                        tailOfFile(log_));
    }
    pollfd fd{exited.get(), POLLIN, 0};
    if (::poll(&fd, 1, 1) < 0 && errno != EINTR) {
      throw RunnerError(std::string("waiting for sam-box's socket: poll: ") + std::strerror(errno));
    }
  }
}

void SamBoxProcess::requireRunning() {
  if (pid_ <= 0) throw RunnerError("sam-box is not running (it was not started)");
  throwIfExited("before the agent started");
}

void SamBoxProcess::throwIfExited(const char* when) {
  int status = 0;
  const pid_t reaped = ::waitpid(pid_, &status, WNOHANG);
  if (reaped != pid_ && !(reaped < 0 && errno == ECHILD)) return;
  const bool have_status = reaped == pid_;
  pid_ = -1;
  const std::string how = !have_status ? "exited"
                          : WIFEXITED(status)
                              ? "exited with status " + std::to_string(WEXITSTATUS(status))
                              : "was killed by signal " + std::to_string(WTERMSIG(status));
  // The log goes with the state dir when the start fails: its lines, not its path.
  throw RunnerError("sam-box " + how + " " + when + "; the last lines of its log:\n" +
                    tailOfFile(log_));
}

void SamBoxProcess::watch() {
  if (pid_ <= 0 || watcher_.joinable()) return;
  common::UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0)));
  common::UniqueFd stop_fd(::eventfd(0, EFD_CLOEXEC));
  if (!pidfd.valid() || !stop_fd.valid()) {
    static_cast<void>(std::fprintf(stderr,
                                   "compass-runner: warning: cannot watch sam-box (pid %d): %s\n",
                                   pid_, std::strerror(errno)));
    return;
  }
  watch_stop_ = stop_fd.release();
  watcher_ = std::thread([pid = pid_, log = log_, stop = watch_stop_, fd = std::move(pidfd)] {
    pollfd fds[2] = {{fd.get(), POLLIN, 0}, {stop, POLLIN, 0}};
    while (::poll(fds, 2, -1) < 0 && errno == EINTR) {
    }
    if (fds[1].revents != 0 || fds[0].revents == 0) return;  // stop() came first
    // Exited: its status without reaping it (stop() still reaps).
    siginfo_t info{};
    std::string how = "exited";
    if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT | WNOHANG) == 0 &&
        info.si_pid == pid) {
      how = info.si_code == CLD_EXITED ? "exited with status " + std::to_string(info.si_status)
                                       : "was killed by signal " + std::to_string(info.si_status);
    }
    static_cast<void>(std::fprintf(
        stderr,
        "compass-runner: warning: the agent's sam-box (pid %d) %s while the agent runs: "
        "every flow of the agent is refused from now on (its egress stays closed); the "
        "end of %s:\n%s\n",
        pid, how.c_str(), log.c_str(), tailOfFile(log).c_str()));
  });
}

void SamBoxProcess::endWatch() noexcept {
  if (!watcher_.joinable()) return;
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(watch_stop_, &one, sizeof one);
  watcher_.join();
  ::close(watch_stop_);
  watch_stop_ = -1;
}

void SamBoxProcess::stop(std::chrono::milliseconds grace) noexcept {
  endWatch();  // an exit from here on is ours
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  const auto deadline = Clock::now() + grace;
  while (Clock::now() < deadline) {
    if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
      pid_ = -1;
      return;
    }
    std::this_thread::sleep_for(kPoll);
  }
  ::kill(pid_, SIGKILL);
  while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
}

bool isSamBoxFor(pid_t pid, const std::string& socket) {
  return pid > 0 && !socket.empty() && socketOf(cmdlineOf(pid)) == socket;
}

std::vector<std::pair<pid_t, std::string>> samBoxesUnder(const std::string& dir) {
  std::vector<std::pair<pid_t, std::string>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string n = e.path().filename().string();
    if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = std::stoi(n);
    const std::string sock = socketOf(cmdlineOf(pid));
    if (!sock.empty() && sock.rfind(dir + "/", 0) == 0) out.emplace_back(pid, sock);
  }
  return out;
}

void killSamBox(pid_t pid, std::chrono::milliseconds grace) noexcept {
  if (pid <= 0 || !alive(pid)) return;
  ::kill(pid, SIGTERM);
  const auto deadline = Clock::now() + grace;
  while (Clock::now() < deadline) {
    // Our child (same runner) or not: reap if we can, else watch it go.
    ::waitpid(pid, nullptr, WNOHANG);
    if (!alive(pid)) return;
    std::this_thread::sleep_for(kPoll);
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, WNOHANG);
}

}  // namespace runner
