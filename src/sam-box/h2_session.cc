// The HTTP/2 connection: nghttp2's server session driven by one reader and one writer
// coroutine over the agent's socket. See h2_session.h; the per-stream routes are in
// h2_routes.cc.

#include "sam-box/h2_session.h"

#include "common/log.h"
#include "proto/request_head.h"
#include "sam-box/limits.h"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/redirect_error.hpp>
#include <asio/this_coro.hpp>
#include <asio/write.hpp>

#include <algorithm>
#include <array>
#include <cstring>

namespace sambox {

using asio::use_awaitable;
using asio::experimental::awaitable_operators::operator||;

namespace {

constexpr std::string_view kPrefaceLine = "PRI * HTTP/2.0\r\n";
/// Frames gathered from nghttp2 before one write(2).
constexpr size_t kWriteBatchBytes = size_t{64} * 1024;

/// Waits until `signal` is cancelled (a wake-up) or the coroutine is cancelled.
asio::awaitable<void> waitSignal(asio::steady_timer& signal) {
  signal.expires_at(asio::steady_timer::time_point::max());
  asio::error_code ec;
  co_await signal.async_wait(asio::redirect_error(use_awaitable, ec));
}

H2Session& sessionOf(void* self) { return *static_cast<H2Session*>(self); }

}  // namespace

PrefaceMatch matchH2Preface(std::string_view first_bytes) {
  const size_t n = std::min(first_bytes.size(), kPrefaceLine.size());
  if (first_bytes.substr(0, n) != kPrefaceLine.substr(0, n)) return PrefaceMatch::kNo;
  return n == kPrefaceLine.size() ? PrefaceMatch::kYes : PrefaceMatch::kMaybe;
}

asio::awaitable<void> serveH2Connection(Server& server, asio::local::stream_protocol::socket agent,
                                        std::string received) {
  auto session = std::make_shared<H2Session>(server, std::move(agent));
  co_await session->run(std::move(received));
}

H2Session::H2Session(Server& server, asio::local::stream_protocol::socket agent)
    : server_(server),
      agent_(std::move(agent)),
      write_signal_(agent_.get_executor()),
      open_(server.open_flows_, [this] {
        stopped_ = !dead_;  // a connection already gone ended its streams itself
        asio::error_code ignored;
        agent_.close(ignored);  // ends the reader and the writer, then every stream (run())
      }) {
  nghttp2_session_callbacks* cb = nullptr;
  nghttp2_session_callbacks_new(&cb);
  nghttp2_session_callbacks_set_on_begin_headers_callback(cb, onBeginHeaders);
  nghttp2_session_callbacks_set_on_header_callback(cb, onHeader);
  nghttp2_session_callbacks_set_on_frame_recv_callback(cb, onFrameRecv);
  nghttp2_session_callbacks_set_on_frame_send_callback(cb, onFrameSend);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, onDataChunk);
  nghttp2_session_callbacks_set_on_stream_close_callback(cb, onStreamClose);
  nghttp2_session_callbacks_set_error_callback2(cb, onError);
  nghttp2_option* opt = nullptr;
  nghttp2_option_new(&opt);
  // Credit DATA only once the upstream took it: that is the memory bound (h2_session.h).
  nghttp2_option_set_no_auto_window_update(opt, 1);
  // The request checks are ours (h2_routes.cc), so that a malformed request gets a 400 with
  // boundary-reason on its stream instead of a bare RST_STREAM.
  nghttp2_option_set_no_http_messaging(opt, 1);
  // No priority tree: closed streams need not be remembered.
  nghttp2_option_set_no_closed_streams(opt, 1);
  nghttp2_session_server_new2(&session_, cb, this, opt);
  nghttp2_option_del(opt);
  nghttp2_session_callbacks_del(cb);
}

H2Session::~H2Session() {
  dead_ = true;
  if (session_ != nullptr) nghttp2_session_del(session_);
}

std::shared_ptr<H2Stream> H2Session::find(int32_t id) {
  auto it = streams_.find(id);
  return it == streams_.end() ? nullptr : it->second;
}

