#include <fcntl.h>
#include <llhttp.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <initializer_list>
#include <map>
#include <mutex>
#include <span>
#include <stdexcept>
#include <thread>

#include "common/log.h"
#include "common/unique_fd.h"
#include "proto/http_syntax.h"
#include "sam-node/conn_writer.h"
#include "sam-node/http.h"

namespace samnode {
namespace {

// Request line plus header fields; a larger head is answered 431 (RFC 6585 §5).
constexpr size_t kMaxHeadBytes = size_t{64} * 1024;
// Header fields in one head (as Apache's LimitRequestFields): each is a pair of strings here,
// so 64 KiB of empty "a:" fields would otherwise cost megabytes. More → 431 as well.
constexpr size_t kMaxHeaderFields = 100;
constexpr size_t kReadBuffer = size_t{64} * 1024;

using Clock = std::chrono::steady_clock;

// The stop flag of the server whose connection this thread serves (stopRequested()).
thread_local const std::atomic<bool>* tl_stopping = nullptr;

// Parser state of one connection; llhttp calls back into it.
struct Parse {
  Request req;
  bool in_value = false;
  size_t head_bytes = 0;
  bool head_too_large = false;
  bool too_many_fields = false;
  bool upgrade = false;        // Upgrade or CONNECT: refused before any handler runs
  std::string bad_field_name;  // a field name that is not a token (RFC 9110 §5.1)
  bool trailer = false;        // a trailer field after a chunked body: refused, never merged
  bool body_too_large = false;
  bool complete = false;
  bool in_message = false;     // a request's first byte arrived, its last one not yet
  bool head_complete = false;  // ... and its head is complete
  Clock::time_point head_started;
  int fd = -1;
  // Bytes of request bodies held by every connection at once (the server's), this one's share
  // of it, and the limit: past it a body is refused (503 node-busy) rather than buffered.
  std::atomic<size_t>* bodies_held = nullptr;
  size_t held = 0;
  size_t bodies_limit = 0;
  bool over_budget = false;

