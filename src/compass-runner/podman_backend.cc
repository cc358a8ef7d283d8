// The podman tier (podman_backend.h). start() is one ordered list of named steps; each step
// that makes something pushes its undo, and a failure runs the undos in reverse and throws
// RunnerError naming the step (fail closed: the agent never starts half-contained).
#include "compass-runner/podman_backend.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <mutex>
#include <string_view>
#include <thread>

#include "compass-runner/elf_check.h"
#include "compass-runner/exec_gate.h"
#include "compass-runner/firewall.h"
#include "compass-runner/image.h"
#include "compass-runner/netns.h"
#include "compass-runner/podman_checks.h"
#include "compass-runner/podman_cli.h"
#include "compass-runner/podman_conf.h"
#include "compass-runner/podman_reap.h"
#include "compass-runner/podman_rootfs.h"
#include "compass-runner/podman_userns.h"
#include "compass-runner/process.h"
#include "compass-runner/sam_box_process.h"
#include "compass-runner/state.h"
#include "vdns/virtual_dns.h"

namespace runner {
namespace podman {

std::string findNanoInit() {
  std::string path = findCompanion("COMPASS_NANO_INIT", "nano-init");
  if (!isStaticElf(path)) {
    throw RunnerError(path +
                      ": nano-init is not a statically linked executable (a sanitizer build?); "
                      "as the sandbox's first process it would load the sandbox's own ld.so, "
                      "libc and LD_PRELOAD before holding the agent back: use the static build "
                      "(bash scripts/build)");
  }
  return path;
}

namespace {

using Clock = std::chrono::steady_clock;

class PodmanBackend final : public Backend {
 public:
  ~PodmanBackend() override {
    if (started_ && !torn_down_) teardown();
  }

  [[nodiscard]] std::string_view name() const override { return "podman"; }

  [[nodiscard]] Posture posture(const AgentSpec& spec) const override {
    return spec.egress.value_or(Posture::kBoundary) == Posture::kFirewall ? Posture::kFirewall
                                                                          : Posture::kBoundary;
  }

  // Root, the containers.conf files (pasta), --rootfs, the command. The image is not asked
  // for here: `podman image exists` is a whole podman start on the agent's path to exec, and
  // `podman run --pull never` refuses a missing image anyway; start() turns that failure into
  // the same refusal (refuseIfImageMissing()).
  void validate(const AgentSpec& spec) const override {
    if (::geteuid() != 0) {
      throw RunnerError(
          "the podman tier runs rootful podman and needs root (the agent itself "
          "runs as uid 1000 in a user namespace of its own, never as host root)");
    }
    if (spec.command.empty()) throw RunnerError("no command to run");
    validateSidecar(spec);
    const std::string conf = containersConfPath();
    writeContainersConf(conf);
    verifyNoPastaForwards(containersConfCandidates(std::getenv("CONTAINERS_CONF"), conf));
    checkRootfs(spec);
  }

  Started start(const AgentSpec& spec) override {
    try {
      return startSteps(spec);
    } catch (...) {
      gate_.shut();  // a gate not yet opened stays shut: the agent never runs
      runUndos();
      throw;
    }
  }

  void describe(AgentRecord& rec) const override {
    rec.container = container_;
    rec.netns = netns_;
    rec.sam_box_pid = sam_box_.pid();
    rec.metrics_addr = metrics_addr_;
    if (egress_) rec.veth = egress_->hostVeth();
  }

  int wait() override {
    int status = exit_status_;
    if (status < 0) status = waitExit(podman_pid_);
    podman_pid_ = -1;
    teardown();
    return status;
  }

  void stop(std::chrono::milliseconds grace) override {
    stop_requested_ = true;
    std::lock_guard lock(stop_mutex_);
    if (container_.empty() || !running_) return;
    const auto secs = static_cast<long>(std::ceil(static_cast<double>(grace.count()) / 1000.0));
    podman::run(conf_, {"stop", "--ignore", "--time", std::to_string(secs), container_},
                grace + std::chrono::seconds(30));
  }