asio::awaitable<void> H2Session::run(std::string received) {
  auto self = shared_from_this();
  const std::array<nghttp2_settings_entry, 4> settings{{
      {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, static_cast<uint32_t>(kMaxConcurrentFlows)},
      {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, static_cast<uint32_t>(kH2StreamWindowBytes)},
      {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, static_cast<uint32_t>(proto::kMaxRequestHeadBytes)},
      {NGHTTP2_SETTINGS_ENABLE_CONNECT_PROTOCOL, 1},  // RFC 8441 §3: extended CONNECT
  }};
  nghttp2_submit_settings(session_, NGHTTP2_FLAG_NONE, settings.data(), settings.size());
  nghttp2_session_set_local_window_size(session_, NGHTTP2_FLAG_NONE, 0, kH2ConnectionWindowBytes);
  co_await (readLoop(std::move(received)) || writeLoop() || idleConnection());

  // The connection is gone: end every stream; their routes close their upstreams and log.
  dead_ = true;
  auto streams = std::move(streams_);
  streams_.clear();
  streamsGone(streams.size());
  for (auto& [id, s] : streams) {
    s->closed = true;
    s->in_signal.cancel();
    s->out_signal.cancel();
    if (s->cancel) s->cancel();
  }
  asio::error_code ignored;
  agent_.close(ignored);
}

void H2Session::streamsGone(size_t n) {
  server_.h2_streams_ -= n;
  if (server_.h2_waiting_ > 0 && server_.h2_streams_ < kMaxH2Streams) server_.h2_room_.cancel();
}

asio::awaitable<void> H2Session::roomForStreams() {
  while (server_.h2_streams_ >= kMaxH2Streams && !dead_) {
    ++server_.h2_waiting_;
    paused_ = true;
    asio::error_code ec;
    co_await server_.h2_room_.async_wait(asio::redirect_error(use_awaitable, ec));
    --server_.h2_waiting_;
    paused_ = false;
    last_read_ = resumed_ = std::chrono::steady_clock::now();  // silence while paused was ours
    // h2_room_.cancel() is the wake-up; a cancelled coroutine (the connection ended) returns.
    const auto state = co_await asio::this_coro::cancellation_state;
    if (state.cancelled() != asio::cancellation_type::none) co_return;
  }
}

asio::awaitable<void> H2Session::readLoop(std::string received) {
  std::array<uint8_t, kReadBufferBytes> buf{};
  std::string_view pending = received;
  for (;;) {
    // Fed in pieces, each only while there is room for more streams (kMaxH2Streams): one
    // read's worth of 9-byte HEADERS frames would otherwise open 1,800 at once.
    while (!pending.empty() && !protocol_error_counted_) {
      co_await roomForStreams();
      if (dead_) co_return;
      const size_t piece = std::min(pending.size(), kH2RecvChunkBytes);
      const auto rv = nghttp2_session_mem_recv(
          session_, reinterpret_cast<const uint8_t*>(pending.data()), piece);
      pending.remove_prefix(piece);
      if (rv < 0) {
        protocolError(nghttp2_strerror(static_cast<int>(rv)));
        nghttp2_session_terminate_session(session_, NGHTTP2_PROTOCOL_ERROR);
      }
      kick();
    }
    // After a protocol error the agent's bytes are read and dropped until the GOAWAY is out.
    asio::error_code ec;
    const size_t n =
        co_await agent_.async_read_some(asio::buffer(buf), asio::redirect_error(use_awaitable, ec));
    if (ec) {
      common::log::debug("h2 connection ended by the agent", {{"error", ec.message()}});
      co_return;
    }
    pending = std::string_view(reinterpret_cast<const char*>(buf.data()), n);
    last_read_ = std::chrono::steady_clock::now();
  }
}