  static Parse& of(llhttp_t* p) { return *static_cast<Parse*>(p->data); }
  // Gives this connection's share of the body budget back (its request is done or dropped).
  void releaseBody() {
    if (bodies_held != nullptr && held > 0) bodies_held->fetch_sub(held);
    held = 0;
  }
  bool countHead(size_t n) {
    head_bytes += n;
    if (head_bytes > kMaxHeadBytes) head_too_large = true;
    return !head_too_large;
  }
};

int onMessageBegin(llhttp_t* p) {
  Parse& s = Parse::of(p);
  s.req = Request{};
  s.in_value = false;
  s.head_bytes = 0;
  s.too_many_fields = false;
  s.upgrade = false;
  s.bad_field_name.clear();
  s.trailer = false;
  s.complete = false;
  s.in_message = true;
  s.head_complete = false;
  s.head_started = Clock::now();
  return 0;
}

int onUrl(llhttp_t* p, const char* at, size_t len) {
  Parse& s = Parse::of(p);
  if (!s.countHead(len)) return -1;
  s.req.target.append(at, len);
  return 0;
}

int onHeaderField(llhttp_t* p, const char* at, size_t len) {
  Parse& s = Parse::of(p);
  // A field after the head is a trailer (RFC 9112 §7.1.2): llhttp reports it like a head
  // field, and joined to the head it would skip the head's checks (an X-Sam-Agent, a
  // "Host :"). No client of the node sends trailers; sam-box refuses them too.
  if (s.head_complete) {
    s.trailer = true;
    return -1;
  }
  if (!s.countHead(len)) return -1;
  if (s.in_value || s.req.headers.empty()) {
    if (s.req.headers.size() >= kMaxHeaderFields) {
      s.too_many_fields = true;
      return -1;
    }
    s.req.headers.emplace_back();
    s.in_value = false;
  }
  s.req.headers.back().first.append(at, len);
  return 0;
}

int onHeaderValue(llhttp_t* p, const char* at, size_t len) {
  Parse& s = Parse::of(p);
  if (!s.countHead(len)) return -1;
  s.in_value = true;
  s.req.headers.back().second.append(at, len);
  return 0;
}

int onHeadersComplete(llhttp_t* p) {
  Parse& s = Parse::of(p);
  s.head_complete = true;
  s.req.method = llhttp_method_name(static_cast<llhttp_method_t>(p->method));
  // llhttp sets `upgrade` before this callback (Connection: upgrade with Upgrade, or CONNECT):
  // refused here, so that no handler answers a request whose next bytes are another protocol.
  if (p->upgrade != 0) {
    s.upgrade = true;
    return -1;
  }
  // "Host :" is not "Host" (RFC 9112 §5.1: whitespace before the colon is a 400): such a
  // name would pass the node's header filters and reach the upstream as written.
  for (const auto& field : s.req.headers) {
    if (!proto::isToken(field.first)) {
      s.bad_field_name = field.first.substr(0, 64);
      return -1;
    }
  }
  // A declared length over the cap is refused before any of the body is read.
  if ((p->flags & F_CONTENT_LENGTH) != 0 && p->content_length > kMaxRequestBody) {
    s.body_too_large = true;
    return -1;
  }
  auto expect = findHeader(s.req.headers, "expect");
  if (expect && proto::equalsIgnoreCase(*expect, "100-continue") && p->http_minor >= 1)
    writeAll(s.fd, "HTTP/1.1 100 Continue\r\n\r\n");
  return 0;
}

int onBody(llhttp_t* p, const char* at, size_t len) {
  Parse& s = Parse::of(p);
  if (s.req.body.size() + len > kMaxRequestBody) {
    s.body_too_large = true;
    return -1;
  }
  if (s.bodies_held != nullptr) {
    const size_t cost = len * kBodyMemoryFactor;
    if (s.bodies_held->fetch_add(cost) + cost > s.bodies_limit) {
      s.bodies_held->fetch_sub(cost);
      s.over_budget = true;
      return -1;
    }
    s.held += cost;
  }
  s.req.body.append(at, len);
  return 0;
}

int onMessageComplete(llhttp_t* p) {
  Parse::of(p).complete = true;
  Parse::of(p).in_message = false;
  return HPE_PAUSED;  // handle this request before parsing a pipelined next one
}

void finishRequest(Request& req) {
  const auto q = req.target.find('?');
  req.path = req.target.substr(0, q);
  req.query = q == std::string::npos ? "" : req.target.substr(q + 1);
  req.agent = findHeader(req.headers, "x-sam-agent").value_or("");
}

// Before routing, in the router's shape (sendProblem()): a refusal (4xx, 503), or the node's
// own failure (500, type "sam_node_error").
void sendError(int fd, int status, std::string_view reason, std::string_view message) {
  ConnWriter out(fd, false, false, false);
  sendProblem(out, status, status >= 500 && status != 503 ? "sam_node_error" : "sam_node_refusal",
              reason, message);
}

}  // namespace

std::optional<std::string> findHeader(const Headers& headers, std::string_view name) {
  for (const auto& [k, v] : headers)
    if (proto::equalsIgnoreCase(k, name)) return v;
  return std::nullopt;
}

bool sendJson(ResponseWriter& out, int status, const std::string& json) {
  return out.send(status, {{"Content-Type", "application/json"}}, json);
}

bool sendProblem(ResponseWriter& out, int status, std::string_view type, std::string_view reason,
                 std::string_view message) {
  const nlohmann::json body = {{"error", {{"message", message}, {"type", type}, {"code", reason}}}};
  return out.send(status,
                  {{"Content-Type", "application/json"}, {"Sam-Node-Reason", std::string(reason)}},
                  body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

bool stopRequested() { return tl_stopping != nullptr && tl_stopping->load(); }

struct HttpServer::Impl {
  Impl(std::string p, Handler h, RefusalCounter r, ServerLimits l)
      : path(std::move(p)), handler(std::move(h)), refusals(std::move(r)), limits(l) {}
  std::string path;
  Handler handler;
  RefusalCounter refusals;
  ServerLimits limits;
  common::UniqueFd listener;
  common::UniqueFd wake_read, wake_write;
  std::mutex mu;
  std::condition_variable idle;
  // What one connection's thread is doing: only kIdle (waiting between requests) and
  // kReceiving (a request arriving, for longer than limits.slow_request) may be closed to make
  // room for a new connection; never kHandling (a request being answered) or kNew.
  enum class Phase { kNew, kIdle, kReceiving, kHandling };
  struct Conn {
    pid_t peer = 0;
    Phase phase = Phase::kNew;
    bool evicted = false;     // closed to make room: its thread leaves without reading more
    Clock::time_point since;  // when `phase` began
  };
  std::map<int, Conn> conns;           // by fd: shut down by stop()
  std::atomic<size_t> bodies_held{0};  // request body bytes buffered by all connections
  std::atomic<bool> stopping{false};

  void serveConnection(common::UniqueFd fd);
  // Logs a refusal (or a connection closed at a limit) and counts it.
  void refused(std::string_view what, std::string_view reason, const nlohmann::json& detail = {}) {
    nlohmann::json fields = {{"reason", reason}};
    if (detail.is_object()) fields.update(detail);
    common::log::warn(what, fields);
    if (refusals) refusals(reason);
  }
  // Waits for bytes from `fd` until the limit that applies now: the head deadline while a
  // request head is incomplete, else the idle limit. False if the limit passed (answered and
  // counted here) or the socket failed.
  bool awaitBytes(int fd, const Parse& state);
  // The connection `fd` now does `phase`; false if it was evicted meanwhile (its thread must
  // then stop).
  bool setPhase(int fd, Phase phase);
  // Whether `fd` was evicted (its thread then answers a request it was receiving with 408).
  bool evicted(int fd);
  // Under `mu`, a new connection from `peer` is to be added: false (with the reason for the
  // log) if it must be refused; at the total limit, evicts the longest-idle connection, else
  // the one receiving a request for longest (past limits.slow_request).
  bool admit(pid_t peer, std::string& refusal);
};

bool HttpServer::Impl::setPhase(int fd, Phase phase) {
  std::lock_guard lock(mu);
  const auto it = conns.find(fd);
  if (it == conns.end() || it->second.evicted) return false;
  Conn& c = it->second;
  if (c.phase != phase) c.since = Clock::now();
  c.phase = phase;
  return true;
}

bool HttpServer::Impl::evicted(int fd) {
  std::lock_guard lock(mu);
  const auto it = conns.find(fd);
  return it != conns.end() && it->second.evicted;
}

bool HttpServer::Impl::admit(pid_t peer, std::string& refusal) {
  size_t from_peer = 0;
  for (const auto& [fd, c] : conns) from_peer += c.peer == peer && !c.evicted ? 1 : 0;
  if (from_peer >= limits.connections_per_peer) {
    refusal = "connections from one peer process";
    return false;
  }
  if (conns.size() < limits.connections) return true;
  const auto now = Clock::now();
  auto idle = conns.end(), slow = conns.end();
  for (auto it = conns.begin(); it != conns.end(); ++it) {
    const Conn& c = it->second;
    if (c.evicted) continue;
    if (c.phase == Phase::kIdle) {
      // Bytes already waiting are a request its thread has not read yet: not idle.
      int pending = 0;
      if (::ioctl(it->first, FIONREAD, &pending) != 0 || pending > 0) continue;
      if (idle == conns.end() || c.since < idle->second.since) idle = it;
    } else if (c.phase == Phase::kReceiving && now - c.since > limits.slow_request) {
      if (slow == conns.end() || c.since < slow->second.since) slow = it;
    }
  }
  const auto victim = idle != conns.end() ? idle : slow;
  if (victim == conns.end()) {
    refusal = "connections";
    return false;
  }
  // Its thread sees the end of the stream and leaves: between requests, an ordinary end of
  // keep-alive (RFC 9112 §9.5); mid-request, after a 408 (the write side stays open for it).
  victim->second.evicted = true;
  const bool was_idle = victim == idle;
  ::shutdown(victim->first, was_idle ? SHUT_RDWR : SHUT_RD);
  const char* reason = was_idle ? "idle-evicted" : "slow-request-evicted";
  common::log::info("connection closed to make room",
                    {{"reason", reason}, {"peer_pid", victim->second.peer}});
  if (refusals) refusals(reason);
  return true;
}

bool HttpServer::Impl::awaitBytes(int fd, const Parse& state) {
  const bool in_head = state.in_message && !state.head_complete;
  std::chrono::milliseconds limit = limits.idle_timeout;
  if (in_head) {
    limit = std::max(std::chrono::milliseconds(0),
                     std::chrono::duration_cast<std::chrono::milliseconds>(
                         state.head_started + limits.head_timeout - Clock::now()));
  }
  const auto deadline = Clock::now() + limit;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::clamp<int64_t>(left, 0, INT32_MAX)));
    if (ready > 0) return true;
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return false;
    break;
  }
  if (in_head) {
    refused("request refused", "request-head-timeout", {{"limit_ms", limits.head_timeout.count()}});
    sendError(
        fd, 408, "request-head-timeout",
        "request head not complete within " + std::to_string(limits.head_timeout.count()) + " ms");
  } else if (state.in_message) {
    refused("request refused", "idle-timeout", {{"limit_ms", limits.idle_timeout.count()}});
    sendError(fd, 408, "idle-timeout",
              "request body stalled for " + std::to_string(limits.idle_timeout.count()) + " ms");
  } else {
    // Between requests a close is the ordinary end of keep-alive (RFC 9112 §9.5): no answer,
    // and nothing to warn about.
    common::log::info("connection closed",
                      {{"reason", "idle-timeout"}, {"limit_ms", limits.idle_timeout.count()}});
    if (refusals) refusals("idle-timeout");
  }
  return false;
}

