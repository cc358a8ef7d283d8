#include "sam-node/upstream.h"
#include "proto/http_syntax.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <vector>

#include "common/log.h"

namespace samnode {
namespace {

// Response fields dropped by onHeader since start (droppedResponseFields()).
std::atomic<uint64_t> g_dropped_fields{0};

// "scheme://authority" of `url`, for log lines: the path and query may carry what the caller
// put there, the origin names the upstream.
std::string_view origin(std::string_view url) {
  const auto scheme_end = url.find("://");
  if (scheme_end == std::string_view::npos) return {};
  return url.substr(0, url.find_first_of("/?#", scheme_end + 3));
}

// Fields libcurl derives from the request itself (framing, the URL's authority) or that
// belong to one connection only (RFC 9110 §7.6.1): a caller's copy would contradict it.
bool ownedByCurl(std::string_view name) {
  for (std::string_view h :
       {"host", "content-length", "transfer-encoding", "connection", "keep-alive",
        "proxy-connection", "te", "trailer", "upgrade", "expect"})
    if (proto::equalsIgnoreCase(name, h)) return true;
  return false;
}

void globalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// Idle easy handles, most recently used last (its connections are the likeliest to be alive).
class HandlePool {
 public:
  CURL* take() {
    {
      std::lock_guard lock(mu_);
      if (!idle_.empty()) {
        CURL* h = idle_.back();
        idle_.pop_back();
        return h;
      }
    }
    globalInit();
    return curl_easy_init();
  }

  // Options are cleared here, not at the next take(): they point into the finished request
  // (headers list, body, error buffer). Open connections stay with the handle.
  void give(CURL* h) {
    curl_easy_reset(h);
    {
      std::lock_guard lock(mu_);
      if (idle_.size() < kMaxIdleHandles) {
        idle_.push_back(h);
        return;
      }
    }
    curl_easy_cleanup(h);
  }

 private:
  std::mutex mu_;
  std::vector<CURL*> idle_;
};

// Never destroyed: a transfer may still finish on another thread while the process exits;
// the kernel closes the pooled connections.
HandlePool& pool() {
  static auto* p = new HandlePool;
  return *p;
}

// A fresh easy handle for a pinned request (upstream.h): it never enters the pool, so neither
// its DNS cache (holding the pin) nor its connections (opened to the pinned address) serve
// another request, and it starts with no connection opened to an address nobody checked.
struct PinnedHandleFree {
  // Reset first, as HandlePool::give() does: the options point into the finished request
  // (error buffer, socket callback data), which may be gone before the handle's connections
  // are closed.
  void operator()(CURL* h) const {
    curl_easy_reset(h);
    curl_easy_cleanup(h);
  }
};

// The addresses a pinned request may connect to, and the CURLOPT_RESOLVE list that makes
// libcurl connect there instead of resolving the name itself.
struct Pins {
  std::vector<std::array<unsigned char, 4>> v4;
  std::vector<std::array<unsigned char, 16>> v6;
  std::string refused;  // the first address the socket callback refused, for the error

