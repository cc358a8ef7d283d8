#pragma once
// The runner's end of a guest's control port (microvm_qemu.h, compass.control): a Unix socket
// the runner listens on and QEMU connects to. The guest's launch step (microvm_initramfs.h)
// writes one line per event — "boot" (stage 1 runs), "up" (nano-init is being started),
// "exit N" (the agent's status), "fail REASON" (the launch step gave up) — and reads "stop"
// (SIGTERM to the agent through nano-init). With egress `firewall` the guest also says "armed"
// (its ruleset is loaded and checked), and reads "allow SEQ BATCH" (nft commands,
// separated by
// ';') and answers "allowed SEQ STATUS" (microvm_egress.h).

#include <sys/types.h>

#include <chrono>
#include <mutex>
#include <optional>
#include <string>

#include "common/unique_fd.h"

namespace runner::microvm {

/// A line from the guest, or why none came.
struct ControlEvent {
  enum class Kind { kLine, kTimeout, kClosed, kProcessExited };
  Kind kind = Kind::kClosed;
  std::string line;  ///< kLine: without its '\n'
};

class ControlChannel {
 public:
  /// Binds and listens on `path` (mode 0600). Throws RunnerError.
  explicit ControlChannel(const std::string& path);
  ControlChannel(const ControlChannel&) = delete;
  ControlChannel& operator=(const ControlChannel&) = delete;

  /// Waits until QEMU (whose pidfd is `process`) connects, at most `timeout`. Returns false if
  /// the process exited first or time ran out.
  bool accept(int process, std::chrono::milliseconds timeout);

  /// The next line from the guest: waits at most `timeout` (forever when nullopt), and returns
  /// kProcessExited once pidfd `process` is readable (QEMU has exited) with no line pending.
  /// Lines longer than 4 KiB are cut.
  ControlEvent next(int process, std::optional<std::chrono::milliseconds> timeout);

  /// Writes "stop\n" to the guest (from any thread). False if the connection is gone.
  bool sendStop();

  /// Writes `line` and a '\n' to the guest (from any thread; lines never interleave), waiting
  /// at most kSendTimeout for room. False if the guest is not connected, does not take the line
  /// in time, or `line` holds a '\n' or is longer than kMaxSendLine bytes. A line cut short by
  /// the timeout is never completed by a later one: the runner's side of the stream is shut
  /// (the guest reads an unterminated fragment, then EOF) and every later send is false.
  bool sendLine(const std::string& line);

  /// How long sendLine() waits for a guest that is not reading its control port.
  static constexpr std::chrono::milliseconds kSendTimeout{2000};

  /// Longest line sendLine() writes (the guest's shell reads each line whole).
  static constexpr size_t kMaxSendLine = size_t{64} * 1024;

 private:
  common::UniqueFd listener_;
  std::mutex send_mu_;  // guards conn_'s assignment against senders on other threads
  common::UniqueFd conn_;
  bool send_broken_ = false;  // a line was cut short (guarded by send_mu_)
  std::string buffer_;
  bool eof_ = false;
};

/// pidfd_send_signal(2): signals the process behind `pidfd` (never a reused pid). Returns
/// false if it is already gone.
bool signalPidFd(int pidfd, int sig);

/// True if pidfd `pidfd` is readable within `timeout` (the process has exited).
bool waitPidFd(int pidfd, std::chrono::milliseconds timeout);

}  // namespace runner::microvm