asio::awaitable<void> H2Session::idleConnection() {
  // Like an HTTP/1.1 tunnel, a connection with nothing on it may not hold its place (and its
  // file descriptor) forever.
  asio::steady_timer timer(agent_.get_executor());
  bool head_timed_out = false;
  for (;;) {
    timer.expires_after(kIdleCheckInterval);
    asio::error_code ec;
    co_await timer.async_wait(asio::redirect_error(use_awaitable, ec));
    if (ec) co_return;
    const auto now = std::chrono::steady_clock::now();
    if (streams_.empty() && now - last_read_ >= kTcpIdleTimeout) break;
    // A header block that was begun and not ended within the request head's own limit
    // (HEADERS without END_HEADERS, then nothing, or a CONTINUATION now and then) holds its
    // stream, which no route serves yet. Counted from its start, or from the end of a pause
    // of ours (kMaxH2Streams), whichever is later.
    if (!paused_ && std::any_of(streams_.begin(), streams_.end(), [&](const auto& s) {
          return !s.second->served && now - std::max(s.second->begun, resumed_) >= kHeadReadTimeout;
        })) {
      head_timed_out = true;
      break;
    }
  }
  server_.metrics_.limitHit(head_timed_out ? kLimitHeadReadTimeout : kLimitTcpIdleTimeout);
  common::log::info(
      head_timed_out ? "h2 header block not finished: GOAWAY" : "h2 connection idle: GOAWAY",
      {{"agent", server_.config_.agentId()}});
  nghttp2_session_terminate_session(session_, NGHTTP2_NO_ERROR);
  kick();
  // The writer ends the connection once the GOAWAY is out.
  asio::steady_timer forever(agent_.get_executor());
  co_await waitSignal(forever);
}

asio::awaitable<void> H2Session::writeLoop() {
  std::string batch;
  for (;;) {
    while (batch.size() < kWriteBatchBytes) {
      const uint8_t* data = nullptr;
      const auto n = nghttp2_session_mem_send(session_, &data);
      if (n < 0) {
        protocolError(nghttp2_strerror(static_cast<int>(n)));
        co_return;
      }
      if (n == 0) break;
      batch.append(reinterpret_cast<const char*>(data), static_cast<size_t>(n));
    }
    if (!batch.empty()) {
      asio::error_code ec;
      co_await asio::async_write(agent_, asio::buffer(batch),
                                 asio::redirect_error(use_awaitable, ec));
      if (ec) co_return;
      batch.clear();
      continue;
    }
    if (nghttp2_session_want_read(session_) == 0 && nghttp2_session_want_write(session_) == 0) {
      co_return;  // GOAWAY exchanged, or a protocol error answered
    }
    co_await waitSignal(write_signal_);
  }
}

void H2Session::kick() { write_signal_.cancel(); }

void H2Session::protocolError(const std::string& detail) {
  if (protocol_error_counted_) return;
  protocol_error_counted_ = true;
  FlowRecord record;
  record.agent = server_.config_.agentId();
  record.refuse(kReasonMalformed);
  record.detail = "http2: " + detail;
  if (!last_error_.empty() && last_error_ != detail) record.detail += " (" + last_error_ + ")";
  finishFlow(record, server_.metrics_);
}

int H2Session::onBeginHeaders(nghttp2_session* /*session*/, const nghttp2_frame* frame,
                              void* self) {
  if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
  H2Session& h = sessionOf(self);
  auto& slot = h.streams_[frame->hd.stream_id];
  if (!slot) ++h.server_.h2_streams_;
  slot = std::make_shared<H2Stream>(h.agent_.get_executor(), frame->hd.stream_id);
  return 0;
}

