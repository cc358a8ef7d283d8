#include "compass-runner/dns_forwarder.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <resolv.h>
#include <sched.h>
#include <sys/socket.h>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/ip/udp.hpp>
#include <asio/ip/v6_only.hpp>
#include <asio/post.hpp>
#include <asio/read.hpp>
#include <asio/steady_timer.hpp>
#include <asio/thread_pool.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <random>
#include <thread>

#include "common/log.h"
#include "common/unique_fd.h"
#include "compass-runner/backend.h"

namespace runner::firewall {
namespace {

using asio::ip::tcp;
using asio::ip::udp;
constexpr auto kTuple = asio::experimental::as_tuple(asio::use_awaitable);

std::atomic<int> g_lookups{0};

// One getaddrinfo(3) call: both families at once (AF_UNSPEC), so that a name /etc/hosts knows
// in one family only is answered from /etc/hosts and never sent on to the host's DNS server.
Resolution lookup(const std::string& name) {
  // The allowlist names absolute names: "api.example.com" must never become
  // "api.example.com.corp.internal" through a search list. _res is per thread.
  res_init();
  _res.options &= ~static_cast<unsigned long>(RES_DNSRCH | RES_DEFNAMES);
  Resolution r;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;  // one entry per address, not one per socket type
  addrinfo* list = nullptr;
  const int rc = ::getaddrinfo(name.c_str(), nullptr, &hints, &list);
  if (rc == EAI_NONAME) {
    r.status = Resolution::Status::kNoName;
    return r;
  }
  if (rc == EAI_NODATA || rc == EAI_ADDRFAMILY) {
    r.status = Resolution::Status::kNoData;
    return r;
  }
  if (rc != 0) return r;  // kFailed
  for (const addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
    if (ai->ai_family == AF_INET) {
      asio::ip::address_v4::bytes_type b{};
      std::memcpy(b.data(), &reinterpret_cast<const sockaddr_in*>(ai->ai_addr)->sin_addr, 4);
      r.addresses.emplace_back(asio::ip::address_v4(b));
    } else if (ai->ai_family == AF_INET6) {
      asio::ip::address_v6::bytes_type b{};
      std::memcpy(b.data(), &reinterpret_cast<const sockaddr_in6*>(ai->ai_addr)->sin6_addr, 16);
      r.addresses.emplace_back(asio::ip::address_v6(b));
    }
  }
  ::freeaddrinfo(list);
  r.status = Resolution::Status::kOk;
  return r;
}

// A TCP query's answer, computed on a worker and handed back to the connection's coroutine on
// the io thread: the worker posts the result there and cancels the timer the coroutine waits
// on (only the io thread touches `reply` after the post).
struct TcpJob {
  explicit TcpJob(asio::io_context& io) : done(io) {}
  asio::steady_timer done;
  std::string reply;
};

}  // namespace

struct DnsForwarder::Impl {
  explicit Impl(ForwarderConfig c) : config(std::move(c)) {}

  ForwarderConfig config;
  asio::io_context io;
  std::vector<std::unique_ptr<udp::socket>> udp_sockets;
  std::vector<std::unique_ptr<tcp::acceptor>> acceptors;
  std::unique_ptr<asio::thread_pool> workers;
  std::thread io_thread;
  bool running = false;

  std::atomic<int> pending{0};
  std::atomic<int> tcp_clients{0};
  std::atomic<uint64_t> queries{0}, answered{0}, refused{0}, dropped{0};

  std::mutex log_mu;
  std::chrono::steady_clock::time_point log_window{};
  int logged_in_window = 0;
  uint64_t suppressed = 0;

  // The only place an answer is computed; runs on a worker.
  std::string answer(std::string_view query, size_t max_reply) {
    AnswerContext ctx;
    ctx.allow = &config.allow;
    ctx.resolve = [this](const std::string& name) {
      return resolveOnHost(name, config.resolve_timeout);
    };
    ctx.admit = config.admit;
    ctx.local = config.local;
    ctx.max_reply = max_reply;
    Answer a;
    try {
      a = answerQuery(query, ctx);
    } catch (const std::exception& e) {  // a bug, not an input: fail closed, say so
      common::log::error("dns forwarder: answer failed",
                         {{"agent", config.id}, {"error", e.what()}});
      return {};
    }
    ++queries;
    if (!a.answered.empty()) ++answered;
    if (!a.reason.empty()) {
      ++refused;
      logRefusal(a);
    }
    return a.reply;
  }

