#include "proto/request_rewriter.h"

#include "proto/http_syntax.h"

#include <llhttp.h>

#include <algorithm>
#include <cctype>

namespace proto {
namespace {

// Returns why the parsed head must not be forwarded, or nullptr. The node must see exactly
// what the boundary saw: a name llhttp tolerates but another parser reads differently
// ("X-Pad : x") could end the node's header section early and smuggle the rest.
const char* headProblem(std::string_view method, std::string_view url, unsigned major,
                        unsigned minor,
                        const std::vector<std::pair<std::string, std::string>>& headers) {
  if (major != 1 || minor > 1) return "only HTTP/1.0 and HTTP/1.1 are forwarded";
  if (!isToken(method)) return "method is not a token";
  // An upgraded or CONNECTed stream could not be rewritten any more, so neither is served.
  if (method == "CONNECT") return "CONNECT is not served inside the mesh tunnel";
  if (!isOriginFormTarget(url)) return "request target must be origin-form (\"/path\")";
  for (const auto& [name, value] : headers) {
    if (!isToken(name)) return "header field name is not a token";
    if (!isFieldValue(value)) return "header field value has a control character";
    if (equalsIgnoreCase(name, "upgrade")) return "Upgrade is not served inside the mesh tunnel";
  }
  return nullptr;
}

}  // namespace

struct RequestStreamRewriter::Llhttp {
  llhttp_t parser{};
  llhttp_settings_t settings{};
  RequestStreamRewriter* owner = nullptr;

  static RequestStreamRewriter& self(llhttp_t* p) { return *static_cast<Llhttp*>(p->data)->owner; }
  static int onMessageBegin(llhttp_t* p) {
    self(p).head_.clear();
    return 0;
  }
  static int onMethod(llhttp_t* p, const char* at, size_t n) {
    self(p).head_.appendMethod(at, n);
    return 0;
  }
  static int onUrl(llhttp_t* p, const char* at, size_t n) {
    self(p).head_.appendTarget(at, n);
    return 0;
  }
  static int onHeaderField(llhttp_t* p, const char* at, size_t n) {
    auto& s = self(p);
    // Trailer fields arrive here after the body started; they travel inside the raw body
    // bytes, where they could not be rewritten, so a message with trailers is refused.
    if (!s.in_head_) {
      s.error_ = "trailer fields are not forwarded";
      return HPE_USER;
    }
    return s.head_.appendFieldName(at, n) ? 0 : HPE_USER;
  }
  static int onHeaderValue(llhttp_t* p, const char* at, size_t n) {
    self(p).head_.appendFieldValue(at, n);
    return 0;
  }
  static int onHeadersComplete(llhttp_t* p) {
    self(p).head_done_ = true;
    return HPE_PAUSED;  // the head is re-emitted before any body byte is copied
  }
  static int onMessageComplete(llhttp_t* p) {
    self(p).message_done_ = true;
    return HPE_PAUSED;  // body bytes end here: what follows is the next head, to be rewritten
  }
};

RequestStreamRewriter::RequestStreamRewriter(std::string header_name, std::string header_value)
    : llhttp_(std::make_unique<Llhttp>()),
      header_name_(std::move(header_name)),
      header_value_(std::move(header_value)) {
  llhttp_->owner = this;
  llhttp_settings_init(&llhttp_->settings);
  llhttp_->settings.on_message_begin = &Llhttp::onMessageBegin;
  llhttp_->settings.on_method = &Llhttp::onMethod;
  llhttp_->settings.on_url = &Llhttp::onUrl;
  llhttp_->settings.on_header_field = &Llhttp::onHeaderField;
  llhttp_->settings.on_header_value = &Llhttp::onHeaderValue;
  llhttp_->settings.on_headers_complete = &Llhttp::onHeadersComplete;
  llhttp_->settings.on_message_complete = &Llhttp::onMessageComplete;
  llhttp_init(&llhttp_->parser, HTTP_REQUEST, &llhttp_->settings);
  llhttp_->parser.data = llhttp_.get();
}

RequestStreamRewriter::~RequestStreamRewriter() = default;

void RequestStreamRewriter::emitHead(std::string* out) {
  const llhttp_t& p = llhttp_->parser;
  out->append(head_.method).append(" ").append(head_.target).append(" HTTP/");
  out->append(std::to_string(p.http_major)).append(".").append(std::to_string(p.http_minor));
  out->append("\r\n");
  for (const auto& [name, value] : head_.headers) {
    if (sameFieldName(name, header_name_)) continue;
    out->append(name).append(": ").append(value).append("\r\n");
  }
  if (!header_value_.empty())
    out->append(header_name_).append(": ").append(header_value_).append("\r\n");
  out->append("\r\n");
  ++requests_;
}

RequestStreamRewriter::Status RequestStreamRewriter::feed(std::string_view data, std::string* out) {
  if (status_ != Status::kOk) return status_;
  while (!data.empty()) {
    const llhttp_errno_t err = llhttp_execute(&llhttp_->parser, data.data(), data.size());
    size_t used = data.size();
    if (err == HPE_PAUSED || err == HPE_PAUSED_UPGRADE) {
      used = static_cast<size_t>(llhttp_get_error_pos(&llhttp_->parser) - data.data());
    } else if (err == HPE_USER && !in_head_) {
      return status_ = Status::kMalformed;  // error_ set by the trailer check
    } else if (err != HPE_OK) {
      error_ =
          err == HPE_USER ? "too many header fields" : llhttp_get_error_reason(&llhttp_->parser);
      return status_ = err == HPE_USER ? Status::kTooLarge : Status::kMalformed;
    }
    // Each pause splits the stream exactly at a head/body boundary, so a segment is either
    // all head (parsed into fields, re-emitted rewritten) or all body (copied as sent).
    if (in_head_) {
      head_bytes_ += used;
      if (head_bytes_ > kMaxRequestHeadBytes) {
        error_ = "request head too large";
        return status_ = Status::kTooLarge;
      }
    } else {
      out->append(data.substr(0, used));
    }
    if (head_done_) {
      const llhttp_t& p = llhttp_->parser;
      if (const char* problem =
              headProblem(head_.method, head_.target, p.http_major, p.http_minor, head_.headers)) {
        error_ = problem;
        return status_ = Status::kMalformed;
      }
      emitHead(out);
      head_done_ = false;
      in_head_ = false;
    }
    if (message_done_) {
      message_done_ = false;
      in_head_ = true;
      head_bytes_ = 0;
    }
    if (err == HPE_PAUSED_UPGRADE) {
      // Unreachable while Upgrade and CONNECT are refused above; refuse rather than relay raw.
      error_ = "upgraded streams are not forwarded";
      return status_ = Status::kMalformed;
    }
    if (err == HPE_PAUSED) llhttp_resume(&llhttp_->parser);
    data.remove_prefix(used);
  }
  return status_;
}

}  // namespace proto
