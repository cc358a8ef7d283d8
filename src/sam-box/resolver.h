#pragma once
// Name resolution for allowed names, off the event loop. getaddrinfo(3) blocks and cannot be
// cancelled, and Asio's own resolver runs lookups one at a time on one thread, so a slow name
// would delay every other flow past its connect deadline. Here lookups run on a small pool,
// and the awaiting flow gives up at its deadline whether or not the lookup has returned.
// Search domains are switched off (RES_DNSRCH/RES_DEFNAMES cleared in each worker): the
// allowlist names an absolute name, and "api.example.com" must never become
// "api.example.com.corp.internal". /etc/hosts is still consulted, as nsswitch.conf says.

#include <asio/awaitable.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/address.hpp>
#include <asio/steady_timer.hpp>
#include <asio/thread_pool.hpp>

#include <string>
#include <vector>

namespace sambox {

struct ResolveResult {
  bool timed_out = false;
  int gai_error = 0;                         ///< getaddrinfo(3) error code; 0 on success
  std::vector<asio::ip::address> addresses;  ///< A and AAAA, de-duplicated, resolver order
};

class Resolver {
 public:
  /// `threads`: lookups that may run at once (each blocks one thread).
  Resolver(asio::io_context& io, size_t threads);
  ~Resolver();
  Resolver(const Resolver&) = delete;
  Resolver& operator=(const Resolver&) = delete;

  /// Resolves `name` (already normalized, no trailing dot) to its A and AAAA addresses.
  /// Completes on the io_context's thread by `deadline` at the latest (timed_out = true).
  asio::awaitable<ResolveResult> resolve(std::string name, asio::steady_timer::time_point deadline);

 private:
  asio::io_context& io_;
  asio::thread_pool pool_;
};

}  // namespace sambox
