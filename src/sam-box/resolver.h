#pragma once
// Name resolution for allowed names, off the event loop. getaddrinfo(3) blocks and cannot be
// cancelled, and Asio's own resolver runs lookups one at a time on one thread, so a slow name
// would delay every other flow past its connect deadline. Here lookups run on a small pool of
// threads started as lookups need them, and the awaiting flow gives up at its deadline
// whether or not the lookup has returned.
// Search domains are switched off (RES_DNSRCH/RES_DEFNAMES cleared in each worker): the
// allowlist names an absolute name, and "api.example.com" must never become
// "api.example.com.corp.internal". /etc/hosts is still consulted, as nsswitch.conf says.
//
// Answers are kept for kResolveCacheTtl, so that a burst of flows to one name (a package
// install) costs one lookup and no thread hand-off per flow; flows asking for a name whose
// lookup is already running wait for that lookup instead of starting another. Only the
// answer is kept: the caller judges every address of it for every flow, so the
// forbidden-address check and the host's own addresses are applied as they are at that
// moment. Failures are not kept.

#include <asio/awaitable.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/address.hpp>
#include <asio/steady_timer.hpp>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace sambox {

struct ResolveResult {
  bool timed_out = false;
  int gai_error = 0;                         ///< getaddrinfo(3) error code; 0 on success
  std::string error;                         ///< the failure in words (for the flow's detail)
  std::vector<asio::ip::address> addresses;  ///< A and AAAA, de-duplicated, resolver order
};

class Resolver {
 public:
  /// `threads`: lookups that may run at once (each blocks one thread). `cache_ttl`: how long
  /// an answer is reused (zero: never); `cache_entries`: most names kept.
  Resolver(asio::io_context& io, size_t threads, std::chrono::milliseconds cache_ttl,
           size_t cache_entries);
  ~Resolver();
  Resolver(const Resolver&) = delete;
  Resolver& operator=(const Resolver&) = delete;

  /// Resolves `name` (already normalized, no trailing dot) to its A and AAAA addresses.
  /// Completes on the io_context's thread by `deadline` at the latest (timed_out = true).
  /// Must be called on the io_context's thread.
  asio::awaitable<ResolveResult> resolve(std::string name, asio::steady_timer::time_point deadline);
  /// The part of resolve() that needs no waiting: if `name`'s answer is cached and fresh,
  /// copies it to `*addresses` and returns true (an expired entry is dropped). Then resolve()
  /// would have returned that answer; a flow asks here first to spare itself a coroutine.
  bool cached(const std::string& name, std::vector<asio::ip::address>* addresses);

  /// Worker threads started so far (at most `threads`).
  [[nodiscard]] size_t threadsStarted() const;
  /// getaddrinfo(3) calls asked for so far (io thread only).
  [[nodiscard]] uint64_t lookupsStarted() const { return lookups_started_; }

 private:
  /// One running lookup and the flows waiting for it (io thread only).
  struct Lookup {
    bool done = false;
    ResolveResult result;
    std::vector<asio::steady_timer*> waiters;
  };
  struct Job {
    std::string name;
    std::shared_ptr<Lookup> lookup;
  };
  struct CacheEntry {
    std::vector<asio::ip::address> addresses;
    std::chrono::steady_clock::time_point expires;
  };

  void submit(Job job);
  void work();
  /// On the io thread: stores the answer and wakes every waiter.
  void complete(const std::string& name, const std::shared_ptr<Lookup>& lookup,
                ResolveResult result);
  void remember(const std::string& name, const std::vector<asio::ip::address>& addresses);

  asio::io_context& io_;
  const size_t max_threads_;
  const std::chrono::milliseconds cache_ttl_;
  const size_t cache_entries_;

  // io thread only.
  std::unordered_map<std::string, CacheEntry> cache_;
  std::unordered_map<std::string, std::shared_ptr<Lookup>> running_;
  uint64_t lookups_started_ = 0;

  // Shared with the workers.
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<Job> queue_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;
  bool stopping_ = false;
};

}  // namespace sambox