  void logRefusal(const Answer& a) {
    std::lock_guard lock(log_mu);
    const auto now = std::chrono::steady_clock::now();
    if (now - log_window >= std::chrono::seconds(1)) {
      if (suppressed > 0) {
        common::log::warn("dns refusals not logged", {{"agent", config.id}, {"count", suppressed}});
      }
      log_window = now;
      logged_in_window = 0;
      suppressed = 0;
    }
    if (logged_in_window >= kMaxRefusalLogsPerSecond) {
      ++suppressed;
      return;
    }
    ++logged_in_window;
    nlohmann::json fields = {
        {"agent", config.id}, {"reason", a.reason}, {"qtype", a.qtype}, {"rcode", a.rcode}};
    if (!a.name.empty()) fields["name"] = a.name;
    if (!a.filtered.empty()) {
      nlohmann::json list = nlohmann::json::array();
      for (const auto& addr : a.filtered) list.push_back(addr.to_string());
      fields["refused_addresses"] = list;
    }
    common::log::warn("dns refused", fields);
  }

  asio::awaitable<void> serveUdp(udp::socket& socket) {
    std::vector<char> buf(kMaxQueryBytes + 1);
    for (;;) {
      udp::endpoint from;
      auto [ec, n] = co_await socket.async_receive_from(asio::buffer(buf), from, kTuple);
      if (ec == asio::error::operation_aborted || !socket.is_open()) co_return;
      if (ec) continue;
      if (n > kMaxQueryBytes) continue;  // larger than any stub's query: not worth an answer
      if (pending.fetch_add(1) >= kMaxPendingQueries) {
        --pending;
        ++dropped;
        continue;
      }
      asio::post(*workers, [this, &socket, from, query = std::string(buf.data(), n)] {
        std::string reply = answer(query, kMaxUdpReply);
        --pending;
        if (reply.empty()) return;
        asio::post(io, [&socket, from, reply = std::move(reply)] {
          asio::error_code ignored;  // a full socket buffer loses one answer; the client retries
          socket.send_to(asio::buffer(reply), from, 0, ignored);
        });
      });
    }
  }

  asio::awaitable<void> serveTcpClient(tcp::socket socket) {
    using asio::experimental::awaitable_operators::operator||;
    for (int i = 0; i < kMaxQueriesPerTcpConnection; ++i) {
      asio::steady_timer idle(io, kTcpIdleTimeout);
      std::array<uint8_t, 2> len{};
      auto got =
          co_await (asio::async_read(socket, asio::buffer(len), kTuple) || idle.async_wait(kTuple));
      if (got.index() != 0 || std::get<0>(std::get<0>(got))) break;
      const size_t size = (size_t{len[0]} << 8) | len[1];
      if (size == 0 || size > kMaxQueryBytes) break;
      std::string query(size, '\0');
      idle.expires_after(kTcpIdleTimeout);
      auto body = co_await (asio::async_read(socket, asio::buffer(query), kTuple) ||
                            idle.async_wait(kTuple));
      if (body.index() != 0 || std::get<0>(std::get<0>(body))) break;
      ++pending;
      auto job = std::make_shared<TcpJob>(io);
      job->done.expires_at(asio::steady_timer::time_point::max());
      asio::post(*workers, [this, job, query = std::move(query)] {
        std::string reply = answer(query, kMaxTcpReply);
        asio::post(io, [job, reply = std::move(reply)]() mutable {
          job->reply = std::move(reply);
          job->done.cancel();
        });
      });
      co_await job->done.async_wait(kTuple);
      --pending;
      const std::string& reply = job->reply;
      if (reply.empty()) break;
      const std::array<uint8_t, 2> out_len = {static_cast<uint8_t>(reply.size() >> 8),
                                              static_cast<uint8_t>(reply.size() & 0xff)};
      const std::array<asio::const_buffer, 2> bufs = {asio::buffer(out_len), asio::buffer(reply)};
      // A client that stops reading must not hold its slot: the same idle bound applies.
      idle.expires_after(kTcpIdleTimeout);
      auto sent = co_await (asio::async_write(socket, bufs, kTuple) || idle.async_wait(kTuple));
      if (sent.index() != 0 || std::get<0>(std::get<0>(sent))) break;
    }
    --tcp_clients;
  }

