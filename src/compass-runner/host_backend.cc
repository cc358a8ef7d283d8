// The host tier (seed 002, "host"); see host_backend.h for what it gives and refuses.
#include "compass-runner/host_backend.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "common/unique_fd.h"
#include "compass-runner/backend.h"
#include "compass-runner/process.h"

extern char** environ;

namespace runner {
namespace host {

std::string unenforcedBanner() {
  return "compass-runner: WARNING: host tier: egress is NOT enforced. This agent runs as your "
         "own user with no sandbox: it can connect to any host this machine can reach, and "
         "read and write everything you can.\n"
         "compass-runner: to enforce egress, graduate to a container: run it again with "
         "--backend podman (no /dev/kvm needed).\n";
}

std::string egressRefusal(std::string_view what) {
  return "the host tier cannot enforce egress, and " + std::string(what) +
         " configures an egress policy; refusing rather than ignoring it. A host-tier agent "
         "is a process on this machine with no network namespace to firewall, so no policy "
         "would bind. Remove the policy to run unenforced on the host, or run with --backend "
         "podman to have it enforced";
}

int killAgentProcesses(const std::string& id, uid_t uid) {
  const std::string needle = std::string(kAgentIdEnv) + "=" + id;
  std::set<long> killed;  // a process may still be listed, dying, in the next round
  // A process may fork while we look; a few rounds catch what it made meanwhile.
  for (int round = 0; round < 10; ++round) {
    int found = 0;
    DIR* proc = ::opendir("/proc");
    if (proc == nullptr) return static_cast<int>(killed.size());
    while (const dirent* e = ::readdir(proc)) {
      char* end = nullptr;
      const long pid = std::strtol(e->d_name, &end, 10);
      if (end == e->d_name || *end != '\0' || pid <= 1 || pid == ::getpid()) continue;
      const std::string dir = std::string("/proc/") + e->d_name;
      struct stat st {};
      if (::stat(dir.c_str(), &st) != 0 || st.st_uid != uid) continue;
      std::ifstream in(dir + "/environ", std::ios::binary);
      std::string env((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      size_t pos = 0;
      bool match = false;
      while (pos < env.size()) {
        const size_t nul = env.find('\0', pos);
        const size_t len = (nul == std::string::npos ? env.size() : nul) - pos;
        if (env.compare(pos, len, needle) == 0) {
          match = true;
          break;
        }
        pos += len + 1;
      }
      // A zombie (start time 0) is already dead: its parent reaps it; not counted again.
      if (match && processStartTime(static_cast<pid_t>(pid)) != 0 &&
          ::kill(static_cast<pid_t>(pid), SIGKILL) == 0 && killed.insert(pid).second) {
        ++found;
      }
    }
    ::closedir(proc);
    if (found == 0) break;
  }
  return static_cast<int>(killed.size());
}

}  // namespace host

namespace {

constexpr auto kRelayChunk = 64 * 1024;
constexpr auto kOrphanMinAge = std::chrono::seconds(60);

std::string errnoText() { return std::strerror(errno); }

void makeDir(const std::string& path, mode_t mode) {
  if (::mkdir(path.c_str(), mode) != 0) {
    throw RunnerError("creating " + path + ": " + errnoText());
  }
}

void writeReadOnly(const std::string& path, const std::string& text) {
  common::UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0400));
  if (!fd.valid()) throw RunnerError("creating " + path + ": " + errnoText());
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd.get(), text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw RunnerError("writing " + path + ": " + errnoText());
    done += static_cast<size_t>(n);
  }
}

// Copies what the agent's pipes carry to the runner's own stdout and stderr, until the pipes
// close or finish() is called (then it takes what is already there and stops, so a process
// that escaped the agent's group and keeps a pipe open cannot hold the runner).
class Relay {
 public:
  Relay(common::UniqueFd out, common::UniqueFd err)
      : out_(std::move(out)), err_(std::move(err)), done_(::eventfd(0, EFD_CLOEXEC)) {
    if (!done_.valid()) throw RunnerError("eventfd: " + errnoText());
    thread_ = std::thread([this] { loop(); });
  }
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;
  ~Relay() { finish(); }

  void finish() {
    if (!thread_.joinable()) return;
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(done_.get(), &one, sizeof one);
    thread_.join();
  }

 private:
  // Copies one read's worth from `from` to fd `to`; false at EOF. A closed or failing
  // destination drops the data but keeps draining, so the agent never blocks on us.
  static bool pump(common::UniqueFd& from, int to, bool* to_ok) {
    char buf[kRelayChunk];
    const ssize_t n = ::read(from.get(), buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
    if (n <= 0) {
      from.reset();
      return false;
    }
    for (ssize_t done = 0; *to_ok && done < n;) {
      const ssize_t w = writeNoSigpipe(to, buf + done, static_cast<size_t>(n - done));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) {
        *to_ok = false;
        break;
      }
      done += w;
    }
    return true;
  }