  void resize(const AgentRecord& rec, const Resources& r) override {
    const std::string name = rec.container.empty() ? netns::nameFor(rec.id) : rec.container;
    const std::string conf = containersConfPath();
    writeContainersConf(conf);
    if (auto args = updateArgs(name, r); !args.empty()) {
      podman::runChecked("resize " + rec.id + ": podman update", conf, args);
    }
    if (r.pids) {
      // podman 4.3's `update` has no --pids-limit: the container's pids cgroup is written.
      const std::string pid = podman::runChecked(
          "resize " + rec.id + ": podman inspect", conf,
          {"inspect", "--type", "container", "--format", "{{.State.Pid}}", name});
      setPidsLimit(std::stoi(pid), *r.pids);
    }
  }

  void reap(const AgentRecord& rec) override {
    const std::string conf = containersConfPath();
    writeContainersConf(conf);
    reapAgent(conf, rec.id, rec.container, rec.netns, rec.sam_box_pid, rec.state_dir);
  }

  void reapOrphans(const std::vector<std::string>& live_ids) override {
    const std::string conf = containersConfPath();
    writeContainersConf(conf);
    reapOrphanAgents(conf, live_ids);
  }

 private:
  Started startSteps(const AgentSpec& spec) {
    const Posture egress = posture(spec);
    id_ = spec.id;
    state_dir_ = spec.state_dir;
    container_ = netns::nameFor(spec.id);
    const std::string ns = netns::nameFor(spec.id);
    const std::string socket = spec.state_dir + "/" + kSocketFile;
    std::string sam_box_bin, nano_init_bin;

    // 1. Refusals before anything is made.
    step("preflight", [&] {
      if (::geteuid() != 0) {
        throw RunnerError(
            "the podman tier runs rootful podman and needs root (the agent "
            "itself runs as uid 1000 in its own user namespace)");
      }
      if (spec.command.empty()) throw RunnerError("no command to run");
      conf_ = containersConfPath();
      writeContainersConf(conf_);
      verifyNoPastaForwards(containersConfCandidates(std::getenv("CONTAINERS_CONF"), conf_));
      checkRootfs(spec);
      if (spec.rootfs.empty()) {
        // Whether it exists is left to `podman run --pull never` (see validate()).
        image_ = spec.image.empty() ? image::kDefaultImage : spec.image;
        default_image_ = spec.image.empty();
        workdir_ = spec.workdir;
      }
      // Every program the start and the teardown run: `ip` removes the netns at the end.
      checkAll({[] { findProgram("podman"); }, [] { findProgram("ip"); },
                [&] {
                  if (egress == Posture::kFirewall) findProgram("nft");
                },
                [&] {
                  if (egress == Posture::kBoundary) sam_box_bin = findSamBox();
                },
                [&] { nano_init_bin = findNanoInit(); }});
    });

    // 2. The agent's own host ids, so container root is not host root.
    const IdRange ids = step("user namespace", [&] { return claimIds(spec.id); });
    undo_.emplace_back([id = spec.id] { releaseIds(id); });

    // 2b. --rootfs: an overlay over DIR with owners shifted into those ids (DIR is never
    // written, and container root owns what it must).
    std::string rootfs;
    if (!spec.rootfs.empty()) {
      rootfs = step("rootfs", [&] {
        return mountShiftedRootfs(spec.rootfs, spec.id, spec.state_dir, ids.base);
      });
      undo_.emplace_back([this] { unmountRootfs(id_, state_dir_); });
    }

    // 3. The netns, holding only lo until a step below adds tun0 or the firewall's veth.
    step("netns", [&] { netns::create(ns); });
    netns_ = ns;
    undo_.emplace_back([this] { removeNetns(); });

    // Both egress modes hold the agent behind nano-init's exec gate (seed 002: the agent runs
    // "after the exec gate opens"): the container's first process is nano-init, which waits on
    // the gate (its fd 3) until the runner has made the boundary or armed the firewall. So
    // podman, whose own start-up (about 130 ms) is the long pole, starts first, and the egress
    // is made while it runs.
    gate_ = step("exec gate", [] { return ExecGate::make(); });
    std::vector<int> pass_fds = {gate_.remote()};
    std::future<std::unique_ptr<firewall::Egress>> arming;
    // Destroyed before `arming`, whose destructor joins the arming thread: however start()
    // leaves, that thread is let go on first (it waits in step 4 until podman is spawned).
    struct ReleaseOnExit {
      PodmanBackend* self;
      explicit ReleaseOnExit(PodmanBackend* backend) : self(backend) {}
      ReleaseOnExit(const ReleaseOnExit&) = delete;
      ReleaseOnExit& operator=(const ReleaseOnExit&) = delete;
      ~ReleaseOnExit() { self->releaseArming(); }
    } release_arming{this};
    std::vector<std::string> dns;
    std::vector<std::string> argv;
    std::vector<Mount> mounts;
    if (egress == Posture::kBoundary) {
      // 4. What the container mounts (read-only) at /run/sam: a directory of its own holding
      // sam-box's socket once sam-box makes it, and the mount point of nano-init. tun0 comes
      // through the gate when it opens.
      step("sam-box", [&] { makeBoundaryDir(spec.state_dir + "/" + kBoundaryDir); });
      dns = {vdns::kResolverAddress};  // nano-init refuses any other resolv.conf
      mounts = {{spec.state_dir + "/" + kBoundaryDir, kSandboxBoundaryDir, true},
                {nano_init_bin, kSandboxNanoInit, true}};
      argv = {kSandboxNanoInit, "run", "--gate-fd", "3", "--lifeline", kSandboxSocket};
    } else {
      // 4. The firewall (default drop), armed on its own thread while podman starts the
      // container: arming (about 25 ms of `ip` and `nft` runs) no longer adds to podman's own
      // start-up. The agent is executed only once arm() has returned, the ruleset loaded and
      // verified, and step 6 has written "armed" on the gate. Only the resolver addresses are
      // needed before podman starts (its --dns); the thread then waits until podman has been
      // spawned (releaseArming()), so that its own `ip` and `nft` starts do not delay podman's
      // exec on two cores (measured: podman exec'd 7 ms later without the wait).
      auto addressed = std::make_shared<std::promise<firewall::Addressing>>();
      std::future<firewall::Addressing> addresses = addressed->get_future();
      arming_go_ = std::make_shared<std::promise<void>>();
      arming = std::async(
          std::launch::async, [id = spec.id, ns, allow = spec.egress_allow, stop = spec.stop_signal,
                               addressed, go = arming_go_->get_future().share()] {
            bool told = false;
            try {
              return firewall::arm(id, ns, allow, stop, [&](const firewall::Addressing& a) {
                told = true;
                addressed->set_value(a);
                go.wait();
              });
            } catch (...) {
              if (!told) addressed->set_exception(std::current_exception());
              throw;
            }
          });
      // Registered before the container's own undo, so it runs after the container is gone.
      undo_.emplace_back([this] { teardownEgress(); });
      const firewall::Addressing a = step("firewall", [&] {
        try {
          return addresses.get();
        } catch (...) {
          awaitArming(arming);  // joined: what it made is torn down by the undo above
          throw;
        }
      });
      dns = {a.host4, a.host6};
      mounts = {{nano_init_bin, kSandboxNanoInit, true}};
      argv = {kSandboxNanoInit, "supervise", "--gate-fd", "3", "--lifeline", "--"};
    }
    argv.insert(argv.end(), spec.command.begin(), spec.command.end());

    // 5. The container, in the foreground: its exit status is the agent's.
    RunSpec run;
    run.name = container_;
    run.agent_id = spec.id;
    run.image = image_;
    run.rootfs = rootfs;
    run.netns_path = netns::pathOf(ns);
    run.id_base = ids.base;
    run.user = kAgentUser;
    run.pass_fds = static_cast<int>(pass_fds.size());
    run.dns = dns;
    run.mounts = mounts;
    run.resources = spec.resources;
    run.workdir = spec.workdir;
    run.pidfile = spec.state_dir + "/" + kPidFile;
    run.argv = argv;
    try {
      step("podman run", [&] { spawnContainer(run, pass_fds); });
      releaseArming();
      // 5b. egress `boundary`, while podman starts: sam-box, and tun0 configured from outside
      // (the container never holds CAP_NET_ADMIN); sam-box's socket is waited for last.
      std::exception_ptr boundary_failed;
      if (egress == Posture::kBoundary) {
        try {
          step("sam-box", [&] { spawnSamBox(spec, sam_box_bin, socket); });
          undo_.emplace_back([this] { sam_box_.stop(); });
          tun_ = step("tun0", [&] {
            common::UniqueFd fd = netns::openTun(ns);
            netns::configureTun(ns);
            return fd;
          });
          step("sam-box", [&] { awaitSamBox(socket, ids); });
        } catch (...) {
          boundary_failed = std::current_exception();
        }
      }
      // 6. The container's first process at its gate (nano-init says "ready", or podman's own
      // failure is reported): only then is a failure, a stop or the runner's death sure to
      // leave the agent unstarted and the container one podman knows (and removes), so a
      // boundary that failed above is reported only now. nano-init says it the moment it
      // runs, so the gate opens without a poll's delay.
      try {
        step("exec gate", [&] { awaitAtGate(run.pidfile); });
      } catch (const SpecRefused&) {
        throw;  // podman's refusal of the request (no such image) says what to fix first
      } catch (...) {
        if (!boundary_failed) throw;
      }
      if (boundary_failed) std::rethrow_exception(boundary_failed);
    } catch (...) {
      if (arming.valid()) awaitArming(arming);
      throw;
    }
    // Armed (or the start fails and the gate closes unopened: nano-init exits without starting
    // the agent, and the undos remove the container).
    if (arming.valid()) egress_ = step("firewall", [&] { return arming.get(); });
    // A stop asked for while the egress was made: the gate stays shut rather than start the
    // agent only to stop it.
    if (const int sig = spec.stop_signal ? spec.stop_signal() : 0; sig != 0) {
      throw StoppedBeforeStart(sig);
    }
    // sam-box made its socket, but may have died since (the agent would then run with every
    // flow refused): the gate opens only onto a boundary that still runs.
    if (egress == Posture::kBoundary) step("sam-box", [&] { sam_box_.requireRunning(); });
    sam_box_.watch();  // no-op without one
    step("exec gate", [&] {
      if (!gate_.open(tun_.get())) {
        throw RunnerError("the container's first process left its exec gate before it opened");
      }
    });
    tun_.reset();  // nano-init's copy is the one
    const pid_t agent_pid = step("podman run", [&] { return awaitContainer(run.pidfile); });
    started_ = true;
    if (stop_requested_) stop(std::chrono::seconds(2));
    return Started{agent_pid, spec.state_dir, metrics_addr_};
  }

