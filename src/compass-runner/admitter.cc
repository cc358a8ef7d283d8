#include "compass-runner/admitter.h"

#include <exception>

#include "common/log.h"

namespace runner::firewall {

Admitter::Admitter(std::string id, AddFn add) : id_(std::move(id)), add_(std::move(add)) {}

uint64_t Admitter::loads() const {
  std::lock_guard lock(mu_);
  return loads_;
}

size_t Admitter::pendingElements() const {
  std::lock_guard lock(mu_);
  return pending_.size();
}

bool Admitter::refuseFull() {
  // Once a second at most: the agent decides how often this happens.
  const auto now = std::chrono::steady_clock::now();
  ++full_refusals_;
  if (now - full_logged_at_ >= std::chrono::seconds(1)) {
    common::log::warn("egress firewall: allow sets full", {{"agent", id_},
                                                           {"reason", "set-full"},
                                                           {"limit", kMaxSetElements},
                                                           {"refused", full_refusals_}});
    full_logged_at_ = now;
    full_refusals_ = 0;
  }
  return false;
}

// Loads `pending_` as batch next_batch_ (the lock is let go meanwhile); true if it did.
bool Admitter::loadNext(std::unique_lock<std::mutex>& lock) {
  if (loading_ || pending_.empty()) return false;
  loading_ = true;
  const uint64_t number = next_batch_++;
  std::vector<AllowElement> batch = std::move(pending_);
  pending_.clear();
  lock.unlock();
  bool ok = false;
  try {
    ok = add_(batch);
  } catch (const std::exception& e) {
    common::log::error("egress firewall: adding set elements failed",
                       {{"agent", id_}, {"error", e.what()}});
  } catch (...) {
    // Whatever it was, the load failed: `loading_` must still be cleared below, or every
    // later admit() would wait for ever.
    common::log::error("egress firewall: adding set elements failed",
                       {{"agent", id_}, {"error", "unknown exception"}});
  }
  lock.lock();
  loading_ = false;
  ++loads_;
  if (!ok) {
    common::log::error("egress firewall: adding set elements failed",
                       {{"agent", id_}, {"reason", "admit-failed"}, {"elements", batch.size()}});
  }
  for (const auto& e : batch) {
    queued_.erase(keyOf(e));
    if (ok) done_.insert(keyOf(e));
  }
  if (auto it = batches_.find(number); it != batches_.end()) {
    it->second.finished = true;
    it->second.ok = ok;
  }
  committed_.notify_all();
  return true;
}

bool Admitter::admit(const std::vector<AllowElement>& elements) {
  std::unique_lock lock(mu_);
  std::set<uint64_t> needed;
  std::vector<AllowElement> fresh;
  std::set<Key> fresh_keys;
  for (const auto& e : elements) {
    const Key key = keyOf(e);
    if (done_.contains(key)) continue;
    if (auto it = queued_.find(key); it != queued_.end()) {
      needed.insert(it->second);  // another caller's batch holds it: its outcome is ours
    } else if (fresh_keys.insert(key).second) {
      fresh.push_back(e);
    }
  }
  if (fresh.empty() && needed.empty()) return true;
  if (done_.size() + queued_.size() + fresh.size() > kMaxSetElements) return refuseFull();
  if (!fresh.empty()) {
    needed.insert(next_batch_);
    for (auto& e : fresh) {
      queued_.emplace(keyOf(e), next_batch_);
      pending_.push_back(std::move(e));
    }
  }
  for (const uint64_t b : needed) ++batches_[b].waiters;
  const auto allFinished = [&] {
    for (const uint64_t b : needed) {
      if (!batches_[b].finished) return false;
    }
    return true;
  };
  // Whoever finds no load running starts the next; the others wait for it.
  while (!allFinished()) {
    if (!loadNext(lock)) committed_.wait(lock);
  }
  bool ok = true;
  for (const uint64_t b : needed) {
    auto it = batches_.find(b);
    ok = ok && it->second.ok;
    if (--it->second.waiters == 0) batches_.erase(it);
  }
  return ok;
}

}  // namespace runner::firewall