void HttpServer::Impl::serveConnection(common::UniqueFd fd) {
  llhttp_settings_t settings;
  llhttp_settings_init(&settings);
  settings.on_message_begin = onMessageBegin;
  settings.on_url = onUrl;
  settings.on_header_field = onHeaderField;
  settings.on_header_value = onHeaderValue;
  settings.on_headers_complete = onHeadersComplete;
  settings.on_body = onBody;
  settings.on_message_complete = onMessageComplete;
  llhttp_t parser;
  llhttp_init(&parser, HTTP_REQUEST, &settings);
  Parse state;
  state.fd = fd.get();
  state.bodies_held = &bodies_held;
  state.bodies_limit = limits.bodies_held;
  parser.data = &state;
  tl_stopping = &stopping;

  std::string buffer(kReadBuffer, '\0');
  bool open = true;
  while (open && !stopping.load()) {
    if (!setPhase(fd.get(), state.in_message ? Phase::kReceiving : Phase::kIdle)) break;
    if (!awaitBytes(fd.get(), state)) break;
    if (!setPhase(fd.get(), Phase::kReceiving)) break;
    const ssize_t n = ::recv(fd.get(), buffer.data(), buffer.size(), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    const char* data = buffer.data();
    size_t left = static_cast<size_t>(n);
    while (open && left > 0) {
      const llhttp_errno_t err = llhttp_execute(&parser, data, left);
      if (err == HPE_OK) break;  // everything consumed, the request is not complete yet
      if (err == HPE_PAUSED && state.complete) {
        const char* pos = llhttp_get_error_pos(&parser);
        left -= static_cast<size_t>(pos - data);
        data = pos;
        if (!setPhase(fd.get(), Phase::kHandling)) {
          open = false;
          break;
        }
        Request req = std::move(state.req);
        finishRequest(req);
        const bool head = req.method == "HEAD";
        ConnWriter out(fd.get(), llhttp_should_keep_alive(&parser) != 0,
                       parser.http_major == 1 && parser.http_minor == 0, head, &refusals);
        try {
          handler(req, out);
        } catch (const std::exception& e) {
          common::log::error("handler failed", {{"path", req.path}, {"error", e.what()}});
          if (!out.started()) sendError(fd.get(), 500, "internal-error", "internal error");
          open = false;
        }
        if (!out.started()) {
          sendError(fd.get(), 500, "internal-error", "no response");
          open = false;
        }
        if (!out.reusable()) open = false;
        state.releaseBody();
        llhttp_resume(&parser);
        continue;
      }
      if (err == HPE_PAUSED_UPGRADE || state.upgrade) {
        // No protocol upgrade here (RFC 9110 §7.8: a server may ignore Upgrade, but the
        // bytes after the head would be the other protocol's): refuse and close.
        refused("request refused", "upgrade-not-supported");
        sendError(fd.get(), 400, "upgrade-not-supported", "protocol upgrade is not supported");
      } else if (state.over_budget) {
        refused("request refused", "node-busy", {{"limit", limits.bodies_held}});
        sendError(fd.get(), 503, "node-busy",
                  "the node's request bodies already take the " +
                      std::to_string(limits.bodies_held >> 20) + " MiB they may (each counted at " +
                      std::to_string(kBodyMemoryFactor) +
                      "x its size, parsed copies included); retry later");
      } else if (state.body_too_large) {
        refused("request refused", "body-too-large");
        sendError(fd.get(), 413, "body-too-large",
                  "request body larger than " + std::to_string(kMaxRequestBody) + " bytes");
      } else if (state.too_many_fields) {
        refused("request refused", "head-too-large", {{"limit_fields", kMaxHeaderFields}});
        sendError(
            fd.get(), 431, "head-too-large",
            "request head has more than " + std::to_string(kMaxHeaderFields) + " header fields");
      } else if (state.trailer) {
        refused("request refused", "malformed-request", {{"detail", "trailer fields"}});
        sendError(fd.get(), 400, "malformed-request",
                  "trailer fields after a chunked body are not accepted");
      } else if (!state.bad_field_name.empty()) {
        refused("request refused", "malformed-request", {{"detail", "field name not a token"}});
        sendError(fd.get(), 400, "malformed-request",
                  "header field name \"" + state.bad_field_name +
                      "\" is not a token (RFC 9110 §5.1; no whitespace before the colon)");
      } else if (state.head_too_large) {
        refused("request refused", "head-too-large");
        sendError(fd.get(), 431, "head-too-large",
                  "request head larger than " + std::to_string(kMaxHeadBytes) + " bytes");
      } else {
        const char* reason = llhttp_get_error_reason(&parser);
        refused("request refused", "malformed-request", {{"detail", reason ? reason : ""}});
        sendError(fd.get(), 400, "malformed-request",
                  std::string("malformed request: ") + (reason ? reason : ""));
      }
      open = false;
    }
  }
  // Closed to make room while its request was still arriving (admit()): told so.
  if (state.in_message && evicted(fd.get())) {
    sendError(fd.get(), 408, "slow-request-evicted",
              "request not complete after " + std::to_string(limits.slow_request.count()) +
                  " ms while the node was full");
  }
  state.releaseBody();
  tl_stopping = nullptr;
  std::lock_guard lock(mu);
  conns.erase(fd.get());
  fd.reset();
  if (conns.empty()) idle.notify_all();
}

HttpServer::HttpServer(std::string socket_path, Handler handler, RefusalCounter refusals,
                       ServerLimits limits)
    : impl_(new Impl(std::move(socket_path), std::move(handler), std::move(refusals), limits)) {
  auto& im = *impl_;
  auto failWith = [&](const std::string& what) {
    const std::string msg = im.path + ": " + what + ": " + std::strerror(errno);
    delete impl_;
    impl_ = nullptr;
    throw std::runtime_error(msg);
  };
  sockaddr_un addr{};
  if (im.path.empty() || im.path.size() >= sizeof addr.sun_path) {
    errno = ENAMETOOLONG;
    failWith("socket path empty or too long");
  }
  struct stat st {};
  if (::lstat(im.path.c_str(), &st) == 0) {
    // Replace a stale socket of an earlier run; never delete anything else.
    if (!S_ISSOCK(st.st_mode)) {
      errno = EEXIST;
      failWith("exists and is not a socket");
    }
    // A socket that answers is another live node's: replacing it would cut that node off.
    const common::UniqueFd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un to{};
    to.sun_family = AF_UNIX;
    std::memcpy(to.sun_path, im.path.data(), im.path.size());
    if (probe.valid() && ::connect(probe.get(), reinterpret_cast<sockaddr*>(&to), sizeof to) == 0) {
      errno = EADDRINUSE;
      failWith("in use by another process");
    }
    if (::unlink(im.path.c_str()) != 0) failWith("cannot remove the old socket");
  }
  im.listener.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!im.listener.valid()) failWith("socket");
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, im.path.data(), im.path.size());
  // Created 0600 from the start (umask during bind): reaching the socket is a credential, so
  // there is no moment with wider permissions. Start-up is single-threaded here.
  const mode_t old = ::umask(0177);
  const int rc = ::bind(im.listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  ::umask(old);
  if (rc != 0) failWith("bind");
  if (::chmod(im.path.c_str(), 0600) != 0) failWith("chmod 0600");
  if (::listen(im.listener.get(), 128) != 0) failWith("listen");
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) failWith("pipe");
  im.wake_read.reset(pipe_fds[0]);
  im.wake_write.reset(pipe_fds[1]);
}

