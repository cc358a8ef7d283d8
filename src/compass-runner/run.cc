#include "compass-runner/run.h"

#include <pthread.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "compass-runner/host_backend.h"
#include "compass-runner/state.h"
#include "compass-runner/state_roots.h"

namespace runner {
namespace {

void say(const std::string& line) {
  (void)std::fprintf(stderr, "compass-runner: %s\n", line.c_str());
}

int64_t nowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Receives SIGINT, SIGTERM and SIGHUP (blocked in every thread, so only sigwait() sees them)
// and stops the agent once it is started. A signal that comes during start() is kept and
// acted on as soon as start() returns, so no stop is lost and stop() never races start().
class SignalWatcher {
 public:
  explicit SignalWatcher(Backend& backend) : backend_(backend) {
    sigemptyset(&set_);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, kQuit}) sigaddset(&set_, sig);
    pthread_sigmask(SIG_BLOCK, &set_, &old_);
    thread_ = std::thread([this] { loop(); });
  }
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;
  ~SignalWatcher() {
    {
      std::lock_guard lock(mu_);
      quitting_ = true;
    }
    pthread_kill(thread_.native_handle(), kQuit);
    thread_.join();
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }

  /// The agent is running: a signal received so far stops it now (in this thread).
  void started() {
    int pending = 0;
    {
      std::lock_guard lock(mu_);
      started_ = true;
      pending = signal_;
    }
    if (pending != 0) backend_.stop(kStopGrace);
  }

  /// The first signal received, 0 if none.
  int signal() {
    std::lock_guard lock(mu_);
    return signal_;
  }

 private:
  static constexpr int kQuit = SIGUSR1;  // sent to the watcher thread only, by ~SignalWatcher

  void loop() {
    for (;;) {
      int sig = 0;
      if (sigwait(&set_, &sig) != 0) continue;
      bool started = false;
      {
        std::lock_guard lock(mu_);
        if (quitting_) return;
        if (sig == kQuit) continue;  // someone else's SIGUSR1: not ours to act on
        if (signal_ == 0) signal_ = sig;
        started = started_;
      }
      say(std::string("received SIG") + sigabbrev_np(sig) + ": stopping the agent (SIGKILL after " +
          std::to_string(kStopGrace.count()) + " s)");
      if (started) backend_.stop(kStopGrace);
    }
  }

  Backend& backend_;
  sigset_t set_{}, old_{};
  std::mutex mu_;
  bool started_ = false;
  bool quitting_ = false;
  int signal_ = 0;
  std::thread thread_;
};

void removeQuietly(const std::string& dir) {
  try {
    removeStateDir(dir);
  } catch (const std::exception& e) {
    say(std::string("warning: ") + e.what() + " (compass-runner gc retries)");
  }
}

}  // namespace

int runAgent(const RunOptions& opts) {
  std::unique_ptr<Backend> backend;
  AgentSpec spec = opts.spec;
  std::string root;  // the tier's state root, read from the environment once
  try {
    backend = selectBackend(opts.backend, std::getenv("COMPASS_RUNTIME_BACKEND"));
    root = stateRoot(std::string(backend->name()));
    // Before validate(), which may write there (podman's containers.conf). The host tier binds
    // no socket in its state dir (host_backend.h).
    checkStateRoot(root, backend->name() != "host");
    backend->validate(spec);
  } catch (const std::exception& e) {
    say(std::string("refusing to start: ") + e.what());
    return kExitUsage;
  }
  const std::string tier(backend->name());
  const Posture posture = backend->posture(spec);

  SignalWatcher watcher(*backend);
  AgentRecord rec;
  try {
    spec.id = newAgentId();
    spec.state_dir = createStateDir(root, spec.id);
    // Before anything host-wide is made: another root's gc must know this agent is not its
    // orphan (state_roots.h).
    if (tier != "host") registerStateRoot(root);
  } catch (const std::exception& e) {
    say(std::string("cannot start agent: ") + e.what());
    return kExitCannotStart;
  }
  // The host tier's root goes with the last agent in it (state.h), whichever way this ends.
  struct RootSweeper {
    std::string root;
    ~RootSweeper() {
      if (!root.empty()) removeStateRootIfEmpty(root);
    }
  } const sweeper{tier == "host" ? root : std::string()};
  // Said before the agent can run, and only when it is about to: a start refused for its
  // state directory warns about nothing.
  if (posture == Posture::kUnenforced) (void)std::fputs(host::unenforcedBanner().c_str(), stderr);
  rec.id = spec.id;
  rec.tier = tier;
  rec.posture = std::string(postureName(posture));
  rec.agent_id = spec.agent_id;
  rec.runner_pid = ::getpid();
  rec.runner_starttime = processStartTime(::getpid());
  rec.started_unix_ms = nowUnixMs();
  rec.state_dir = spec.state_dir;
  rec.command = spec.command;

  Started started;
  try {
    writeRecord(rec);  // preliminary: from here on gc can find what a killed runner leaves
    if (const int sig = watcher.signal(); sig != 0) {
      removeQuietly(spec.state_dir);
      say(std::string("stopped by SIG") + sigabbrev_np(sig) + " before the agent started");
      return 128 + sig;
    }
    spec.stop_signal = [&watcher] { return watcher.signal(); };
    started = backend->start(spec);
  } catch (const StoppedBeforeStart& e) {
    removeQuietly(spec.state_dir);
    say(std::string("stopped by SIG") + sigabbrev_np(e.signal()) + " before the agent started");
    return 128 + e.signal();
  } catch (const SpecRefused& e) {
    removeQuietly(spec.state_dir);
    say(std::string("refusing to start: ") + e.what());
    return kExitUsage;
  } catch (const std::exception& e) {
    removeQuietly(spec.state_dir);
    say(std::string("cannot start agent: ") + e.what());
    return kExitCannotStart;
  }
  rec.pid = started.pid;
  rec.metrics_addr = started.metrics_addr;
  try {
    backend->describe(rec);
    writeRecord(rec);
  } catch (const std::exception& e) {
    say(std::string("cannot record agent ") + rec.id + ": " + e.what() + "; stopping it");
    backend->stop(std::chrono::milliseconds(0));
    backend->wait();
    removeQuietly(spec.state_dir);
    return kExitCannotStart;
  }
  say("agent " + rec.id + " running (tier " + tier + ", egress " + rec.posture + ", pid " +
      std::to_string(rec.pid) + ")");
  watcher.started();
  int status = kExitCannotStart;
  try {
    status = backend->wait();
  } catch (const std::exception& e) {
    say(std::string("waiting for the agent failed: ") + e.what());
  }
  // agent.json first: the roster drops the agent at once, even if removing the rest is slow.
  ::unlink((spec.state_dir + "/agent.json").c_str());
  removeQuietly(spec.state_dir);
  return status;
}

}  // namespace runner
