#pragma once
// The exec gate of `nano-init supervise --gate-fd N` and `nano-init run --gate-fd N` (seed 002:
// the agent is executed only once its egress is armed). The podman tier's `--egress firewall`
// arms the netns while podman starts the container, and opens this gate when the ruleset is
// verified; its `--egress boundary` opens it once sam-box serves, and passes the sandbox's tun0
// with the line (SCM_RIGHTS, unix(7)), which it configured while podman started.

#include <asio/io_context.hpp>
#include <asio/posix/stream_descriptor.hpp>

#include <functional>
#include <string_view>

#include "common/unique_fd.h"

namespace nanoinit {

/// What the launcher writes on the gate once egress is armed: exactly this line.
inline constexpr std::string_view kGateOpen = "armed\n";
/// What nano-init writes on the gate when it has reached it, if the gate is a stream socket
/// (on a pipe, nothing): the sandbox's first process runs and waits. A launcher that waits for
/// this line before it opens the gate knows that a stop, a failure or its own death until then
/// leaves the agent unstarted (the podman tier does).
inline constexpr std::string_view kGateReady = "ready\n";

/// Writes kGateReady on `fd` if it is a stream socket (send(2) with MSG_NOSIGNAL; a peer that
/// is gone is not an error here: the read below then finds the gate closed), then blocks until
/// the launcher writes kGateOpen on `fd` (a pipe or stream socket end), then closes `fd`, so
/// the agent never inherits it. Reads at most 64 bytes, up to the first '\n'; retries EINTR.
/// On a socket, one descriptor may come with the line (SCM_RIGHTS); it is returned (received
/// close-on-exec), else an invalid UniqueFd. Throws StepError("egress gate (fd N): <reason>")
/// if `fd` is below 3 or not open, if the launcher closes it without writing the line (it
/// failed to arm, or died), if it writes anything else, or if more than one descriptor
/// arrives (every one received is closed then); the caller must not start the agent then.
/// With `lifeline` non-null, the gate is not closed once it opened: it is made close-on-exec
/// (the agent still never inherits it) and moved to `*lifeline`, for a Lifeline.
common::UniqueFd awaitGate(int fd, common::UniqueFd* lifeline = nullptr);

/// `--lifeline`: once the agent runs, waits on the opened gate (a stream socket or pipe end)
/// on `io`, and calls `gone` once when the launcher's end closes (read(2) returns 0 or fails;
/// bytes that arrive are read and ignored). The launcher holds its end for the agent's
/// lifetime, so a launcher killed with SIGKILL takes the sandbox with it instead of leaving an
/// agent no one waits for. Owns the descriptor; destroy it before `io`.
class Lifeline {
 public:
  /// `fd`: the gate as awaitGate() left it in `*lifeline`. Starts waiting at once.
  Lifeline(asio::io_context& io, common::UniqueFd fd, std::function<void()> gone);

 private:
  void wait();

  asio::posix::stream_descriptor fd_;
  std::function<void()> gone_;
};

}  // namespace nanoinit