HttpServer::~HttpServer() {
  if (impl_ != nullptr) {
    stop();
    std::unique_lock lock(impl_->mu);
    impl_->idle.wait(lock, [&] { return impl_->conns.empty(); });
  }
  delete impl_;
}

void HttpServer::serve() {
  auto& im = *impl_;
  while (!im.stopping.load()) {
    pollfd fds[2] = {{im.listener.get(), POLLIN, 0}, {im.wake_read.get(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      common::log::error("poll failed", {{"error", std::strerror(errno)}});
      break;
    }
    if (fds[1].revents != 0 || im.stopping.load()) break;
    if ((fds[0].revents & POLLIN) == 0) continue;
    common::UniqueFd conn(::accept4(im.listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!conn.valid()) continue;  // EINTR, ECONNABORTED, EMFILE: keep accepting
    ucred cred{};
    socklen_t cred_len = sizeof cred;
    if (::getsockopt(conn.get(), SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) != 0) cred.pid = 0;
    std::unique_lock lock(im.mu);
    std::string refusal;
    if (!im.admit(cred.pid, refusal)) {
      lock.unlock();
      const size_t limit =
          refusal == "connections" ? im.limits.connections : im.limits.connections_per_peer;
      im.refused("connection refused", "too-many-connections",
                 {{"limit", limit}, {"counted", refusal}, {"peer_pid", cred.pid}});
      sendError(conn.get(), 503, "too-many-connections",
                "too many connections (" + std::to_string(limit) + " " + refusal + ")");
      continue;
    }
    im.conns[conn.get()].peer = cred.pid;
    // A write that makes no progress for this long fails (EAGAIN), and the connection closes.
    const auto ms = im.limits.send_timeout.count();
    const timeval send_timeout{static_cast<time_t>(ms / 1000),
                               static_cast<suseconds_t>((ms % 1000) * 1000)};
    ::setsockopt(conn.get(), SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof send_timeout);
    lock.unlock();
    std::thread([&im, c = std::move(conn)]() mutable {
      im.serveConnection(std::move(c));
    }).detach();
  }
  // Wake every connection thread blocked in recv; handlers see their next write fail.
  std::unique_lock lock(im.mu);
  for (const auto& [fd, c] : im.conns) ::shutdown(fd, SHUT_RDWR);
  im.idle.wait(lock, [&] { return im.conns.empty(); });
}

void HttpServer::stop() {
  impl_->stopping.store(true);
  const char byte = 1;
  [[maybe_unused]] const ssize_t n = ::write(impl_->wake_write.get(), &byte, 1);
}

}  // namespace samnode