int H2Session::onHeader(nghttp2_session* /*session*/, const nghttp2_frame* frame,
                        const uint8_t* name, size_t namelen, const uint8_t* value, size_t valuelen,
                        uint8_t /*flags*/, void* self) {
  if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST) {
    return 0;  // trailers: nothing in them matters to a tunnel
  }
  auto s = sessionOf(self).find(frame->hd.stream_id);
  if (!s) return 0;
  s->header_bytes += namelen + valuelen;
  if (++s->header_fields > proto::kMaxHeaderFields ||
      s->header_bytes > proto::kMaxRequestHeadBytes) {
    s->too_large = true;
    return 0;
  }
  const std::string_view n(reinterpret_cast<const char*>(name), namelen);
  const std::string_view v(reinterpret_cast<const char*>(value), valuelen);
  if (n.empty() || n.front() != ':') {
    s->regular_seen = true;
    return 0;
  }
  std::string* field = nullptr;
  if (n == ":method") field = &s->method;
  if (n == ":protocol") field = &s->protocol;
  if (n == ":scheme") field = &s->scheme;
  if (n == ":path") field = &s->path;
  if (n == ":authority") field = &s->authority;
  if (!s->bad.empty()) return 0;
  if (field == nullptr) {
    s->bad = "unknown pseudo-header " + std::string(n.substr(0, 32));
  } else if (s->regular_seen) {
    s->bad = std::string(n) + " after a regular field";
  } else if (!field->empty() || v.empty()) {
    s->bad = std::string(n) + (v.empty() ? " is empty" : " appears twice");
  } else {
    field->assign(v);
  }
  return 0;
}

int H2Session::onFrameRecv(nghttp2_session* /*session*/, const nghttp2_frame* frame, void* self) {
  H2Session& h = sessionOf(self);
  if (frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA) return 0;
  auto s = h.find(frame->hd.stream_id);
  if (!s) return 0;
  if ((frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0) {
    s->in_eof = true;
    s->in_signal.cancel();
  }
  if (frame->hd.type == NGHTTP2_HEADERS && frame->headers.cat == NGHTTP2_HCAT_REQUEST) {
    s->served = true;
    asio::co_spawn(h.agent_.get_executor(), h.serveStream(s), asio::detached);
  }
  return 0;
}

int H2Session::onFrameSend(nghttp2_session* session, const nghttp2_frame* frame, void* self) {
  H2Session& h = sessionOf(self);
  if (frame->hd.type == NGHTTP2_GOAWAY && frame->goaway.error_code != NGHTTP2_NO_ERROR) {
    h.protocolError(h.last_error_.empty() ? nghttp2_http2_strerror(frame->goaway.error_code)
                                          : h.last_error_);
    return 0;
  }
  if ((frame->hd.flags & NGHTTP2_FLAG_END_STREAM) == 0) return 0;
  auto s = h.find(frame->hd.stream_id);
  if (s && s->rst_after_end && !s->in_eof) {
    // RFC 9113 §8.1: the response is complete; the rest of the request is not wanted.
    nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_NO_ERROR);
  }
  return 0;
}

int H2Session::onDataChunk(nghttp2_session* session, uint8_t /*flags*/, int32_t stream_id,
                           const uint8_t* data, size_t len, void* self) {
  H2Session& h = sessionOf(self);
  auto s = h.find(stream_id);
  if (!s || s->finished) {
    nghttp2_session_consume(session, stream_id, len);  // nobody will read it
    return 0;
  }
  s->in.append(reinterpret_cast<const char*>(data), len);
  // The connection's window is given back at once and the stream's only once its upstream
  // took the bytes: a stream whose upstream does not read holds back itself alone (its
  // window bounds what it buffers), never every other stream of the connection.
  nghttp2_session_consume_connection(session, len);
  s->last_activity = std::chrono::steady_clock::now();
  s->in_signal.cancel();
  return 0;
}

int H2Session::onStreamClose(nghttp2_session* /*session*/, int32_t stream_id,
                             uint32_t /*error_code*/, void* self) {
  H2Session& h = sessionOf(self);
  if (h.dead_) return 0;
  auto it = h.streams_.find(stream_id);
  if (it == h.streams_.end()) return 0;
  auto s = it->second;
  h.streams_.erase(it);
  h.streamsGone(1);
  s->closed = true;
  s->in.clear();  // its connection window was given back as it arrived
  s->in_signal.cancel();
  s->out_signal.cancel();
  if (s->cancel) s->cancel();
  return 0;
}

