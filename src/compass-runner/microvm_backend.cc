// The microVM tier (microvm_backend.h). start() is one ordered list of named steps; each step
// that makes something pushes its undo, and a failure runs the undos in reverse and throws
// RunnerError naming the step (fail closed).
#include "compass-runner/microvm_backend.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>

#include "common/socket_path.h"
#include "compass-runner/backend.h"
#include "compass-runner/firewall.h"
#include "compass-runner/image.h"
#include "compass-runner/microvm_cache.h"
#include "compass-runner/microvm_control.h"
#include "compass-runner/microvm_egress.h"
#include "compass-runner/microvm_initramfs.h"
#include "compass-runner/microvm_qemu.h"
#include "compass-runner/microvm_reap.h"
#include "compass-runner/microvm_rootfs.h"
#include "compass-runner/netns.h"
#include "compass-runner/podman_backend.h"
#include "compass-runner/podman_conf.h"
#include "compass-runner/process.h"
#include "compass-runner/sam_box_process.h"
#include "compass-runner/state.h"

namespace runner {
namespace microvm {
namespace {

Accel accelOf(const AgentSpec& spec) {
  const auto a = parseAccel(spec.accel);
  if (!a) throw RunnerError("--accel \"" + spec.accel + "\": expected kvm or tcg");
  return *a;
}

uint64_t memoryMiB(const AgentSpec& spec) {
  if (!spec.resources.memory_bytes) return kDefaultMemoryMiB;
  return (*spec.resources.memory_bytes + (uint64_t{1} << 20) - 1) >> 20;
}

class MicrovmBackend final : public Backend {
 public:
  ~MicrovmBackend() override {
    if (started_ && !torn_down_) teardown();
  }

  [[nodiscard]] std::string_view name() const override { return "microvm"; }

  [[nodiscard]] Posture posture(const AgentSpec& spec) const override {
    return spec.egress.value_or(Posture::kBoundary) == Posture::kFirewall ? Posture::kFirewall
                                                                          : Posture::kBoundary;
  }