  // After a failure elsewhere in the start: joins the arming thread; what it armed (if it
  // finished) goes to egress_, whose undo removes it after the container. Its own failure, if
  // any, is not the one reported.
  void awaitArming(std::future<std::unique_ptr<firewall::Egress>>& arming) noexcept {
    releaseArming();
    try {
      egress_ = arming.get();
    } catch (...) {
      // the caller's exception is the one reported
    }
  }

  // Lets the arming thread go on past the slot's addresses (see step 4); once only.
  void releaseArming() noexcept {
    if (arming_go_) {
      arming_go_->set_value();
      arming_go_.reset();
    }
  }

  // Until nano-init, the container's first process, says it waits at the gate. Throws
  // podman's failure (awaitContainer()) if podman exits or the gate closes first.
  void awaitAtGate(const std::string& pidfile) {
    const common::UniqueFd podman_exit = pidFd(podman_pid_);
    switch (gate_.awaitReady(podman_exit.get(), kContainerStartTimeout)) {
      case ExecGate::Ready::kReady:
        return;
      case ExecGate::Ready::kTimedOut:
        throw RunnerError("the container did not start within " +
                          std::to_string(kContainerStartTimeout.count()) + " s");
      case ExecGate::Ready::kLauncherExited:
      case ExecGate::Ready::kClosed:
        awaitContainer(pidfile);  // podman's own failure, if it had one, is the one reported
        throw RunnerError("the container's first process did not reach its exec gate");
    }
  }

