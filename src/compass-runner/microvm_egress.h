#pragma once
// Egress `firewall` in the microvm tier (issue 5; seed 002 "microVM": "armed in-guest by the
// backend"): the runner's end of the guest's nftables sets. The DNS forwarder
// (dns_forwarder.h) opens each answered address before it replies; in a guest that means a
// round trip over the control port (microvm_control.h):
//
//   runner → guest   allow SEQ add element inet compass_egress allow4 { … }; add element …
//   guest → runner   allowed SEQ STATUS          (nft's exit status; 0 = in the sets)
//
// SEQ is a decimal counter, one per batch. The runner's thread that reads the control port
// (MicrovmBackend's boot and wait loops) hands each "allowed" line to onLine().

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "compass-runner/microvm_control.h"

namespace runner::microvm {

/// How long one batch may take in the guest before the forwarder gives up (SERVFAIL).
inline constexpr std::chrono::milliseconds kGuestApplyTimeout{10000};

class GuestRuleset {
 public:
  /// `control` must outlive this object (or close() be called first).
  explicit GuestRuleset(ControlChannel& control,
                        std::chrono::milliseconds timeout = kGuestApplyTimeout);
  GuestRuleset(const GuestRuleset&) = delete;
  GuestRuleset& operator=(const GuestRuleset&) = delete;

  /// firewall::ApplyFn: sends `batch` (nft commands, one per line) as one "allow" line and
  /// waits for its answer. True only for "allowed SEQ 0"; false for another status, a batch
  /// that cannot be sent, no answer within the timeout, or once close() was called. Any thread.
  bool apply(const std::string& batch);

  /// Takes one line the guest sent: true if it was an "allowed SEQ STATUS" answer (consumed,
  /// its waiter woken), false for any other line (the caller handles it). A malformed or
  /// unexpected "allowed" line is consumed and ignored.
  bool onLine(const std::string& line);

  /// Fails every waiting and later apply() at once (the guest is going away). Idempotent.
  void close();

 private:
  ControlChannel& control_;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t next_seq_ = 1;
  std::map<uint64_t, int> answers_;  // SEQ → status, for batches still awaited
  bool closed_ = false;
};

}  // namespace runner::microvm