  asio::awaitable<void> acceptTcp(tcp::acceptor& acceptor) {
    for (;;) {
      auto [ec, socket] = co_await acceptor.async_accept(kTuple);
      if (ec == asio::error::operation_aborted || !acceptor.is_open()) co_return;
      if (ec) continue;
      if (tcp_clients.fetch_add(1) >= kMaxTcpClients) {
        --tcp_clients;
        ++dropped;
        continue;  // `socket` closes here
      }
      asio::co_spawn(io, serveTcpClient(std::move(socket)), asio::detached);
    }
  }
};

DnsForwarder::DnsForwarder(ForwarderConfig config)
    : impl_(std::make_unique<Impl>(std::move(config))) {}

DnsForwarder::~DnsForwarder() { stop(); }

void DnsForwarder::start() {
  Impl& m = *impl_;
  if (m.running) return;
  if (!m.config.admit) throw RunnerError("dns forwarder: no admit callback");
  for (const auto& addr : m.config.listen) {
    const std::string where = (addr.is_v6() ? "[" + addr.to_string() + "]" : addr.to_string()) +
                              ":" + std::to_string(m.config.port);
    asio::error_code ec;
    auto sock = std::make_unique<udp::socket>(m.io);
    const udp::endpoint uep(addr, m.config.port);
    sock->open(uep.protocol(), ec);
    if (!ec && addr.is_v6()) sock->set_option(asio::ip::v6_only(true), ec);
    if (!ec) sock->bind(uep, ec);
    if (ec) {
      m.udp_sockets.clear();
      m.acceptors.clear();
      throw RunnerError("dns forwarder: bind " + where + "/udp: " + ec.message());
    }
    m.udp_sockets.push_back(std::move(sock));
    auto acc = std::make_unique<tcp::acceptor>(m.io);
    const tcp::endpoint tep(addr, m.config.port);
    acc->open(tep.protocol(), ec);
    if (!ec) acc->set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec && addr.is_v6()) acc->set_option(asio::ip::v6_only(true), ec);
    if (!ec) acc->bind(tep, ec);
    if (!ec) acc->listen(kMaxTcpClients, ec);
    if (ec) {
      m.udp_sockets.clear();
      m.acceptors.clear();
      throw RunnerError("dns forwarder: bind " + where + "/tcp: " + ec.message());
    }
    m.acceptors.push_back(std::move(acc));
  }
  m.workers = std::make_unique<asio::thread_pool>(kWorkerThreads);
  for (auto& s : m.udp_sockets) asio::co_spawn(m.io, m.serveUdp(*s), asio::detached);
  for (auto& a : m.acceptors) asio::co_spawn(m.io, m.acceptTcp(*a), asio::detached);
  m.io_thread = std::thread([&m] { m.io.run(); });
  m.running = true;
}

void DnsForwarder::stop() noexcept {
  Impl& m = *impl_;
  if (!m.running) return;
  m.running = false;
  // Stop the sockets first so nothing new is taken, then the workers (each finishes its
  // query within the resolve deadline and the admit bound), then the io thread.
  asio::post(m.io, [&m] {
    asio::error_code ignored;
    for (auto& s : m.udp_sockets) s->close(ignored);
    for (auto& a : m.acceptors) a->close(ignored);
  });
  m.workers->join();
  m.io.stop();
  if (m.io_thread.joinable()) m.io_thread.join();
}

std::string DnsForwarder::answerDirectly(std::string_view query) {
  return impl_->answer(query, kMaxUdpReply);
}

ForwarderStats DnsForwarder::stats() const {
  return {impl_->queries.load(), impl_->answered.load(), impl_->refused.load(),
          impl_->dropped.load()};
}