  void validate(const AgentSpec& spec) const override {
    if (::geteuid() != 0) {
      throw RunnerError(
          "the microvm tier needs root (it mounts the image to build the guest's root file "
          "system and runs QEMU with /dev/kvm); the agent itself runs as uid 1000 in the guest");
    }
    if (spec.command.empty()) throw RunnerError("no command to run");
    if (posture(spec) == Posture::kFirewall && !spec.sidecar_socket.empty()) {
      throw RunnerError(
          "--sidecar-socket: egress firewall has no boundary to reach the node through "
          "(mesh.sam.alt is served by sam-box); use --egress boundary (the default)");
    }
    if (memoryMiB(spec) < kMinMemoryMiB) {
      throw RunnerError("--memory: a microVM guest needs at least " +
                        std::to_string(kMinMemoryMiB) + " MiB (its kernel and scratch tmpfs)");
    }
    validateSidecar(spec);
    if (!spec.rootfs.empty()) {
      struct stat st {};
      if (::stat(spec.rootfs.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
        throw RunnerError("--rootfs " + spec.rootfs + ": not a directory");
      }
    }
    const Accel accel = accelOf(spec);
    bootTimeout(accel);  // a malformed COMPASS_MICROVM_BOOT_TIMEOUT is refused now
    if (accel == Accel::kKvm) {
      const KvmProbe kvm = probeKvm(kvmDevice());
      if (!kvm.usable) {
        throw RunnerError("the microvm tier needs KVM and " + kvm.reason +
                          ". It never falls back to software emulation by itself: run with "
                          "--accel tcg to emulate (slow, for tests), or use --backend podman");
      }
    }
    findGuestKernel();
    findBusybox();
    findQemu();
    cacheDirSetting();  // a relative COMPASS_MICROVM_CACHE is refused before anything is built
  }

  Started start(const AgentSpec& spec) override {
    try {
      return startSteps(spec);
    } catch (...) {
      runUndos();
      throw;
    }
  }

  void describe(AgentRecord& rec) const override {
    rec.sam_box_pid = sam_box_.pid();
    rec.metrics_addr = metrics_addr_;
    if (egress_) {
      rec.netns = netns_;
      rec.veth = egress_->hostVeth();
      rec.egress_armed_in_guest = armed_in_guest_;
    }
  }

  int wait() override {
    int status = -1;
    bool reported = false;
    while (!reported) {
      const ControlEvent e = control_->next(qemu_fd_.get(), std::nullopt);
      if (e.kind != ControlEvent::Kind::kLine) break;
      if (guest_ruleset_ && guest_ruleset_->onLine(e.line)) continue;
      if (e.line.rfind("exit ", 0) == 0) {
        try {
          status = std::stoi(e.line.substr(5));
          reported = status >= 0 && status <= 255;
        } catch (const std::exception&) {
          status = -1;
        }
      } else if (e.line.rfind("fail ", 0) == 0) {
        note("microvm guest: " + e.line.substr(5));
      }
    }
    // The guest powers itself off once it has reported; a guest that does not is ended.
    if (!waitPidFd(qemu_fd_.get(), kPowerOffTimeout)) {
      if (reported) note("the guest did not power off after the agent ended; stopping QEMU");
      signalPidFd(qemu_fd_.get(), SIGKILL);
    }
    const int qemu_status = waitExit(qemu_pid_);
    qemu_pid_ = -1;
    if (!reported) {
      status = killed_ ? 128 + SIGKILL : kExitCannotStartStatus;
      if (!killed_) {
        note("the guest ended without reporting the agent's status (QEMU status " +
             std::to_string(qemu_status) + "; QEMU's own message, if any, is above); " +
             consoleExcerpt(state_dir_ + "/" + kConsoleLog));
      }
    }
    if (status == 128 + SIGKILL && !killed_ && consoleSaysOutOfMemory()) {
      note("the guest ran out of memory and its kernel killed the agent (--memory " +
           std::to_string(memory_mib_) +
           " MiB; the agent's writes to its scratch root and /dev/shm are RAM too)");
    }
    teardown();
    return status;
  }

  // The guest kernel's OOM killer says so on the console (before the state dir goes).
  [[nodiscard]] bool consoleSaysOutOfMemory() const {
    std::ifstream in(state_dir_ + "/" + kConsoleLog);
    for (std::string line; std::getline(in, line);) {
      if (line.find("Out of memory: Killed process") != std::string::npos) return true;
    }
    return false;
  }

  void stop(std::chrono::milliseconds grace) override {
    stop_requested_ = true;
    std::lock_guard lock(stop_mutex_);
    if (!running_) return;
    // SIGTERM to the agent through nano-init (stage 2 reads "stop"); QEMU ends after grace.
    control_->sendStop();
    if (!waitPidFd(qemu_fd_.get(), grace)) {
      killed_ = true;
      signalPidFd(qemu_fd_.get(), SIGKILL);
    }
  }

  void resize(const AgentRecord& rec, const Resources& r) override {
    (void)r;
    (void)rec;
    throw RunnerError(
        "the microvm tier cannot change a running guest's limits: a VM's memory "
        "and vCPUs are fixed when it boots (no balloon or hotplug is wired). Start "
        "the agent again with the --memory/--cpus/--pids you want");
  }

  void reap(const AgentRecord& rec) override {
    reapAgent(rec.id, rec.state_dir, rec.sam_box_pid);
    if (!rec.netns.empty() || rec.posture == postureName(Posture::kFirewall)) {
      firewall::reap(rec.id);
      const std::string ns = rec.netns.empty() ? netns::nameFor(rec.id) : rec.netns;
      if (!netns::remove(ns)) note("gc: could not remove netns " + ns);
    }
  }

  void reapOrphans(const std::vector<std::string>& live_ids) override {
    reapOrphanGuests(stateRoot("microvm"), live_ids);
    // What a runner killed while building a root image left in the cache: its temporary, and
    // its `podman image mount` (undone only while no build holds rootfs.lock).
    const std::string cache = cacheDirSetting();
    const ImageUnmount unmount = [](const std::string& image_id) {
      try {
        const std::string conf = podman::containersConfPath();
        podman::writeContainersConf(conf);
        return podmanUnmount(conf)(image_id);
      } catch (const std::exception& e) {
        return std::string(e.what());
      }
    };
    reapCacheLeftovers(cache, unmount);
  }

 private:
  static constexpr int kExitCannotStartStatus = 70;
  static constexpr const char* kTapName = "tap0";

  static void validateSidecar(const AgentSpec& spec) {
    if (spec.sidecar_socket.empty()) return;
    if (!common::isSocket(spec.sidecar_socket)) {
      throw RunnerError("--sidecar-socket " + spec.sidecar_socket +
                        ": not a Unix socket that exists (start the node first: sam-node run "
                        "--socket-path " +
                        spec.sidecar_socket + " --config FILE)");
    }
    if (spec.bundle_path.empty()) {
      throw RunnerError(
          "--sidecar-socket needs --bundle: without an agent identity the boundary refuses "
          "mesh.sam.alt (no-agent-identity), so the node could never be reached");
    }
  }

  Started startSteps(const AgentSpec& spec) {
    state_dir_ = spec.state_dir;
    const std::string socket = spec.state_dir + "/" + kSocketFile;
    QemuConfig q;
    GuestKernel kernel;
    std::string sam_box_bin, nano_init_bin, busybox, cache;
    const bool firewall = posture(spec) == Posture::kFirewall;

    step("preflight", [&] {
      validate(spec);
      accel_ = accelOf(spec);
      boot_timeout_ = bootTimeout(accel_);
      checkAll({[&] { kernel = findGuestKernel(); }, [&] { busybox = findBusybox(); },
                [&] { sam_box_bin = findSamBox(); },
                [&] { nano_init_bin = podman::findNanoInit(); }, [&] { q.qemu = findQemu(); },
                [&] {
                  if (firewall) findProgram("nft");
                },
                [&] {
                  if (firewall) findProgram("ip");  // netns, bridge
                }});
      cache = cacheDir();
    });

    std::string fw_layer;
    if (firewall) {
      // The netns and its bridge to the guest's tap, the host table and the DNS forwarder; the
      // guest arms the ruleset itself (stage 1), before its agent exists.
      netns_ = netns::nameFor(spec.id);
      step("netns", [&] { netns::create(netns_); });
      undo_.emplace_back([this] {
        if (!netns::remove(netns_)) note("could not remove netns " + netns_);
      });
      step("firewall layer", [&] { fw_layer = firewallLayer(kernel, "nft", cache); });
      step("control socket", [&] {
        control_ = std::make_unique<ControlChannel>(spec.state_dir + "/" + kControlFile);
      });
      guest_ruleset_ = std::make_unique<GuestRuleset>(*control_);
      step("egress firewall", [&] {
        egress_ = firewall::armForGuest(
            spec.id, netns_, spec.egress_allow, kTapName,
            [this](const std::string& batch) {
              if (guest_exists_) return guest_ruleset_->apply(batch);
              initial_elements_ += batch;  // pre-resolve; one load at a time (admitter.h)
              return true;
            },
            spec.stop_signal);
      });
      undo_.emplace_back([this] { egress_->teardown(); });
    } else {
      // The boundary first: it starts while the root image and initramfs are prepared.
      step("sam-box", [&] { spawnSamBox(spec, sam_box_bin, socket); });
      undo_.emplace_back([this] { sam_box_.stop(); });
    }

    step("root image", [&] {
      if (!spec.rootfs.empty()) {
        q.root_image = spec.state_dir + "/" + kRootfsFile;
        dirRootfs(spec.rootfs, q.root_image);
      } else {
        const std::string conf = podman::containersConfPath();
        podman::writeContainersConf(conf);
        const std::string image = spec.image.empty() ? image::kDefaultImage : spec.image;
        q.root_image = imageRootfs(image, spec.image.empty(), conf, cache);
      }
    });

    step("initramfs", [&] {
      GuestAgent agent;
      agent.uid = kAgentUid;
      agent.gid = kAgentGid;
      agent.workdir = spec.workdir.empty() ? "/" : spec.workdir;
      agent.pids = spec.resources.pids;
      agent.command = spec.command;
      if (firewall) agent.firewall = guestFirewall();
      q.initrd = spec.state_dir + "/" + kInitrdFile;
      std::vector<std::string> layers;
      if (!fw_layer.empty()) layers.push_back(fw_layer);
      writeAgentInitramfs(baseInitramfs(kernel, nano_init_bin, busybox, cache), layers, agent,
                          q.initrd);
    });

    if (!firewall) {
      step("sam-box", [&] { sam_box_.waitReady(kSamBoxStartTimeout); });
      sam_box_.watch();
    }

    q.accel = accel_;
    q.kernel = kernel.vmlinuz;
    q.memory_mib = memoryMiB(spec);
    memory_mib_ = q.memory_mib;
    q.cpus = spec.resources.cpus ? static_cast<int>(std::ceil(*spec.resources.cpus)) : 1;
    if (spec.resources.cpus && std::floor(*spec.resources.cpus) != *spec.resources.cpus) {
      char asked[32];
      static_cast<void>(std::snprintf(asked, sizeof asked, "%g", *spec.resources.cpus));
      note(std::string("microvm: a guest has whole vCPUs: --cpus ") + asked + " gives it " +
           std::to_string(q.cpus));
    }
    q.console_log = spec.state_dir + "/" + kConsoleLog;
    q.control_socket = spec.state_dir + "/" + kControlFile;
    if (firewall) {
      q.tap = kTapName;
    } else {
      q.boundary_socket = socket;
    }
    q.pidfile = spec.state_dir + "/" + kPidFile;

    if (!control_) {
      step("control socket",
           [&] { control_ = std::make_unique<ControlChannel>(q.control_socket); });
    }
    // Said once the request was accepted: not above a refusal of it.
    if (accel_ == Accel::kTcg) {
      note("microvm: --accel tcg: the guest runs under software emulation (slow; meant for tests)");
    }
    guest_exists_ = true;
    step("qemu", [&] { spawnQemu(q, firewall ? netns::pathOf(netns_) : ""); });
    writeInfo(q);
    step("guest boot", [&] { awaitGuest(); });
    started_ = true;
    if (stop_requested_) stop(std::chrono::seconds(2));
    return Started{qemu_pid_, spec.state_dir, metrics_addr_};
  }

  void spawnSamBox(const AgentSpec& spec, const std::string& bin, const std::string& socket) {
    const SamBoxOptions o = boundarySamBoxOptions(spec, bin, socket);
    metrics_addr_ = o.metrics_addr;
    sam_box_.spawn(o);
  }

  // What stage 1 arms and stage 2 uses (microvm_initramfs.h GuestFirewall).
  GuestFirewall guestFirewall() {
    const firewall::Addressing& net = egress_->addressing();
    GuestFirewall fw;
    // The pre-resolved elements in the same batch: loaded with the ruleset, atomically.
    fw.ruleset = firewall::sandboxRuleset(net, {}) + initial_elements_;
    fw.address4 = net.sandbox4 + "/30";
    fw.address6 = net.sandbox6 + "/64";
    fw.gateway4 = net.host4;
    fw.gateway6 = net.host6;
    return fw;
  }

  // QEMU runs in `netns_path` when given (egress firewall: its tap is there).
  void spawnQemu(const QemuConfig& q, const std::string& netns_path) {
    // The agent's stdout and stderr: the runner's own descriptors, passed as fd 3 and 4.
    SpawnOptions s;
    QemuConfig cfg = q;
    for (int fd : {1, 2}) {
      bool pass = false;
      const int set = fd;
      (fd == 1 ? cfg.stdout_path : cfg.stderr_path) = stdioTarget(fd, set, &pass);
      if (pass) {
        cfg.add_fds.emplace_back(3 + static_cast<int>(s.pass_fds.size()), set);
        s.pass_fds.push_back(fd);
      }
    }
    s.argv = qemuArgv(cfg);
    s.cwd = state_dir_;
    s.netns_path = netns_path;
    // stdout/stderr are the runner's: QEMU's own messages, and the agent's ports
    // (/proc/self/fd/1 and 2 in QEMU). Its own session: Ctrl-C reaches the runner only.
    s.new_session = true;
    s.die_with_parent = true;  // a killed runner leaves no guest running
    {
      std::lock_guard lock(stop_mutex_);
      qemu_pid_ = spawn(s);
      qemu_fd_ = pidFd(qemu_pid_);
      running_ = true;
    }
    undo_.emplace_back([this] { killQemu(); });
  }

  // The guest's first line within the boot timeout ("boot"), then "up". A KVM guest that
  // says nothing is the KVM that cannot run it (DESIGN.md: kvm_pvm hangs stock kernels).
  void awaitGuest() {
    const std::string console = state_dir_ + "/" + kConsoleLog;
    const auto deadline = std::chrono::steady_clock::now() + boot_timeout_;
    auto left = [&] {
      return std::max(std::chrono::milliseconds(0),
                      std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now()));
    };
    if (!control_->accept(qemu_fd_.get(),
                          std::min(left(), std::chrono::milliseconds(kConnectTimeout)))) {
      throw RunnerError(
          "QEMU exited or did not connect to its control socket (its message is "
          "above)");
    }
    bool booted = false;
    while (true) {
      const ControlEvent e = control_->next(qemu_fd_.get(), left());
      if (e.kind == ControlEvent::Kind::kLine) {
        if (guest_ruleset_ && guest_ruleset_->onLine(e.line)) continue;
        if (e.line == "boot") booted = true;
        if (e.line == "armed" && egress_) {
          armed_in_guest_ = true;
          const firewall::Addressing& net = egress_->addressing();
          note("microvm: egress firewall armed in the guest (table inet " +
               std::string(firewall::kEgressTable) + ", default drop; resolver " + net.host4 +
               " and " + net.host6 + " on " + egress_->hostVeth() + ")");
        }
        if (e.line == "up") {
          // Fail closed: with egress firewall the agent starts only behind an armed ruleset.
          if (egress_ && !armed_in_guest_) {
            throw RunnerError("the guest started without arming its egress ruleset");
          }
          return;
        }
        if (e.line.rfind("fail ", 0) == 0) {
          // The state dir goes with the failed start: quote the console, not its path.
          throw RunnerError("the guest's launch step failed: " + e.line.substr(5) + "; " +
                            consoleExcerpt(console));
        }
        continue;
      }
      if (!booted && accel_ == Accel::kKvm) {
        const std::string why =
            e.kind == ControlEvent::Kind::kTimeout
                ? "it showed no sign of life within " + std::to_string(boot_timeout_.count()) + " s"
                : "QEMU ended before the guest showed any sign of life (its message is above)";
        throw RunnerError("KVM is present (" + kvmDevice() +
                          " opens) but cannot run the guest: " + why +
                          " (a paravirtual or nested KVM, such as kvm_pvm, cannot run stock guest "
                          "kernels). Run with --accel tcg to emulate (slow, for tests), or use "
                          "--backend podman");
      }
      if (e.kind == ControlEvent::Kind::kTimeout) {
        throw RunnerError(
            "the guest did not start the agent within " + std::to_string(boot_timeout_.count()) +
            " s (" + std::string(accelName(accel_)) +
            "; set COMPASS_MICROVM_BOOT_TIMEOUT for a slower host); " + consoleExcerpt(console));
      }
      // The state dir, console.log with it, is gone when the operator reads this: quote it.
      throw RunnerError(
          "QEMU ended before the guest started the agent (QEMU's own message, if any, is "
          "above); " +
          consoleExcerpt(console));
    }
  }

