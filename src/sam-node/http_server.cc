#include <fcntl.h>
#include <llhttp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

#include "common/log.h"
#include "common/unique_fd.h"
#include "sam-node/http.h"

namespace samnode {
namespace {

// Request line plus header fields; a larger head is answered 431 (RFC 6585 §5).
constexpr size_t kMaxHeadBytes = size_t{64} * 1024;
constexpr size_t kReadBuffer = size_t{64} * 1024;

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

std::string_view reasonPhrase(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 201:
      return "Created";
    case 202:
      return "Accepted";
    case 204:
      return "No Content";
    case 206:
      return "Partial Content";
    case 301:
      return "Moved Permanently";
    case 302:
      return "Found";
    case 304:
      return "Not Modified";
    case 307:
      return "Temporary Redirect";
    case 308:
      return "Permanent Redirect";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 409:
      return "Conflict";
    case 413:
      return "Content Too Large";
    case 415:
      return "Unsupported Media Type";
    case 422:
      return "Unprocessable Content";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 502:
      return "Bad Gateway";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    default:
      return "Status";
  }
}

// Fields the writer owns (RFC 9110 §7.6.1 connection-specific fields and framing).
bool isHopByHop(std::string_view name) {
  for (std::string_view h : {"connection", "transfer-encoding", "content-length", "keep-alive",
                             "proxy-connection", "te", "trailer", "upgrade"})
    if (iequals(name, h)) return true;
  return false;
}

bool writeAll(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

class ConnWriter : public ResponseWriter {
 public:
  ConnWriter(int fd, bool keep_alive, bool http10, bool head)
      : fd_(fd), keep_alive_(keep_alive), http10_(http10), head_(head) {}

  bool send(int status, const Headers& headers, std::string_view body) override {
    if (!begin(status, headers, body.size())) return false;
    if (!write(body)) return false;
    return finish();
  }

  bool begin(int status, const Headers& headers, std::optional<size_t> content_length) override {
    if (started_) return false;
    started_ = true;
    no_body_ = head_ || status == 204 || status == 304 || (status >= 100 && status < 200);
    std::string out = "HTTP/1.1 " + std::to_string(status) + " ";
    out += reasonPhrase(status);
    out += "\r\n";
    for (const auto& [name, value] : headers) {
      if (isHopByHop(name)) continue;
      out += name + ": " + value + "\r\n";
    }
    if (content_length) {
      remaining_ = *content_length;
      if (status != 204 && status != 304)
        out += "Content-Length: " + std::to_string(*content_length) + "\r\n";
    } else if (!no_body_) {
      // An HTTP/1.0 client cannot read chunks: the body ends when the connection closes.
      chunked_ = !http10_;
      if (!chunked_) keep_alive_ = false;
      if (chunked_) out += "Transfer-Encoding: chunked\r\n";
    }
    out += keep_alive_ ? (http10_ ? "Connection: keep-alive\r\n" : "") : "Connection: close\r\n";
    out += "\r\n";
    return ok_ = writeAll(fd_, out);
  }

  bool write(std::string_view data) override {
    if (!started_ || finished_ || !ok_) return false;
    if (data.empty()) return true;
    if (no_body_) return true;
    if (remaining_) {
      if (data.size() > *remaining_) return ok_ = false;  // more than announced: a bug upstream
      *remaining_ -= data.size();
      return ok_ = writeAll(fd_, data);
    }
    if (chunked_) {
      char size[32];
      const int n = std::snprintf(size, sizeof size, "%zx\r\n", data.size());
      std::string frame(size, static_cast<size_t>(n));
      frame.append(data);
      frame += "\r\n";
      return ok_ = writeAll(fd_, frame);
    }
    return ok_ = writeAll(fd_, data);
  }

  bool finish() override {
    if (!started_ || finished_ || !ok_) return false;
    finished_ = true;
    if (remaining_ && *remaining_ != 0 && !no_body_) return ok_ = false;
    if (chunked_) return ok_ = writeAll(fd_, "0\r\n\r\n");
    return true;
  }

  [[nodiscard]] bool started() const override { return started_; }
  /// True if the connection may carry another request after this response.
  [[nodiscard]] bool reusable() const { return ok_ && finished_ && keep_alive_; }

 private:
  int fd_;
  bool keep_alive_, http10_, head_;
  bool started_ = false, finished_ = false, ok_ = true, chunked_ = false, no_body_ = false;
  std::optional<size_t> remaining_;
};

// Parser state of one connection; llhttp calls back into it.
struct Parse {
  Request req;
  bool in_value = false;
  size_t head_bytes = 0;
  bool head_too_large = false;
  bool body_too_large = false;
  bool complete = false;
  int fd = -1;

  static Parse& of(llhttp_t* p) { return *static_cast<Parse*>(p->data); }
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
  s.complete = false;
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
  if (!s.countHead(len)) return -1;
  if (s.in_value || s.req.headers.empty()) {
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
  s.req.method = llhttp_method_name(static_cast<llhttp_method_t>(p->method));
  // A declared length over the cap is refused before any of the body is read.
  if ((p->flags & F_CONTENT_LENGTH) != 0 && p->content_length > kMaxRequestBody) {
    s.body_too_large = true;
    return -1;
  }
  auto expect = findHeader(s.req.headers, "expect");
  if (expect && iequals(*expect, "100-continue") && p->http_minor >= 1)
    writeAll(s.fd, "HTTP/1.1 100 Continue\r\n\r\n");
  return 0;
}

int onBody(llhttp_t* p, const char* at, size_t len) {
  Parse& s = Parse::of(p);
  if (s.req.body.size() + len > kMaxRequestBody) {
    s.body_too_large = true;
    return -1;
  }
  s.req.body.append(at, len);
  return 0;
}

int onMessageComplete(llhttp_t* p) {
  Parse::of(p).complete = true;
  return HPE_PAUSED;  // handle this request before parsing a pipelined next one
}

void finishRequest(Request& req) {
  const auto q = req.target.find('?');
  req.path = req.target.substr(0, q);
  req.query = q == std::string::npos ? "" : req.target.substr(q + 1);
  req.agent = findHeader(req.headers, "x-sam-agent").value_or("");
}

void sendError(int fd, int status, std::string_view message) {
  ConnWriter out(fd, false, false, false);
  sendJson(out, status,
           nlohmann::json{{"error", {{"message", message}, {"type", "sam_node_http"}}}}.dump());
}

}  // namespace

std::optional<std::string> findHeader(const Headers& headers, std::string_view name) {
  for (const auto& [k, v] : headers)
    if (iequals(k, name)) return v;
  return std::nullopt;
}

bool sendJson(ResponseWriter& out, int status, const std::string& json) {
  return out.send(status, {{"Content-Type", "application/json"}}, json);
}

struct HttpServer::Impl {
  std::string path;
  Handler handler;
  common::UniqueFd listener;
  common::UniqueFd wake_read, wake_write;
  std::mutex mu;
  std::condition_variable idle;
  std::set<int> conns;  // open connection fds, shut down by stop()
  std::atomic<bool> stopping{false};

  void serveConnection(common::UniqueFd fd);
};

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
  parser.data = &state;

  std::string buffer(kReadBuffer, '\0');
  bool open = true;
  while (open && !stopping.load()) {
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
        Request req = std::move(state.req);
        finishRequest(req);
        const bool head = req.method == "HEAD";
        ConnWriter out(fd.get(), llhttp_should_keep_alive(&parser) != 0,
                       parser.http_major == 1 && parser.http_minor == 0, head);
        try {
          handler(req, out);
        } catch (const std::exception& e) {
          common::log::error("handler failed", {{"path", req.path}, {"error", e.what()}});
          if (!out.started()) sendError(fd.get(), 500, "internal error");
          open = false;
        }
        if (!out.started()) {
          sendError(fd.get(), 500, "no response");
          open = false;
        }
        if (!out.reusable()) open = false;
        llhttp_resume(&parser);
        continue;
      }
      if (err == HPE_PAUSED_UPGRADE) {
        // No protocol upgrade here (RFC 9110 §7.8: a server may ignore Upgrade, but the
        // bytes after the head would be the other protocol's): refuse and close.
        sendError(fd.get(), 400, "protocol upgrade is not supported");
      } else if (state.body_too_large) {
        common::log::warn("request refused", {{"reason", "body-too-large"}});
        sendError(fd.get(), 413,
                  "request body larger than " + std::to_string(kMaxRequestBody) + " bytes");
      } else if (state.head_too_large) {
        common::log::warn("request refused", {{"reason", "head-too-large"}});
        sendError(fd.get(), 431,
                  "request head larger than " + std::to_string(kMaxHeadBytes) + " bytes");
      } else {
        const char* reason = llhttp_get_error_reason(&parser);
        common::log::warn("request refused",
                          {{"reason", "malformed-request"}, {"detail", reason ? reason : ""}});
        sendError(fd.get(), 400, std::string("malformed request: ") + (reason ? reason : ""));
      }
      open = false;
    }
  }
  std::lock_guard lock(mu);
  conns.erase(fd.get());
  fd.reset();
  if (conns.empty()) idle.notify_all();
}

HttpServer::HttpServer(std::string socket_path, Handler handler)
    : impl_(new Impl{std::move(socket_path), std::move(handler), {}, {}, {}, {}, {}, {}, {}}) {
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
    std::unique_lock lock(im.mu);
    if (im.conns.size() >= kMaxConnections) {
      lock.unlock();
      common::log::warn("connection refused",
                        {{"reason", "too-many-connections"}, {"limit", kMaxConnections}});
      sendError(conn.get(), 503, "too many connections");
      continue;
    }
    im.conns.insert(conn.get());
    lock.unlock();
    std::thread([&im, c = std::move(conn)]() mutable {
      im.serveConnection(std::move(c));
    }).detach();
  }
  // Wake every connection thread blocked in recv; handlers see their next write fail.
  std::unique_lock lock(im.mu);
  for (int fd : im.conns) ::shutdown(fd, SHUT_RDWR);
  im.idle.wait(lock, [&] { return im.conns.empty(); });
}

void HttpServer::stop() {
  impl_->stopping.store(true);
  const char byte = 1;
  [[maybe_unused]] const ssize_t n = ::write(impl_->wake_write.get(), &byte, 1);
}

}  // namespace samnode