  [[nodiscard]] bool permits(const curl_sockaddr& a) const {
    if (a.family == AF_INET && a.addrlen >= sizeof(sockaddr_in)) {
      std::array<unsigned char, 4> b{};
      std::memcpy(b.data(), &reinterpret_cast<const sockaddr_in*>(&a.addr)->sin_addr, b.size());
      return std::find(v4.begin(), v4.end(), b) != v4.end();
    }
    if (a.family == AF_INET6 && a.addrlen >= sizeof(sockaddr_in6)) {
      std::array<unsigned char, 16> b{};
      std::memcpy(b.data(), &reinterpret_cast<const sockaddr_in6*>(&a.addr)->sin6_addr, b.size());
      return std::find(v6.begin(), v6.end(), b) != v6.end();
    }
    return false;
  }
};

// Parses request.pinned_addresses and builds "host:port:a,[b]" for the URL's host and port
// (its scheme's default port when it names none). Throws UpstreamError.
std::string pinnedResolveEntry(const UpstreamRequest& request, Pins& pins) {
  std::unique_ptr<CURLU, decltype(&curl_url_cleanup)> url(curl_url(), curl_url_cleanup);
  if (!url || curl_url_set(url.get(), CURLUPART_URL, request.url.c_str(), 0) != CURLUE_OK)
    throw UpstreamError("cannot pin the request: the URL does not parse");
  auto part = [&](CURLUPart which, unsigned flags) {
    char* value = nullptr;
    if (curl_url_get(url.get(), which, &value, flags) != CURLUE_OK || value == nullptr)
      throw UpstreamError("cannot pin the request: the URL has no host or port");
    std::string out(value);
    curl_free(value);
    return out;
  };
  std::string entry =
      part(CURLUPART_HOST, 0) + ":" + part(CURLUPART_PORT, CURLU_DEFAULT_PORT) + ":";
  for (size_t i = 0; i < request.pinned_addresses.size(); ++i) {
    const std::string& text = request.pinned_addresses[i];
    if (i > 0) entry += ",";
    std::array<unsigned char, 4> b4{};
    std::array<unsigned char, 16> b6{};
    if (::inet_pton(AF_INET, text.c_str(), b4.data()) == 1) {
      pins.v4.push_back(b4);
      entry += text;
    } else if (::inet_pton(AF_INET6, text.c_str(), b6.data()) == 1) {
      pins.v6.push_back(b6);
      entry += "[" + text + "]";
    } else {
      throw UpstreamError("cannot pin the request to \"" + text + "\": not a numeric address");
    }
  }
  return entry;
}

// CURLOPT_OPENSOCKETFUNCTION of a pinned request: the last word on where it connects, should
// libcurl ever resolve the name itself (a resolve entry it could not use).
curl_socket_t openPinnedSocket(void* user, curlsocktype purpose, curl_sockaddr* address) {
  auto& pins = *static_cast<Pins*>(user);
  if (purpose != CURLSOCKTYPE_IPCXN || !pins.permits(*address)) {
    if (pins.refused.empty()) {
      char text[INET6_ADDRSTRLEN] = "?";
      const void* raw = address->family == AF_INET6
                            ? static_cast<const void*>(
                                  &reinterpret_cast<const sockaddr_in6*>(&address->addr)->sin6_addr)
                            : &reinterpret_cast<const sockaddr_in*>(&address->addr)->sin_addr;
      if (address->family == AF_INET || address->family == AF_INET6)
        ::inet_ntop(address->family, raw, text, sizeof text);
      pins.refused = text;
    }
    return CURL_SOCKET_BAD;
  }
  return ::socket(address->family, address->socktype | SOCK_CLOEXEC, address->protocol);
}

struct Transfer {
  std::string_view url;
  const std::function<bool(int, const Headers&)>* on_head = nullptr;
  const std::function<bool(std::string_view)>* on_data = nullptr;
  const std::atomic<bool>* cancel = nullptr;
  int status = 0;
  Headers headers;
  bool head_done = false;
  bool aborted = false;    // a callback said stop
  bool cancelled = false;  // the server is stopping, or the caller's cancel flag
  std::chrono::milliseconds idle_timeout{0};
  std::chrono::steady_clock::time_point last_byte = std::chrono::steady_clock::now();
  bool idled = false;  // idle_timeout passed
  std::exception_ptr error;
  bool last_field_kept = false;  // the field an obs-fold line would continue was kept
  bool drop_logged = false;      // one log line per response, however many fields it drops

  // Counts a dropped field and logs the first of the response, with why.
  void dropField(std::string_view reason) {
    last_field_kept = false;
    g_dropped_fields.fetch_add(1, std::memory_order_relaxed);
    if (drop_logged) return;
    drop_logged = true;
    common::log::warn("upstream response field dropped",
                      {{"upstream", origin(url)}, {"status", status}, {"reason", reason}});
  }

  // One field line (CRLF removed) of the response head: kept if it is a valid field,
  // appended to the previous field if it is an obs-fold continuation, else dropped. libcurl
  // splits lines at LF only, so a bare CR is still inside `line` here.
  void addField(std::string_view line) {
    if (line.front() == ' ' || line.front() == '\t') {
      // obs-fold (RFC 9112 §5.2): a gateway replaces it with SP before forwarding.
      if (!last_field_kept || headers.empty()) return dropField("obs-fold-after-dropped-field");
      while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
      std::string& value = headers.back().second;
      if (!line.empty()) value += (value.empty() ? "" : " ") + std::string(line);
      if (!proto::isFieldValue(value)) {
        headers.pop_back();
        dropField("bad-field-value");
      }
      return;
    }
    const auto colon = line.find(':');
    if (colon == std::string_view::npos) return dropField("no-colon");
    const std::string_view name = line.substr(0, colon);
    std::string_view value = line.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t'))
      value.remove_prefix(1);
    while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
    if (!proto::isToken(name)) return dropField("bad-field-name");
    if (!proto::isFieldValue(value)) return dropField("bad-field-value");
    headers.emplace_back(std::string(name), std::string(value));
    last_field_kept = true;
  }