  void writeInfo(const QemuConfig& q) const {
    const nlohmann::json j = {{"accel", std::string(accelName(q.accel))},
                              {"qemu_pid", qemu_pid_},
                              {"memory_mib", q.memory_mib},
                              {"cpus", q.cpus},
                              {"kernel", q.kernel},
                              {"root_image", q.root_image}};
    std::ofstream(state_dir_ + "/" + kInfoFile) << j.dump(2) << "\n";
  }

  void runUndos() noexcept {
    if (guest_ruleset_) guest_ruleset_->close();  // no forwarder thread waits on a dead guest
    undoNewestFirst(undo_);
  }

  // Marks the guest as not running (stop() then does nothing) and kills and reaps QEMU.
  void killQemu() noexcept {
    {
      std::lock_guard lock(stop_mutex_);
      running_ = false;
    }
    if (qemu_pid_ > 0) {
      signalPidFd(qemu_fd_.get(), SIGKILL);
      waitExit(qemu_pid_);
      qemu_pid_ = -1;
    }
  }

  void teardown() noexcept {
    if (guest_ruleset_) guest_ruleset_->close();
    killQemu();
    sam_box_.stop();
    if (egress_) egress_->teardown();
    if (!netns_.empty() && !netns::remove(netns_)) note("could not remove netns " + netns_);
    undo_.clear();
    torn_down_ = true;
  }