  void spawnSamBox(const AgentSpec& spec, const std::string& bin, const std::string& socket) {
    const SamBoxOptions o = boundarySamBoxOptions(spec, bin, socket);
    metrics_addr_ = o.metrics_addr;
    sam_box_.spawn(o);
  }

  // <state>/sam, root's, 0755: what the container mounts read-only at /run/sam. sam-box makes
  // its socket there; the empty file is the mount point of nano-init (a read-only mount has no
  // room to make one).
  static void makeBoundaryDir(const std::string& dir) {
    if (::mkdir(dir.c_str(), 0755) != 0) {
      throw RunnerError("mkdir(" + dir + "): " + std::strerror(errno));
    }
    const std::string mount_point = dir + "/" + kNanoInitMountPoint;
    common::UniqueFd f(::open(mount_point.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0755));
    if (!f.valid()) throw RunnerError("open(" + mount_point + "): " + std::strerror(errno));
  }

  void awaitSamBox(const std::string& socket, const IdRange& ids) {
    sam_box_.waitReady(kSamBoxStartTimeout);
    // 0600 stays: only the host uid of this sandbox's agent user may connect, so no other
    // agent (each has its own range) can use this boundary.
    if (::chown(socket.c_str(), ids.agentHostId(), ids.agentHostId()) != 0) {
      throw RunnerError("chown(" + socket + ", " + std::to_string(ids.agentHostId()) +
                        "): " + std::strerror(errno));
    }
  }

