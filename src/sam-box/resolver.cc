#include "sam-box/resolver.h"

#include "common/resolve.h"

#include <algorithm>
#include <asio/post.hpp>
#include <asio/redirect_error.hpp>
#include <asio/use_awaitable.hpp>

namespace sambox {
namespace {

ResolveResult lookup(const std::string& name) {
  common::AddressLookup found = common::lookupAddresses(name);
  ResolveResult r;
  r.gai_error = found.gai_error;
  r.error = common::describeLookupError(found);
  r.addresses = std::move(found.addresses);
  return r;
}

}  // namespace

Resolver::Resolver(asio::io_context& io, size_t threads, std::chrono::milliseconds cache_ttl,
                   size_t cache_entries)
    : io_(io),
      max_threads_(std::max<size_t>(threads, 1)),
      cache_ttl_(cache_ttl),
      cache_entries_(cache_entries) {}

Resolver::~Resolver() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& t : threads_) t.join();
}

size_t Resolver::threadsStarted() const {
  std::lock_guard lock(mu_);
  return threads_.size();
}

void Resolver::submit(Job job) {
  {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(job));
    // A thread is started only when every running one is busy: an idle box runs one thread.
    if (idle_ == 0 && threads_.size() < max_threads_) {
      threads_.emplace_back([this] { work(); });
      return;
    }
  }
  wake_.notify_one();
}

void Resolver::work() {
  std::unique_lock lock(mu_);
  for (;;) {
    ++idle_;
    wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    --idle_;
    if (stopping_) return;
    Job job = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    ResolveResult result = lookup(job.name);
    // Only the io thread touches the lookup, the cache and the waiters.
    asio::post(io_, [this, job = std::move(job), result = std::move(result)]() mutable {
      complete(job.name, job.lookup, std::move(result));
    });
    lock.lock();
  }
}

void Resolver::complete(const std::string& name, const std::shared_ptr<Lookup>& lookup,
                        ResolveResult result) {
  if (result.gai_error == 0 && !result.addresses.empty()) remember(name, result.addresses);
  auto it = running_.find(name);
  if (it != running_.end() && it->second == lookup) running_.erase(it);
  lookup->result = std::move(result);
  lookup->done = true;
  for (asio::steady_timer* waiter : lookup->waiters) waiter->cancel();
  lookup->waiters.clear();
}

void Resolver::remember(const std::string& name, const std::vector<asio::ip::address>& addresses) {
  if (cache_ttl_.count() <= 0 || cache_entries_ == 0) return;
  const auto now = std::chrono::steady_clock::now();
  if (cache_.size() >= cache_entries_ && cache_.find(name) == cache_.end()) {
    std::erase_if(cache_, [now](const auto& kv) { return kv.second.expires <= now; });
    if (cache_.size() >= cache_entries_) cache_.erase(cache_.begin());
  }
  cache_[name] = CacheEntry{addresses, now + cache_ttl_};
}

bool Resolver::cached(const std::string& name, std::vector<asio::ip::address>* addresses) {
  auto hit = cache_.find(name);
  if (hit == cache_.end()) return false;
  if (hit->second.expires > std::chrono::steady_clock::now()) {
    *addresses = hit->second.addresses;
    return true;
  }
  cache_.erase(hit);
  return false;
}

asio::awaitable<ResolveResult> Resolver::resolve(std::string name,
                                                 asio::steady_timer::time_point deadline) {
  if (ResolveResult hit; cached(name, &hit.addresses)) co_return hit;
  std::shared_ptr<Lookup> lookup;
  if (auto it = running_.find(name); it != running_.end()) {
    lookup = it->second;
  } else {
    lookup = std::make_shared<Lookup>();
    running_.emplace(name, lookup);
    ++lookups_started_;
    submit(Job{std::move(name), lookup});
  }
  asio::steady_timer timer(io_, deadline);
  lookup->waiters.push_back(&timer);
  asio::error_code ec;
  co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  if (!lookup->done) {
    // Deadline: stop waiting; the lookup itself runs on and still fills the cache.
    std::erase(lookup->waiters, &timer);
    ResolveResult timed_out;
    timed_out.timed_out = true;
    co_return timed_out;
  }
  co_return lookup->result;
}

}  // namespace sambox
