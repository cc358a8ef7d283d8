#pragma once
// PID 1 duties (issue 3): reap every orphan, forward signals to the child, and when the child
// exits, signal everything left in the sandbox (including setsid'd processes), wait a grace
// period, kill the rest, and report the child's status (128+N for a signal). When nano-init is
// not PID 1 it becomes a child subreaper, so orphans still come to it.

#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/types.h>
#include <asio/io_context.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/steady_timer.hpp>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace nanoinit {

/// SIGCHLD and kForwardedSignals: what nano-init handles itself (Supervisor, the PID
/// namespace's parent).
sigset_t handledSignals();

/// Blocks handledSignals(), first thing in `run` and `supervise`: a stop asked
/// for while the sandbox is set up stays pending (PID 1 would drop it, having no handler yet)
/// and the Supervisor acts on it once the agent runs. Throws StepError.
void blockHandledSignals();

/// Signals forwarded to the child, as the issue lists them.
inline constexpr int kForwardedSignals[] = {SIGTERM, SIGINT,  SIGHUP,  SIGQUIT,
                                            SIGUSR1, SIGUSR2, SIGWINCH};
/// After the child exits: SIGTERM to the rest, then SIGKILL after this long.
inline constexpr std::chrono::milliseconds kGracePeriod{2000};

class Supervisor {
 public:
  /// Blocks SIGCHLD and the forwarded signals (read through a signalfd on `io`) and, when
  /// not PID 1, sets PR_SET_CHILD_SUBREAPER. Call before anything forks. Also raises
  /// nano-init's own RLIMIT_NOFILE towards kFlowDescriptors (a flow holds one descriptor, two
  /// over HTTP/2; containers and the guest start it at 1024, which ran out near 500 flows),
  /// the hard limit too where it may (root in a microVM guest); spawn() gives the agent the
  /// limit nano-init found.
  explicit Supervisor(asio::io_context& io, std::chrono::milliseconds grace = kGracePeriod);
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  /// Forks and execs `argv` (PATH search). `in_child` runs in the child after fork and
  /// before exec (capability drop); if it throws, the child prints why and exits 126. Exec
  /// failure exits 127. Returns the child's pid.
  pid_t spawn(const std::vector<std::string>& argv, const std::function<void()>& in_child);

  /// Starts serving; `done(exit_code)` is called once the child has exited and everything
  /// else is gone.
  void start(std::function<void(int)> done);

  /// Ends the sandbox without waiting for the child to exit first: what follows the child's
  /// exit (SIGTERM and SIGCONT to every process, the child included, SIGKILL to what is left
  /// after the grace period), then `done` with the child's status (143 if SIGTERM ended it).
  /// For a launcher that is gone (gate.h, Lifeline). Nothing more once shutting down.
  void stopAll() { beginShutdown(); }

  /// 0..255 for exit(N), 128+N for a signal.
  static int exitCodeOf(int wait_status);

  [[nodiscard]] bool isPid1() const { return pid1_; }

 private:
  void readSignal();
  void onSignal(const signalfd_siginfo& info);
  void reap();
  void beginShutdown();
  void armKill(std::chrono::milliseconds after);
  void signalEveryoneElse(int sig);
  void finishIfEmpty();

  asio::io_context& io_;
  std::chrono::milliseconds grace_;
  bool pid1_;
  sigset_t old_mask_{};
  rlimit agent_nofile_{};  // RLIMIT_NOFILE as nano-init found it: the agent gets it back
  asio::posix::stream_descriptor signals_;
  asio::steady_timer grace_timer_;
  signalfd_siginfo info_{};
  pid_t child_ = -1;
  int child_exit_code_ = -1;
  bool shutting_down_ = false;
  bool finished_ = false;
  std::function<void(int)> done_;
};

}  // namespace nanoinit
