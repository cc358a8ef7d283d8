#pragma once
// The egress firewall's admitter (issue 4, seeds 000/002): every address the sandbox's DNS
// forwarder answers goes into the allow sets through admit() before the reply leaves. Loading
// elements costs one `nft` run (about 3 ms of a process start on a small VM), so admit()
// calls that arrive while a load runs are committed together by the next one (a group
// commit): a burst of answers, such as the pre-resolve of a long allowlist, costs a few loads
// instead of one per answer. Nothing is answered before its elements are in the sets.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "compass-runner/ruleset.h"

namespace runner::firewall {

/// Puts `elements` into every copy of the allow sets; true once all hold them, false if any
/// copy could not take them (the caller has logged why). Called on one thread at a time.
using AddFn = std::function<bool(const std::vector<AllowElement>& elements)>;

/// Adds answered addresses to a sandbox's allow sets through an AddFn, at most
/// kMaxSetElements of them (ruleset.h). Thread-safe.
class Admitter {
 public:
  /// `id`: the agent's id, for log lines. `add`: loads a batch (see AddFn).
  Admitter(std::string id, AddFn add);

  /// Returns once every element of `elements` is in the sets: true, or false if they could
  /// not all be added — the sets would pass kMaxSetElements (reason `set-full`, logged at
  /// most once a second) or the load of the batch they joined failed (`admit-failed`; every
  /// caller in that batch gets false). Elements already added cost nothing; new ones from
  /// callers that arrive while a load runs are loaded together by one AddFn call, on the
  /// thread of one of those callers.
  bool admit(const std::vector<AllowElement>& elements);

  /// Loads (AddFn calls) so far; for tests.
  uint64_t loads() const;
  /// Elements waiting for the next load (their callers are blocked in admit()); for tests.
  size_t pendingElements() const;

 private:
  using Key = std::pair<asio::ip::address, uint16_t>;  ///< port 0: any port
  static Key keyOf(const AllowElement& e) { return {e.address, e.port.value_or(0)}; }

  std::string id_;
  AddFn add_;
  mutable std::mutex mu_;
  std::condition_variable committed_;
  /// A batch some caller waits for: `waiters` callers need it; it is erased when they have
  /// all seen it finish.
  struct Batch {
    int waiters = 0;
    bool finished = false;
    bool ok = false;
  };

  bool loadNext(std::unique_lock<std::mutex>& lock);
  bool refuseFull();

  std::set<Key> done_;                 ///< in the sets
  std::map<Key, uint64_t> queued_;     ///< not in the sets yet: the batch each one is in
  std::vector<AllowElement> pending_;  ///< the next batch's elements
  uint64_t next_batch_ = 0;            ///< the number `pending_` gets when it is loaded
  std::map<uint64_t, Batch> batches_;  ///< batches callers wait for
  bool loading_ = false;               ///< an AddFn call runs (at most one at a time)
  uint64_t loads_ = 0;
  std::chrono::steady_clock::time_point full_logged_at_{};
  uint64_t full_refusals_ = 0;  ///< set-full refusals since the last log line
};

}  // namespace runner::firewall