  void loop() {
    bool out_ok = true, err_ok = true;
    while (out_.valid() || err_.valid()) {
      pollfd fds[3] = {{done_.get(), POLLIN, 0},
                       {out_.valid() ? out_.get() : -1, POLLIN, 0},
                       {err_.valid() ? err_.get() : -1, POLLIN, 0}};
      if (::poll(fds, 3, -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (fds[1].revents != 0) pump(out_, STDOUT_FILENO, &out_ok);
      if (fds[2].revents != 0) pump(err_, STDERR_FILENO, &err_ok);
      if (fds[0].revents != 0) break;
    }
    // Told to finish: everything the agent's processes wrote before they died is in the
    // pipes; take it without waiting for writers that may never close.
    for (auto* fd : {&out_, &err_}) {
      if (!fd->valid()) continue;
      ::fcntl(fd->get(), F_SETFL, ::fcntl(fd->get(), F_GETFL) | O_NONBLOCK);
      const int to = fd == &out_ ? STDOUT_FILENO : STDERR_FILENO;
      bool* ok = fd == &out_ ? &out_ok : &err_ok;
      for (int i = 0; i < 4096 && fd->valid(); ++i) {
        pollfd p{fd->get(), POLLIN, 0};
        if (::poll(&p, 1, 0) <= 0) break;
        if (!pump(*fd, to, ok)) break;
      }
    }
  }

  common::UniqueFd out_, err_, done_;
  std::thread thread_;
};

class HostBackend final : public Backend {
 public:
  [[nodiscard]] std::string_view name() const override { return "host"; }
  [[nodiscard]] Posture posture(const AgentSpec&) const override { return Posture::kUnenforced; }

  void validate(const AgentSpec& spec) const override {
    // Both ids: a setuid-root runner (euid 0) or a root shell that dropped only euid would
    // otherwise pass, and TMPDIR, HOME or USER say nothing about who we are.
    if (::getuid() == 0 || ::geteuid() == 0) {
      throw RunnerError(
          "the host tier refuses to run as root (uid 0): the agent would run as root on this "
          "machine with no boundary at all. Run compass-runner as your own user, or use "
          "--backend podman");
    }
    if (spec.egress) {
      throw RunnerError(
          host::egressRefusal(std::string("--egress ") + std::string(postureName(*spec.egress))));
    }
    if (spec.egress_configured) {
      std::string what = "--egress-allow";
      if (!spec.bundle_path.empty()) what += " or the bundle's `egress` section";
      throw RunnerError(host::egressRefusal(what));
    }
    if (!spec.image.empty() || !spec.rootfs.empty()) {
      throw RunnerError(
          "the host tier runs the agent on this machine's own file system, so --image and "
          "--rootfs do not apply; use --backend podman to run an image");
    }
    const Resources& r = spec.resources;
    if (r.memory_bytes || r.cpus || r.pids) {
      throw RunnerError(
          "the host tier has no cgroup, so --memory, --cpus and --pids cannot be enforced; "
          "refusing rather than ignoring them. Use --backend podman for limits");
    }
    if (!spec.sidecar_socket.empty()) {
      throw RunnerError(
          "the host tier has no sam-box to carry mesh.sam.alt to --sidecar-socket; use "
          "--backend podman");
    }
    if (!spec.credential.issuer.empty()) {
      throw RunnerError(
          "the host tier has no sam-box to verify --credential-issuer's token and assert the "
          "bundle's identity; use --backend podman");
    }
    std::error_code ec;
    if (!spec.workdir.empty() && !std::filesystem::is_directory(spec.workdir, ec)) {
      throw RunnerError("--workdir " + spec.workdir + ": not a directory");
    }
  }

  Started start(const AgentSpec& spec) override {
    validate(spec);
    if (pid_ > 0) throw RunnerError("host backend: already started");
    // The agent's own places, each private to it (seed 002: "its own $HOME").
    const std::string home = spec.state_dir + "/home";
    const std::string tmp = spec.state_dir + "/tmp";
    const std::string config = spec.state_dir + "/config";
    makeDir(home, 0700);
    makeDir(tmp, 0700);
    makeDir(config, 0700);
    writeConfigView(spec, config);

    std::string cwd = spec.workdir;
    if (cwd.empty()) {
      std::error_code ec;
      cwd = std::filesystem::current_path(ec).string();
      if (ec) throw RunnerError("the current directory is gone: " + ec.message());
    }
    std::map<std::string, std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string kv = *e;
      const size_t eq = kv.find('=');
      if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    env["HOME"] = home;
    env["TMPDIR"] = tmp;
    env["PWD"] = cwd;
    env[host::kAgentIdEnv] = spec.id;
    env["COMPASS_AGENT_CONFIG"] = config;
    env["COMPASS_EGRESS_POSTURE"] = "unenforced";
    if (!spec.agent_id.empty()) env["COMPASS_AGENT_NAME"] = spec.agent_id;

    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) throw RunnerError("pipe2: " + errnoText());
    common::UniqueFd out_r(p[0]), out_w(p[1]);
    if (::pipe2(p, O_CLOEXEC) != 0) throw RunnerError("pipe2: " + errnoText());
    common::UniqueFd err_r(p[0]), err_w(p[1]);

    SpawnOptions opts;
    opts.argv = spec.command;
    opts.env = std::move(env);
    opts.cwd = cwd;
    opts.stdin_path = "/dev/null";
    opts.stdout_fd = out_w.get();
    opts.stderr_fd = err_w.get();
    opts.new_session = true;  // no controlling terminal; its own process group to signal
    opts.die_with_parent = true;
    const pid_t pid = spawn(opts);
    {
      std::lock_guard lock(mu_);
      pid_ = pid;
    }
    exited_fd_ = pidFd(pid);
    relay_ = std::make_unique<Relay>(std::move(out_r), std::move(err_r));
    return Started{pid, spec.state_dir, ""};
  }

  void describe(AgentRecord&) const override {}

  int wait() override {
    if (pid_ <= 0) throw RunnerError("host backend: wait() before start()");
    siginfo_t info{};
    while (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOWAIT) != 0) {
      if (errno != EINTR) break;
    }
    {
      // The leader is a zombie until waitExit() below, so its group id cannot have been
      // reused: what is left of the agent's group goes with it (the sandbox is torn down).
      std::lock_guard lock(mu_);
      exited_ = true;
      ::kill(-pid_, SIGKILL);
    }
    const int status = waitExit(pid_);
    if (relay_) relay_->finish();
    return status;
  }