  std::string state_dir_;
  std::string metrics_addr_;
  Accel accel_ = Accel::kKvm;
  std::chrono::seconds boot_timeout_{30};
  uint64_t memory_mib_ = 0;  ///< the guest's RAM (-m), for the out-of-memory note
  SamBoxProcess sam_box_;
  std::unique_ptr<ControlChannel> control_;
  std::unique_ptr<GuestRuleset> guest_ruleset_;  ///< egress firewall: the guest's sets
  std::unique_ptr<firewall::Egress> egress_;     ///< egress firewall: veth, host table, forwarder
  std::string netns_;                            ///< egress firewall: QEMU's netns
  bool armed_in_guest_ = false;                  ///< the guest said "armed"
  /// egress firewall: `add element` batches the forwarder made before the guest existed
  /// (armForGuest()'s pre-resolve); they go into the ruleset the guest loads.
  std::string initial_elements_;
  std::atomic<bool> guest_exists_{false};  ///< set before QEMU starts: batches go to the guest
  pid_t qemu_pid_ = -1;
  common::UniqueFd qemu_fd_;
  bool started_ = false;
  bool torn_down_ = false;
  std::vector<std::function<void()>> undo_;
  std::mutex stop_mutex_;
  bool running_ = false;
  std::atomic<bool> killed_{false};
  std::atomic<bool> stop_requested_{false};
};

}  // namespace
}  // namespace microvm

std::string microvm::consoleExcerpt(const std::string& console_log) {
  const std::string tail = tailOfFile(console_log);
  if (tail.find_first_not_of(" \t\r\n") == std::string::npos) {
    return "the guest printed nothing on its console";
  }
  return "the end of the guest's console:\n" + tail;
}

std::unique_ptr<Backend> makeMicrovmBackend() {
  return std::make_unique<microvm::MicrovmBackend>();
}

}  // namespace runner