int H2Session::onError(nghttp2_session* /*session*/, int /*code*/, const char* msg, size_t len,
                       void* self) {
  H2Session& h = sessionOf(self);
  h.last_error_.assign(msg, std::min<size_t>(len, 200));
  common::log::debug("h2 protocol error", {{"error", h.last_error_}});
  return 0;
}

ssize_t H2Session::readOut(nghttp2_session* /*session*/, int32_t stream_id, uint8_t* buf,
                           size_t length, uint32_t* data_flags, nghttp2_data_source* /*source*/,
                           void* self) {
  auto s = sessionOf(self).find(stream_id);
  if (!s) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
  const size_t n = std::min(length, s->outPending());
  if (n == 0 && !s->out_eof) return NGHTTP2_ERR_DEFERRED;
  std::memcpy(buf, s->out.data() + s->out_sent, n);
  s->out_sent += n;
  if (s->out_sent == s->out.size()) {
    s->out.clear();
    s->out_sent = 0;
    if (s->out_eof) *data_flags |= NGHTTP2_DATA_FLAG_EOF;
  } else if (s->out_sent >= kH2StreamBufferBytes) {
    s->out.erase(0, s->out_sent);
    s->out_sent = 0;
  }
  if (s->outPending() < kH2StreamBufferBytes) s->out_signal.cancel();
  return static_cast<ssize_t>(n);
}

asio::awaitable<bool> H2Session::agentData(H2Stream& s) {
  while (s.in.empty() && !s.in_eof && !s.closed && !dead_) co_await waitSignal(s.in_signal);
  co_return !s.in.empty() && !s.closed;
}

void H2Session::consumed(H2Stream& s, size_t n) {
  if (n == 0 || dead_) return;
  nghttp2_session_consume_stream(session_, s.id, n);
  kick();
}

asio::awaitable<bool> H2Session::sendToAgent(H2Stream& s, std::string_view data) {
  while (s.outPending() >= kH2StreamBufferBytes && !s.closed && !dead_) {
    co_await waitSignal(s.out_signal);
  }
  if (s.closed || dead_) co_return false;
  s.out.append(data);
  s.last_activity = std::chrono::steady_clock::now();
  nghttp2_session_resume_data(session_, s.id);
  kick();
  co_return true;
}

void H2Session::endToAgent(H2Stream& s) {
  if (s.closed || dead_ || s.out_eof) return;
  s.out_eof = true;
  nghttp2_session_resume_data(session_, s.id);
  kick();
}

void H2Session::reset(H2Stream& s, uint32_t code) {
  if (s.closed || dead_) return;
  nghttp2_submit_rst_stream(session_, NGHTTP2_FLAG_NONE, s.id, code);
  kick();
}

void H2Session::respond(H2Stream& s, int status, const char* reason, bool tunnel, bool capsules) {
  if (s.closed || dead_) return;
  const std::string code = std::to_string(status);
  auto field = [](std::string_view name, std::string_view value) {
    // NOLINTNEXTLINE(cppcoreguidelines-pro-type-const-cast): nghttp2 copies, never writes
    return nghttp2_nv{const_cast<uint8_t*>(reinterpret_cast<const uint8_t*>(name.data())),
                      const_cast<uint8_t*>(reinterpret_cast<const uint8_t*>(value.data())),
                      name.size(), value.size(), NGHTTP2_NV_FLAG_NONE};
  };
  std::array<nghttp2_nv, 3> nv{};
  size_t count = 0;
  nv[count++] = field(":status", code);
  if (reason != nullptr) nv[count++] = field("boundary-reason", reason);
  if (capsules) nv[count++] = field("capsule-protocol", "?1");
  nghttp2_data_provider provider{};
  provider.read_callback = readOut;
  if (!tunnel) s.rst_after_end = true;
  nghttp2_submit_response(session_, s.id, nv.data(), count, tunnel ? &provider : nullptr);
  kick();
}

}  // namespace sambox