  // Starts `podman run` in the background; awaitContainer() tells when the agent runs.
  void spawnContainer(const RunSpec& run, const std::vector<int>& pass_fds) {
    SpawnOptions s;
    s.argv = podmanArgv(runArgs(run));
    s.set_env = podmanEnv(conf_);
    s.pass_fds = pass_fds;
    // podman and conmon run in the agent's state dir, not the operator's current directory:
    // conmon drops an `oom` marker file in its working directory when the kernel OOM-kills the
    // agent, and that file belongs with the agent's state (removed at teardown).
    s.cwd = state_dir_;
    // stdin is /dev/null (no -i); stdout/stderr are the runner's. Own session: the operator's
    // Ctrl-C reaches the runner, which stops the container in order.
    s.new_session = true;
    // Behind the exec gate, podman outlives a killed runner: it finishes the start, nano-init
    // finds the gate closed and exits, and `gc` removes an exited container. Killed half-way
    // (between `runc create` and `runc start`), it would leave a runc container that podman no
    // longer knows and so `gc` cannot remove.
    s.die_with_parent = false;
    {
      std::lock_guard lock(stop_mutex_);
      podman_pid_ = spawn(s);
      running_ = true;
    }
    undo_.emplace_back([this] {
      removeContainer(conf_, container_);
      if (podman_pid_ > 0) {
        ::kill(podman_pid_, SIGKILL);
        waitExit(podman_pid_);
        podman_pid_ = -1;
      }
    });
    // The runner's copy of the gate's far end is not needed once podman holds it.
    gate_.releaseRemote();
  }

