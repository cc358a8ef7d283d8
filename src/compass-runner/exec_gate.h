#pragma once
// The runner's side of nano-init's exec gate (src/nano-init/gate.h; seed 002: the agent is
// executed only "after the exec gate opens", once its egress is armed). Used by the podman
// tier in both egress modes: with `firewall` the container's first process is `nano-init
// supervise --gate-fd 3 --lifeline`, and the runner opens the gate once the netns's ruleset is
// loaded and verified; with `boundary` it is `nano-init run --gate-fd 3 --lifeline`, and the
// runner opens the gate, passing tun0 with the line, once sam-box serves and tun0 is
// configured. The runner then keeps its end open until the agent has ended (the lifeline).

#include <sys/types.h>

#include <chrono>
#include <utility>

#include "common/unique_fd.h"

namespace runner {

/// A socketpair: remote() becomes the container's fd 3, the other end stays with the runner.
/// Both ends are close-on-exec, so no other child of the runner (nft, podman, conmon) holds
/// the runner's end: if the runner dies, or fails to arm and destroys this, the gate closes
/// unopened and nano-init exits without starting the agent. Once opened, the runner's end
/// stays open as the sandbox's lifeline (nano-init's `--lifeline`, src/nano-init/gate.h):
/// when it closes (shut(), this destroyed, or the runner killed), nano-init stops the agent.
class ExecGate {
 public:
  /// What awaitReady() saw.
  enum class Ready {
    kReady,           ///< nano-init said kGateReady: it runs and waits at the gate
    kLauncherExited,  ///< `launcher` (podman) exited first
    kClosed,          ///< the far end closed, or sent something other than kGateReady
    kTimedOut,        ///< nothing within the timeout
  };

  /// No gate: remote() is -1, pending() false.
  ExecGate() = default;
  /// Makes the socketpair. Throws RunnerError if socketpair(2) fails.
  static ExecGate make();

  /// The end to pass to the container (as fd 3); -1 once released.
  [[nodiscard]] int remote() const { return remote_.get(); }
  /// Closes the runner's copy of the remote end (once the launcher holds its own).
  void releaseRemote() { remote_.reset(); }
  /// True from make() until open() or shut().
  [[nodiscard]] bool pending() const { return local_.valid() && !opened_; }
  /// True from a successful open() until shut(): the lifeline is held.
  [[nodiscard]] bool holdsLifeline() const { return local_.valid() && opened_; }

  /// Waits until nano-init writes kGateReady on the gate, the process behind `launcher` (a
  /// pidfd, pidfd_open(2)) exits, the gate closes, or `timeout` passes. Throws RunnerError if
  /// poll(2) or recv(2) fails otherwise.
  Ready awaitReady(int launcher, std::chrono::milliseconds timeout);
  /// Writes kGateOpen and keeps the runner's end as the lifeline: nano-init executes the
  /// agent (and, with `--lifeline`, stops it once that end closes). With
  /// `passed_fd` ≥ 0, that descriptor goes with the line (SCM_RIGHTS, unix(7); the caller keeps
  /// its own copy): `nano-init run --gate-fd` adopts it as tun0. False if the far end was gone
  /// before the line could be written (the end is closed then). Never throws.
  bool open(int passed_fd = -1) noexcept;
  /// Closes the runner's end: unopened, nano-init exits 70 without starting the agent;
  /// opened, nano-init `--lifeline` stops the sandbox (SIGTERM, grace, SIGKILL).
  void shut() noexcept { local_.reset(); }

 private:
  ExecGate(common::UniqueFd local, common::UniqueFd remote)
      : local_(std::move(local)), remote_(std::move(remote)) {}

  common::UniqueFd local_;
  common::UniqueFd remote_;
  bool opened_ = false;
};

}  // namespace runner