  bool deliverHead() {
    head_done = true;
    return (*on_head)(status, headers);
  }
};

size_t onHeader(char* data, size_t size, size_t count, void* user) {
  auto& t = *static_cast<Transfer*>(user);
  const size_t n = size * count;
  t.last_byte = std::chrono::steady_clock::now();
  if (t.head_done) return n;  // trailers after a chunked body: not passed on
  // The line ends in CRLF (or a bare LF); only that ending is removed, so a CR inside the
  // line is seen (and refused) by addField.
  std::string_view line(data, n);
  if (line.ends_with('\n')) line.remove_suffix(1);
  if (line.ends_with('\r')) line.remove_suffix(1);
  try {
    if (line.starts_with("HTTP/")) {
      // A new status line: an interim (1xx) response's fields are discarded.
      t.headers.clear();
      t.last_field_kept = false;
      const auto sp = line.find(' ');
      t.status =
          sp == std::string_view::npos ? 0 : std::atoi(std::string(line.substr(sp + 1, 3)).c_str());
    } else if (line.empty()) {
      if (t.status >= 200 && !t.deliverHead()) {
        t.aborted = true;
        return 0;
      }
    } else {
      t.addField(line);
    }
  } catch (...) {
    t.error = std::current_exception();
    return 0;
  }
  return n;
}

size_t onWrite(char* data, size_t size, size_t count, void* user) {
  auto& t = *static_cast<Transfer*>(user);
  const size_t n = size * count;
  t.last_byte = std::chrono::steady_clock::now();
  try {
    if (!t.head_done && !t.deliverHead()) {
      t.aborted = true;
      return 0;
    }
    if (!(*t.on_data)(std::string_view(data, n))) {
      t.aborted = true;
      return 0;
    }
  } catch (...) {
    t.error = std::current_exception();
    return 0;
  }
  return n;
}

// Called by libcurl at least once a second during a transfer, and on progress.
int onProgress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto& t = *static_cast<Transfer*>(user);
  if (stopRequested() || (t.cancel != nullptr && t.cancel->load())) {
    t.cancelled = true;
    return 1;  // CURLE_ABORTED_BY_CALLBACK
  }
  if (t.idle_timeout.count() > 0 &&
      std::chrono::steady_clock::now() - t.last_byte > t.idle_timeout) {
    t.idled = true;
    return 1;
  }
  return 0;
}

}  // namespace