  // Until the container's first process runs (its pid, from `run.pidfile`), or podman exits
  // having failed (RunnerError; a missing image is a SpecRefused). Polls every 10 ms; the agent
  // does not wait for it (with egress `firewall` the gate is opened before).
  pid_t awaitContainer(const std::string& pidfile) {
    const auto deadline = Clock::now() + kContainerStartTimeout;
    while (true) {
      // The pidfile is written at `runc create`; the agent runs once `runc start` has made that
      // process exec the entry point, which renames it from "runc:[2:INIT]".
      if (const pid_t pid = readPid(pidfile); pid > 0 && !stillRuncInit(pid)) return pid;
      int status = 0;
      if (::waitpid(podman_pid_, &status, WNOHANG) == podman_pid_) {
        podman_pid_ = -1;
        if (const pid_t pid = readPid(pidfile); pid > 0) {
          exit_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
          return pid;
        }
        const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        // What podman's failure means for the request (podman_checks.h): asked only on this
        // failure path, so a start that succeeds never pays for another podman process.
        if (code == kPodmanError) refuseIfImageMissing(image_, default_image_);
        if (code == kPodmanCannotInvoke) refuseIfWorkdirMissing(image_, workdir_);
        throw RunnerError("podman could not start the container (exit " + std::to_string(code) +
                          "; podman's message is above)");
      }
      if (Clock::now() > deadline) {
        throw RunnerError("the container did not start within " +
                          std::to_string(kContainerStartTimeout.count()) + " s");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  static bool stillRuncInit(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/comm");
    std::string comm;
    return std::getline(in, comm) && comm.rfind("runc:", 0) == 0;
  }

  static pid_t readPid(const std::string& path) {
    std::ifstream in(path);
    long pid = 0;
    if (in >> pid && pid > 0) return static_cast<pid_t>(pid);
    return -1;
  }

  void runUndos() noexcept { undoNewestFirst(undo_); }

  // After the agent: container, boundary, firewall, netns, ids; each checked, so a leftover
  // is reported (gc removes it) instead of silently kept.
  void teardown() noexcept {
    {
      std::lock_guard lock(stop_mutex_);
      running_ = false;
    }
    // The container's removal (a whole podman start) runs beside the egress's own teardown,
    // which opens nothing to an agent still being killed: the firewall's removes the veth, the
    // netns's only way out, before any table that filters it, and without sam-box nano-init
    // has nowhere to relay to. What the container may still use (its rootfs overlay, its
    // host ids) goes only once it is gone.
    std::future<bool> removed;
    try {
      removed = std::async(std::launch::async, [conf = conf_, name = container_] {
        return removeContainer(conf, name);
      });
    } catch (const std::system_error&) {
      // no thread to spare: removed in turn below
    }
    sam_box_.stop();
    teardownEgress();
    tun_.reset();
    const bool gone = removed.valid() ? removed.get() : removeContainer(conf_, container_);
    if (!gone) {
      // Its host ids stay claimed (another agent must not get them while it may still run),
      // and its rootfs stays mounted: gc retries the whole removal.
      note("teardown: container " + container_ +
           " is still there; its host ids stay claimed until `compass-runner gc` removes it");
    } else if (!unmountRootfs(id_, state_dir_)) {
      note("teardown: the --rootfs overlay is still mounted");
    }
    removeNetns();
    if (gone) releaseIds(id_);
    undo_.clear();
    torn_down_ = true;
  }

  void teardownEgress() noexcept {
    if (egress_) {
      egress_->teardown();
      egress_.reset();
    }
  }

  void removeNetns() noexcept {
    if (netns_.empty()) return;
    if (!netns::remove(netns_)) {
      note("teardown: netns " + netns_ + " is still there (run `compass-runner gc`)");
    }
  }

  std::string id_;
  std::string state_dir_;
  std::string conf_;
  std::string image_;
  bool default_image_ = false;  // no --image: the refusal says how to build it
  std::string workdir_;         // --workdir with an image (refuseIfWorkdirMissing())
  std::string container_;
  std::string netns_;
  std::string metrics_addr_;
  common::UniqueFd tun_;
  ExecGate gate_;
  SamBoxProcess sam_box_;
  std::unique_ptr<firewall::Egress> egress_;
  std::shared_ptr<std::promise<void>> arming_go_;  // step 4: set once podman is spawned
  pid_t podman_pid_ = -1;
  int exit_status_ = -1;
  bool started_ = false;
  bool torn_down_ = false;
  std::vector<std::function<void()>> undo_;
  std::mutex stop_mutex_;
  bool running_ = false;
  std::atomic<bool> stop_requested_{false};
};

}  // namespace
}  // namespace podman

std::unique_ptr<Backend> makePodmanBackend() { return std::make_unique<podman::PodmanBackend>(); }

}  // namespace runner