  void stop(std::chrono::milliseconds grace) override {
    {
      std::lock_guard lock(mu_);
      if (pid_ <= 0 || exited_) return;
      ::kill(-pid_, SIGTERM);
    }
    pollfd p{exited_fd_.get(), POLLIN, 0};
    while (::poll(&p, 1, static_cast<int>(grace.count())) < 0 && errno == EINTR) {
    }
    std::lock_guard lock(mu_);
    if (!exited_) ::kill(-pid_, SIGKILL);
  }

  void resize(const AgentRecord&, const Resources&) override {
    throw RunnerError(
        "the host tier has no cgroup, so it cannot change memory, CPU or task limits; run the "
        "agent with --backend podman to have limits you can resize");
  }

  void reap(const AgentRecord& rec) override {
    // The uid whose processes are signalled is the state dir's own owner: lstat, so a dir its
    // user swapped for a symlink (to a dir of root's) names no one; and never uid 0, whom the
    // tier refuses (gc runs as root to reap others' agents).
    struct stat st {};
    if (::lstat(rec.state_dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid != 0) {
      const int n = host::killAgentProcesses(rec.id, st.st_uid);
      if (n > 0) std::printf("killed %d leftover process(es) of agent %s\n", n, rec.id.c_str());
    }
  }

  void reapOrphans(const std::vector<std::string>& live_ids) override {
    const std::string root = stateRoot("host");
    DIR* dir = ::opendir(root.c_str());
    if (dir == nullptr) return;
    std::vector<std::string> ids;
    while (const dirent* e = ::readdir(dir)) {
      if (isAgentId(e->d_name)) ids.emplace_back(e->d_name);
    }
    ::closedir(dir);
    const auto now = std::chrono::system_clock::now();
    for (const auto& id : ids) {
      if (std::find(live_ids.begin(), live_ids.end(), id) != live_ids.end()) continue;
      const std::string path = root + "/" + id;
      struct stat st {};
      if (::lstat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) continue;
      // Has a record: gc reaps it by its record, or (unreadable) leaves it and says so.
      if (hasRecordFile(path)) continue;
      // A runner creates its dir and then writes agent.json: a young dir without one may be
      // a runner starting right now.
      const auto mtime = std::chrono::system_clock::from_time_t(st.st_mtime);
      if (now - mtime < kOrphanMinAge) continue;
      host::killAgentProcesses(id, st.st_uid);
      removeStateDir(path);
      std::printf("removed orphan state dir %s\n", path.c_str());
    }
  }

 private:
  static void writeConfigView(const AgentSpec& spec, const std::string& config) {
    const nlohmann::json view = {
        {"id", spec.id},           {"tier", "host"},
        {"egress", "unenforced"},  {"agent_id", spec.agent_id},
        {"command", spec.command},
    };
    // An argument is any bytes: what is not UTF-8 becomes U+FFFD in this view (it is for the
    // agent to read), instead of a JSON error that stopped the start.
    writeReadOnly(config + "/spec.json",
                  view.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
    if (!spec.bundle_path.empty()) {
      std::ifstream in(spec.bundle_path, std::ios::binary);
      if (!in) throw RunnerError("reading --bundle " + spec.bundle_path + ": " + errnoText());
      const std::string text((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
      writeReadOnly(config + "/bundle.yaml", text);
    }
    // Read-only as a whole: the agent can still chmod it back (same uid), but it is a view
    // of what it was started with, not a place to write.
    if (::chmod(config.c_str(), 0500) != 0) throw RunnerError("chmod " + config + ": failed");
  }

  std::mutex mu_;
  pid_t pid_ = -1;
  bool exited_ = false;
  common::UniqueFd exited_fd_;
  std::unique_ptr<Relay> relay_;
};

}  // namespace

std::unique_ptr<Backend> makeHostBackend() { return std::make_unique<HostBackend>(); }

}  // namespace runner
