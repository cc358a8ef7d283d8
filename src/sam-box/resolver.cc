#include "sam-box/resolver.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <resolv.h>
#include <sys/socket.h>

#include <algorithm>
#include <asio/post.hpp>
#include <asio/redirect_error.hpp>
#include <asio/use_awaitable.hpp>
#include <memory>

namespace sambox {
namespace {

struct Pending {
  explicit Pending(asio::io_context& io) : timer(io) {}
  asio::steady_timer timer;
  bool done = false;
  ResolveResult result;
};

void disableSearchDomains() {
  thread_local bool done = false;
  if (done) return;
  res_init();
  _res.options &= ~static_cast<unsigned long>(RES_DNSRCH | RES_DEFNAMES);
  done = true;
}

ResolveResult lookup(const std::string& name) {
  disableSearchDomains();
  ResolveResult r;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;  // one entry per address, not one per socket type
  addrinfo* list = nullptr;
  r.gai_error = ::getaddrinfo(name.c_str(), nullptr, &hints, &list);
  if (r.gai_error != 0) return r;
  for (const addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
    asio::ip::address addr;
    if (ai->ai_family == AF_INET) {
      const auto* sin = reinterpret_cast<const sockaddr_in*>(ai->ai_addr);
      asio::ip::address_v4::bytes_type b{};
      std::memcpy(b.data(), &sin->sin_addr, b.size());
      addr = asio::ip::address_v4(b);
    } else if (ai->ai_family == AF_INET6) {
      const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(ai->ai_addr);
      asio::ip::address_v6::bytes_type b{};
      std::memcpy(b.data(), &sin6->sin6_addr, b.size());
      addr = asio::ip::address_v6(b, sin6->sin6_scope_id);
    } else {
      continue;
    }
    if (std::find(r.addresses.begin(), r.addresses.end(), addr) == r.addresses.end()) {
      r.addresses.push_back(addr);
    }
  }
  ::freeaddrinfo(list);
  return r;
}

}  // namespace

Resolver::Resolver(asio::io_context& io, size_t threads) : io_(io), pool_(threads) {}

Resolver::~Resolver() {
  pool_.stop();
  pool_.join();
}

asio::awaitable<ResolveResult> Resolver::resolve(std::string name,
                                                 asio::steady_timer::time_point deadline) {
  auto pending = std::make_shared<Pending>(io_);
  pending->timer.expires_at(deadline);
  asio::post(pool_, [pending, name = std::move(name), &io = io_] {
    ResolveResult result = lookup(name);
    // Hand the result to the io thread; only that thread touches `pending`'s fields.
    asio::post(io, [pending, result = std::move(result)]() mutable {
      pending->result = std::move(result);
      pending->done = true;
      pending->timer.cancel();
    });
  });
  asio::error_code ec;
  co_await pending->timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  if (!pending->done) {
    ResolveResult timed_out;
    timed_out.timed_out = true;
    co_return timed_out;
  }
  co_return std::move(pending->result);
}

}  // namespace sambox