Resolution resolveOnHost(const std::string& name, std::chrono::milliseconds timeout) {
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    Resolution result;
  };
  if (g_lookups.fetch_add(1) >= kMaxLookups) {
    --g_lookups;
    return {};  // kFailed: the agent's resolver retries; nothing queues without bound
  }
  auto shared = std::make_shared<Shared>();
  try {
    // Detached: getaddrinfo(3) cannot be cancelled, and a stuck look-up must not hold up
    // the answer (or the forwarder's stop) past its deadline. It owns only `shared`.
    std::thread([shared, name] {
      Resolution r = lookup(name);
      // The slot is given back before the answer is handed over: once a client has its reply,
      // its look-up no longer counts (the pre-resolve sends kMaxLookups queries at a time).
      --g_lookups;
      {
        std::lock_guard lock(shared->mu);
        shared->result = std::move(r);
        shared->done = true;
      }
      shared->cv.notify_all();
    }).detach();
  } catch (const std::system_error&) {
    --g_lookups;
    return {};
  }
  std::unique_lock lock(shared->mu);
  if (!shared->cv.wait_for(lock, timeout, [&] { return shared->done; })) {
    Resolution timed_out;
    timed_out.status = Resolution::Status::kTimedOut;
    return timed_out;
  }
  return shared->result;
}

ParsedReply queryFromNetns(const std::string& netns_path, const asio::ip::address& server,
                           uint16_t port, const std::string& name, uint16_t qtype,
                           std::chrono::milliseconds timeout) {
  const std::string where =
      "DNS query for " + name + " to " + server.to_string() + " in " + netns_path;
  ParsedReply result;
  std::exception_ptr error;
  // setns(2) on a thread of its own: the netns follows that thread only, and the thread ends
  // with the query, so nothing else in the runner ever runs inside the sandbox's netns.
  std::thread worker([&] {
    try {
      const common::UniqueFd ns(::open(netns_path.c_str(), O_RDONLY | O_CLOEXEC));
      if (!ns.valid()) throw RunnerError(where + ": open: " + std::strerror(errno));
      if (::setns(ns.get(), CLONE_NEWNET) != 0) {
        throw RunnerError(where + ": setns: " + std::strerror(errno));
      }
      const udp::endpoint ep(server, port);
      const common::UniqueFd s(
          ::socket(server.is_v6() ? AF_INET6 : AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
      if (!s.valid()) throw RunnerError(where + ": socket: " + std::strerror(errno));
      if (::connect(s.get(), ep.data(), static_cast<socklen_t>(ep.size())) != 0) {
        throw RunnerError(where + ": connect: " + std::strerror(errno));
      }
      const uint16_t id = static_cast<uint16_t>(std::random_device{}());
      const std::string q = buildQuery(id, name, qtype);
      if (::send(s.get(), q.data(), q.size(), 0) != static_cast<ssize_t>(q.size())) {
        throw RunnerError(where + ": send: " + std::strerror(errno));
      }
      const auto deadline = std::chrono::steady_clock::now() + timeout;
      std::vector<char> buf(kMaxTcpReply);
      for (;;) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            deadline - std::chrono::steady_clock::now());
        pollfd p{s.get(), POLLIN, 0};
        const int ready = left.count() > 0 ? ::poll(&p, 1, static_cast<int>(left.count())) : 0;
        if (ready < 0 && errno == EINTR) continue;
        if (ready <= 0) {
          throw RunnerError(where + ": no reply within " + std::to_string(timeout.count()) + " ms");
        }
        const ssize_t n = ::recv(s.get(), buf.data(), buf.size(), 0);
        if (n < 0) throw RunnerError(where + ": recv: " + std::strerror(errno));
        ParsedReply r = parseReply(std::string_view(buf.data(), static_cast<size_t>(n)));
        if (r.id != id) continue;  // not ours
        result = std::move(r);
        return;
      }
    } catch (const RunnerError&) {
      error = std::current_exception();
    } catch (const std::exception& e) {
      error = std::make_exception_ptr(RunnerError(where + ": " + e.what()));
    }
  });
  worker.join();
  if (error) std::rethrow_exception(error);
  return result;
}

}  // namespace runner::firewall
