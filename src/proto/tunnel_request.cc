#include "proto/tunnel_request.h"

#include "proto/http_syntax.h"

#include <llhttp.h>

#include <algorithm>
#include <cctype>

namespace proto {
namespace {

const std::string* findHeader(const TunnelRequest& req, std::string_view name) {
  for (const auto& [k, v] : req.headers) {
    if (equalsIgnoreCase(k, name)) return &v;
  }
  return nullptr;
}

// True if the comma-separated header value lists `token` (RFC 9110 §5.6.1).
bool listsToken(std::string_view value, std::string_view token) {
  while (!value.empty()) {
    const size_t comma = value.find(',');
    std::string_view item = value.substr(0, comma);
    while (!item.empty() && (item.front() == ' ' || item.front() == '\t')) item.remove_prefix(1);
    while (!item.empty() && (item.back() == ' ' || item.back() == '\t')) item.remove_suffix(1);
    if (equalsIgnoreCase(item, token)) return true;
    if (comma == std::string_view::npos) break;
    value.remove_prefix(comma + 1);
  }
  return false;
}

int hexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool percentDecode(std::string_view in, std::string* out) {
  out->clear();
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out->push_back(in[i]);
      continue;
    }
    if (i + 2 >= in.size()) return false;
    const int hi = hexValue(in[i + 1]);
    const int lo = hexValue(in[i + 2]);
    if (hi < 0 || lo < 0) return false;
    out->push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return true;
}

}  // namespace

struct TunnelRequestParser::Llhttp {
  llhttp_t parser{};
  llhttp_settings_t settings{};
  TunnelRequestParser* owner = nullptr;

  static TunnelRequestParser& self(llhttp_t* p) { return *static_cast<Llhttp*>(p->data)->owner; }
  static int onMethod(llhttp_t* p, const char* at, size_t n) {
    self(p).head_.appendMethod(at, n);
    return 0;
  }
  static int onUrl(llhttp_t* p, const char* at, size_t n) {
    self(p).head_.appendTarget(at, n);
    return 0;
  }
  static int onHeaderField(llhttp_t* p, const char* at, size_t n) {
    return self(p).head_.appendFieldName(at, n) ? 0 : HPE_USER;
  }
  static int onHeaderValue(llhttp_t* p, const char* at, size_t n) {
    self(p).head_.appendFieldValue(at, n);
    return 0;
  }
  static int onHeadersComplete(llhttp_t* p) {
    self(p).headers_done_ = true;
    return HPE_PAUSED;  // stop at the end of the head: what follows belongs to the tunnel
  }
};

TunnelRequestParser::TunnelRequestParser() : llhttp_(std::make_unique<Llhttp>()) {
  llhttp_->owner = this;
  llhttp_settings_init(&llhttp_->settings);
  llhttp_->settings.on_method = &Llhttp::onMethod;
  llhttp_->settings.on_url = &Llhttp::onUrl;
  llhttp_->settings.on_header_field = &Llhttp::onHeaderField;
  llhttp_->settings.on_header_value = &Llhttp::onHeaderValue;
  llhttp_->settings.on_headers_complete = &Llhttp::onHeadersComplete;
  llhttp_init(&llhttp_->parser, HTTP_REQUEST, &llhttp_->settings);
  llhttp_->parser.data = llhttp_.get();
}

TunnelRequestParser::~TunnelRequestParser() = default;

TunnelRequestParser::Status TunnelRequestParser::feed(std::string_view data) {
  if (status_ != Status::kNeedMore) return status_;
  const llhttp_errno_t err = llhttp_execute(&llhttp_->parser, data.data(), data.size());
  size_t used = data.size();
  if (err == HPE_PAUSED && headers_done_) {
    used = static_cast<size_t>(llhttp_get_error_pos(&llhttp_->parser) - data.data());
  } else if (err != HPE_OK) {
    if (head_bytes_ + used > kMaxRequestHeadBytes) return status_ = Status::kTooLarge;
    error_ = err == HPE_USER ? "too many header fields" : llhttp_get_error_reason(&llhttp_->parser);
    return status_ = err == HPE_USER ? Status::kTooLarge : Status::kMalformed;
  }
  head_bytes_ += used;
  if (head_bytes_ > kMaxRequestHeadBytes) return status_ = Status::kTooLarge;
  if (!headers_done_) return Status::kNeedMore;
  consumed_ = used;
  return status_ = finish();
}