bool stream(const UpstreamRequest& request, const std::function<bool(int, const Headers&)>& on_head,
            const std::function<bool(std::string_view)>& on_data) {
  const bool pinned = !request.pinned_addresses.empty();
  Pins pins;
  std::unique_ptr<curl_slist, decltype(&curl_slist_free_all)> resolve(nullptr, curl_slist_free_all);
  if (pinned) {
    resolve.reset(curl_slist_append(nullptr, pinnedResolveEntry(request, pins).c_str()));
    if (!resolve) throw UpstreamError("out of memory building the request");
  }
  auto giveBack = [](CURL* h) { pool().give(h); };
  std::unique_ptr<CURL, decltype(giveBack)> pooled(nullptr, giveBack);
  std::unique_ptr<CURL, PinnedHandleFree> own;
  if (pinned) {
    globalInit();
    own.reset(curl_easy_init());
  } else {
    pooled.reset(pool().take());
  }
  CURL* h = pinned ? own.get() : pooled.get();
  if (h == nullptr) throw UpstreamError("cannot create a libcurl handle");
  char errbuf[CURL_ERROR_SIZE] = {};
  Transfer t;
  t.url = request.url;
  t.on_head = &on_head;
  t.on_data = &on_data;
  t.cancel = request.cancel;
  t.idle_timeout = request.idle_timeout;

  std::unique_ptr<curl_slist, decltype(&curl_slist_free_all)> list(nullptr, curl_slist_free_all);
  auto append = [&](const std::string& line) {
    curl_slist* next = curl_slist_append(list.get(), line.c_str());
    if (next == nullptr) throw UpstreamError("out of memory building the request");
    static_cast<void>(list.release());  // `next` is the same list, grown
    list.reset(next);
  };
  for (const auto& [name, value] : request.headers) {
    if (ownedByCurl(name)) continue;
    // "Name;" is libcurl's spelling of a field with an empty value.
    append(value.empty() ? name + ";" : name + ": " + value);
  }
  // libcurl would add "Expect: 100-continue" to large bodies and wait for an answer that
  // not every upstream sends, and "Accept: */*" to a request that had none.
  append("Expect:");
  if (!findHeader(request.headers, "accept")) append("Accept:");

  curl_easy_setopt(h, CURLOPT_URL, request.url.c_str());
  // The path goes out exactly as the route checked it (proxy.h pathProblem): libcurl would
  // otherwise resolve "/base/../x" itself, to a path outside the base.
  curl_easy_setopt(h, CURLOPT_PATH_AS_IS, 1L);
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);  // a redirect is the caller's answer
  if (pinned) {
    curl_easy_setopt(h, CURLOPT_RESOLVE, resolve.get());
    curl_easy_setopt(h, CURLOPT_OPENSOCKETFUNCTION, openPinnedSocket);
    curl_easy_setopt(h, CURLOPT_OPENSOCKETDATA, &pins);
    curl_easy_setopt(h, CURLOPT_PROXY, "");  // a proxy would resolve the name again
  }
  curl_easy_setopt(h, CURLOPT_FRESH_CONNECT, request.fresh_connection ? 1L : 0L);
  curl_easy_setopt(h, CURLOPT_FORBID_REUSE, request.fresh_connection ? 1L : 0L);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(request.connect_timeout.count()));
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, static_cast<long>(request.total_timeout.count()));
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, list.get());
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, onHeader);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, onWrite);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, onProgress);
  curl_easy_setopt(h, CURLOPT_XFERINFODATA, &t);
  if (request.method == "HEAD") {
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  } else if (request.method == "GET" && request.body.empty()) {
    curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
  } else {
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, request.method.c_str());
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(request.body.size()));
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, request.body.data());
  }

  const CURLcode rc = curl_easy_perform(h);
  if (t.error) std::rethrow_exception(t.error);
  if (rc == CURLE_OK) {
    // A response without a body (HEAD, 204, Content-Length: 0) never called onWrite.
    if (!t.head_done) {
      if (t.status < 200) throw UpstreamError("upstream sent no final response");
      if (!t.deliverHead()) return false;
    }
    return true;
  }
  if (t.aborted) return false;
  if (t.cancelled && !t.head_done) throw UpstreamCancelled("cancelled: the node is stopping");
  if (t.idled && !t.head_done) {
    throw UpstreamError("no answer within " + std::to_string(t.idle_timeout.count()) + " ms");
  }
  if (!t.head_done) {
    if (!pins.refused.empty() && rc == CURLE_COULDNT_CONNECT)
      throw UpstreamError("refused to connect to " + pins.refused +
                          ": not one of the addresses the request is pinned to");
    throw UpstreamError(std::string(curl_easy_strerror(rc)) + (errbuf[0] ? ": " : "") + errbuf);
  }
  return false;
}

uint64_t droppedResponseFields() { return g_dropped_fields.load(std::memory_order_relaxed); }

UpstreamResponse fetch(const UpstreamRequest& request, size_t max_body) {
  UpstreamResponse response;
  bool too_large = false;
  const bool complete = stream(
      request,
      [&](int status, const Headers& headers) {
        response.status = status;
        response.headers = headers;
        return true;
      },
      [&](std::string_view data) {
        if (response.body.size() + data.size() > max_body) {
          too_large = true;
          return false;
        }
        response.body.append(data);
        return true;
      });
  if (too_large)
    throw UpstreamError("response body larger than " + std::to_string(max_body) + " bytes");
  if (!complete) throw UpstreamError("response ended before its body was complete");
  return response;
}

}  // namespace samnode