TunnelRequestParser::Status TunnelRequestParser::finish() {
  request_.headers = std::move(head_.headers);
  if (llhttp_->parser.http_major != 1 || llhttp_->parser.http_minor != 1) {
    error_ = "only HTTP/1.1 is spoken here";
    return Status::kMalformed;
  }
  // A tunnel request carries no body; a framing header here would desynchronise the stream.
  if (findHeader(request_, "content-length") || findHeader(request_, "transfer-encoding")) {
    error_ = "a tunnel request must not carry a body";
    return Status::kMalformed;
  }
  if (head_.method == "CONNECT") {
    request_.kind = TunnelKind::kConnectTcp;
    request_.authority = head_.target;
    return Status::kComplete;
  }
  if (head_.method == "GET") {
    const std::string* upgrade = findHeader(request_, "upgrade");
    const std::string* connection = findHeader(request_, "connection");
    if (upgrade == nullptr || !equalsIgnoreCase(*upgrade, "connect-udp")) {
      error_ = "only CONNECT and connect-udp upgrades are served";
      return Status::kMethodNotAllowed;
    }
    if (connection == nullptr || !listsToken(*connection, "upgrade")) {
      error_ = "connect-udp needs Connection: Upgrade";
      return Status::kMalformed;
    }
    const std::string* capsule = findHeader(request_, "capsule-protocol");
    if (capsule == nullptr || *capsule != "?1") {
      error_ = "connect-udp needs Capsule-Protocol: ?1";
      return Status::kMalformed;
    }
    if (!connectUdpAuthority(head_.target, &request_.authority, &error_)) return Status::kMalformed;
    request_.kind = TunnelKind::kConnectUdp;
    return Status::kComplete;
  }
  error_ = "method " + head_.method + " is not served";
  return Status::kMethodNotAllowed;
}

bool connectUdpAuthority(std::string_view path, std::string* authority, std::string* reason) {
  constexpr std::string_view kPrefix = "/.well-known/masque/udp/";
  if (path.substr(0, kPrefix.size()) != kPrefix) {
    *reason = "connect-udp path must start with " + std::string(kPrefix);
    return false;
  }
  path.remove_prefix(kPrefix.size());
  const size_t slash = path.find('/');
  if (slash == std::string_view::npos || path.size() < slash + 2 || path.back() != '/') {
    *reason = "connect-udp path must be " + std::string(kPrefix) + "{host}/{port}/";
    return false;
  }
  const std::string_view host_enc = path.substr(0, slash);
  const std::string_view port_enc = path.substr(slash + 1, path.size() - slash - 2);
  std::string host;
  std::string port;
  if (host_enc.empty() || port_enc.empty() || port_enc.find('/') != std::string_view::npos ||
      !percentDecode(host_enc, &host) || !percentDecode(port_enc, &port)) {
    *reason = "connect-udp path has a bad host or port segment";
    return false;
  }
  *authority = host.find(':') != std::string::npos ? "[" + host + "]:" + port : host + ":" + port;
  return true;
}

std::string_view reasonPhrase(int status) {
  switch (status) {
    case 400:
      return "Bad Request";
    case 403:
      return "Forbidden";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 421:
      return "Misdirected Request";
    case 431:
      return "Request Header Fields Too Large";
    case 502:
      return "Bad Gateway";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    default:
      return {};
  }
}

std::string errorResponse(int code, std::string_view reason) {
  std::string_view phrase = reasonPhrase(code);
  if (phrase.empty()) phrase = "Error";
  std::string body = std::string(reason.empty() ? phrase : reason) + "\n";
  std::string out = "HTTP/1.1 " + std::to_string(code) + " " + std::string(phrase) + "\r\n";
  if (!reason.empty()) out += "Boundary-Reason: " + std::string(reason) + "\r\n";
  out += "Content-Type: text/plain\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\nConnection: close\r\n\r\n" + body;
  return out;
}

std::string successResponse(TunnelKind kind) {
  if (kind == TunnelKind::kConnectTcp) return "HTTP/1.1 200 Connection Established\r\n\r\n";
  return "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: connect-udp\r\n"
         "Capsule-Protocol: ?1\r\n\r\n";
}

}  // namespace proto
