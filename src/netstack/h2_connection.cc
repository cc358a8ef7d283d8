#include "netstack/h2_connection.h"

#include "netstack/h2_mux.h"
#include "netstack/limits.h"
#include "netstack/log.h"

#include <sys/socket.h>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/read_until.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>
#include <cstring>
#include <vector>

namespace netstack {
namespace {

constexpr auto kTuple = asio::experimental::as_tuple(asio::use_awaitable);
/// Most bytes of frames gathered into one write to the byte stream.
constexpr size_t kMaxUpstreamWrite = 64 * 1024;

H2Connection* self(void* p) { return static_cast<H2Connection*>(p); }

nghttp2_nv field(const std::string& name, const std::string& value) {
  return {reinterpret_cast<uint8_t*>(const_cast<char*>(name.data())),
          reinterpret_cast<uint8_t*>(const_cast<char*>(value.data())), name.size(), value.size(),
          NGHTTP2_NV_FLAG_NONE};
}

}  // namespace

H2MuxStream::H2MuxStream(asio::io_context& io, int fd)
    : local(io, asio::local::stream_protocol(), fd), signal(io) {
  signal.expires_at(asio::steady_timer::time_point::max());
}

H2Connection::H2Connection(asio::io_context& io, int fd, std::shared_ptr<uint64_t> failures)
    : io_(io),
      upstream_(io, fd),
      failures_(std::move(failures)),
      write_signal_(io),
      ping_timer_(io) {
  write_signal_.expires_at(asio::steady_timer::time_point::max());
}

H2Connection::~H2Connection() {
  if (session_ != nullptr) nghttp2_session_del(session_);
}

bool H2Connection::init(std::string* error) {
  nghttp2_session_callbacks* callbacks = nullptr;
  nghttp2_option* option = nullptr;
  if (nghttp2_session_callbacks_new(&callbacks) != 0 || nghttp2_option_new(&option) != 0) {
    nghttp2_session_callbacks_del(callbacks);
    *error = "nghttp2: out of memory";
    return false;
  }
  nghttp2_session_callbacks_set_on_header_callback(callbacks, &H2Connection::onHeader);
  nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, &H2Connection::onFrameRecv);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, &H2Connection::onDataChunk);
  nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, &H2Connection::onStreamClose);
  // Credit is given back by hand, once a flow took the bytes: that is the memory bound.
  nghttp2_option_set_no_auto_window_update(option, 1);
  const int rv = nghttp2_session_client_new2(&session_, callbacks, this, option);
  nghttp2_session_callbacks_del(callbacks);
  nghttp2_option_del(option);
  if (rv != 0) {
    *error = std::string("nghttp2_session_client_new2: ") + nghttp2_strerror(rv);
    return false;
  }
  const nghttp2_settings_entry settings[] = {
      {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
      {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, static_cast<uint32_t>(kH2MuxStreamWindow)},
  };
  int s = nghttp2_submit_settings(session_, NGHTTP2_FLAG_NONE, settings, std::size(settings));
  if (s == 0) {
    s = nghttp2_session_set_local_window_size(session_, NGHTTP2_FLAG_NONE, 0,
                                              kH2MuxConnectionWindow);
  }
  if (s != 0) {
    *error = std::string("nghttp2 SETTINGS: ") + nghttp2_strerror(s);
    return false;
  }
  return true;
}

void H2Connection::run() {
  auto keep = shared_from_this();
  asio::co_spawn(io_, readLoop(), [keep](std::exception_ptr) {});
  asio::co_spawn(io_, writeLoop(), [keep](std::exception_ptr) {});
  asio::co_spawn(io_, keepAlive(), [keep](std::exception_ptr) {});
}

void H2Connection::addStream(int fd) {
  auto s = std::make_shared<H2MuxStream>(io_, fd);
  streams_.insert(s);
  auto keep = shared_from_this();
  asio::co_spawn(io_, serveStream(s), [keep, s](std::exception_ptr) {
    asio::error_code ignored;
    s->local.close(ignored);
    keep->streams_.erase(s);
  });
}

void H2Connection::fail(const std::string& reason, bool failure) {
  if (dead_) return;
  dead_ = true;
  if (failure) {
    ++*failures_;
    log::warn("h2 boundary connection failed",
              {{"reason", reason}, {"open_streams", streams_.size()}});
  }
  asio::error_code ignored;
  upstream_.close(ignored);
  write_signal_.cancel();
  ping_timer_.cancel();
  for (const auto& s : streams_) {
    s->closed = true;
    s->close_code = NGHTTP2_INTERNAL_ERROR;
    s->wake();
  }
}

void H2Connection::kick() { write_signal_.cancel(); }

void H2Connection::cancel(H2MuxStream& s) {
  if (dead_ || s.closed || s.id < 0) return;
  nghttp2_submit_rst_stream(session_, NGHTTP2_FLAG_NONE, s.id, NGHTTP2_CANCEL);
  kick();
}

std::shared_ptr<H2MuxStream> H2Connection::find(int32_t id) {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second;
}

int H2Connection::onHeader(nghttp2_session*, const nghttp2_frame* frame, const uint8_t* name,
                           size_t namelen, const uint8_t* value, size_t valuelen, uint8_t,
                           void* p) {
  if (frame->hd.type != NGHTTP2_HEADERS) return 0;
  auto s = self(p)->find(frame->hd.stream_id);
  if (!s || s->response) return 0;  // trailers or an unknown stream: nothing to keep
  const std::string_view n(reinterpret_cast<const char*>(name), namelen);
  const std::string_view v(reinterpret_cast<const char*>(value), valuelen);
  if (n == ":status") {
    int status = 0;
    for (char c : v)
      status = (c >= '0' && c <= '9' && status < 1000) ? status * 10 + (c - '0') : -1;
    s->status = v.size() == 3 ? status : -1;
  } else if (n == "boundary-reason") {
    s->reason = std::string(v.substr(0, 64));
  }
  return 0;
}

int H2Connection::onFrameRecv(nghttp2_session*, const nghttp2_frame* frame, void* p) {
  H2Connection* c = self(p);
  if (frame->hd.type == NGHTTP2_GOAWAY) {
    // No new stream on this connection; the mux opens another for the next flow. Streams
    // above last_stream_id are closed by nghttp2 (onStreamClose).
    c->goaway_ = true;
    log::info("h2 boundary sent GOAWAY", {{"error_code", frame->goaway.error_code},
                                          {"last_stream_id", frame->goaway.last_stream_id}});
    return 0;
  }
  if (frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA) return 0;
  auto s = c->find(frame->hd.stream_id);
  if (!s) return 0;
  if (frame->hd.type == NGHTTP2_HEADERS && frame->headers.cat == NGHTTP2_HCAT_RESPONSE &&
      s->status >= 200) {
    s->response = true;  // a 1xx would be interim; sam-box sends none, and they are skipped
  }
  if ((frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0) s->out_eof = true;
  s->wake();
  return 0;
}

int H2Connection::onDataChunk(nghttp2_session* session, uint8_t, int32_t stream_id,
                              const uint8_t* data, size_t len, void* p) {
  auto s = self(p)->find(stream_id);
  if (!s || s->closed) {
    // Nobody takes these bytes: credit them at once so the connection window stays open.
    nghttp2_session_consume(session, stream_id, len);
    return 0;
  }
  s->out.append(reinterpret_cast<const char*>(data), len);
  // The connection's window at once, the stream's once its flow took the bytes: a flow the
  // agent does not read holds back its own stream (whose window bounds what is buffered for
  // it), never the others.
  nghttp2_session_consume_connection(session, len);
  s->wake();
  return 0;
}

int H2Connection::onStreamClose(nghttp2_session*, int32_t stream_id, uint32_t error_code, void* p) {
  H2Connection* c = self(p);
  auto s = c->find(stream_id);
  if (!s) return 0;
  s->closed = true;
  s->close_code = error_code;
  c->by_id_.erase(stream_id);
  s->wake();
  return 0;
}

ssize_t H2Connection::readIn(nghttp2_session*, int32_t, uint8_t* buf, size_t length,
                             uint32_t* data_flags, nghttp2_data_source* source, void*) {
  auto* s = static_cast<H2MuxStream*>(source->ptr);
  const size_t n = std::min(length, s->inPending());
  if (n == 0 && !s->in_eof) return NGHTTP2_ERR_DEFERRED;
  std::memcpy(buf, s->in.data() + s->in_off, n);
  s->in_off += n;
  if (s->in_off == s->in.size()) {
    s->in.clear();
    s->in_off = 0;
  }
  if (s->inPending() == 0 && s->in_eof) *data_flags |= NGHTTP2_DATA_FLAG_EOF;
  s->wake();  // the flow's reader may read again
  return static_cast<ssize_t>(n);
}

asio::awaitable<void> H2Connection::readLoop() {
  std::vector<uint8_t> buf(kMaxReadChunk);
  while (!dead_) {
    auto [ec, n] = co_await upstream_.async_read_some(asio::buffer(buf), kTuple);
    if (dead_) break;
    if (ec) {
      fail(ec == asio::error::eof ? "sam-box closed the byte stream" : "read: " + ec.message());
      break;
    }
    const ssize_t rv = nghttp2_session_mem_recv(session_, buf.data(), n);
    if (rv < 0) {
      fail(std::string("HTTP/2: ") + nghttp2_strerror(static_cast<int>(rv)));
      break;
    }
    kick();
  }
}

asio::awaitable<void> H2Connection::writeLoop() {
  std::string pending;
  while (!dead_) {
    pending.clear();
    while (pending.size() < kMaxUpstreamWrite) {
      const uint8_t* data = nullptr;
      const ssize_t n = nghttp2_session_mem_send(session_, &data);
      if (n < 0) {
        fail(std::string("HTTP/2: ") + nghttp2_strerror(static_cast<int>(n)));
        co_return;
      }
      if (n == 0) break;
      pending.append(reinterpret_cast<const char*>(data), static_cast<size_t>(n));
    }
    if (pending.empty()) {
      if (nghttp2_session_want_read(session_) == 0 && nghttp2_session_want_write(session_) == 0) {
        // GOAWAY exchanged and every stream done: orderly; the next flow reconnects.
        log::info("h2 boundary connection ended (GOAWAY)");
        fail("HTTP/2 session ended", false);
        co_return;
      }
      co_await write_signal_.async_wait(kTuple);
      continue;
    }
    auto [ec, n] = co_await asio::async_write(upstream_, asio::buffer(pending), kTuple);
    if (ec && !dead_) fail("write: " + ec.message());
  }
}

asio::awaitable<void> H2Connection::keepAlive() {
  while (!dead_) {
    ping_timer_.expires_after(kH2MuxPingInterval);
    co_await ping_timer_.async_wait(kTuple);
    if (dead_) break;
    nghttp2_submit_ping(session_, NGHTTP2_FLAG_NONE, nullptr);
    kick();
  }
}

asio::awaitable<void> H2Connection::waitFor(H2MuxStream& s) {
  // The expiry stays at "never": cancel() wakes every waiter without touching it, so two
  // coroutines waiting on one signal never cancel each other.
  co_await s.signal.async_wait(kTuple);
}

asio::awaitable<void> H2Connection::serveStream(std::shared_ptr<H2MuxStream> s) {
  auto keep = shared_from_this();
  // The flow's request head (its own code wrote it: connectRequest/connectUdpRequest).
  std::string head;
  auto [ec, head_len] = co_await asio::async_read_until(
      s->local, asio::dynamic_buffer(head, kMaxResponseHeadBytes), "\r\n\r\n", kTuple);
  if (ec || dead_) co_return;  // closing the socket fails the flow
  std::string error;
  auto request = h1RequestToH2(std::string_view(head).substr(0, head_len), &error);
  if (!request) {
    log::warn("h2 mux: flow request not translatable", {{"reason", error}});
    co_await asio::async_write(s->local, asio::buffer(h2ResponseToH1(400, error, false)), kTuple);
    co_return;
  }
  s->udp = request->udp;
  s->in = head.substr(head_len);  // a flow sends nothing before the answer; kept if it did
  std::vector<nghttp2_nv> nva;
  for (const auto& [name, value] : request->fields) nva.push_back(field(name, value));
  nghttp2_data_provider provider{};
  provider.source.ptr = s.get();
  provider.read_callback = &H2Connection::readIn;
  const int32_t id =
      nghttp2_submit_request(session_, nullptr, nva.data(), nva.size(), &provider, nullptr);
  if (id < 0) {
    log::warn("h2 mux: request not submitted", {{"reason", nghttp2_strerror(id)}});
    co_return;
  }
  s->id = id;
  by_id_[id] = s;
  kick();

  while (!s->response && !s->closed) co_await waitFor(*s);
  if (!s->response) co_return;  // reset or the connection failed: the flow sees EOF, fails
  const std::string answer = h2ResponseToH1(s->status, s->reason, s->udp);
  std::tie(ec, std::ignore) = co_await asio::async_write(s->local, asio::buffer(answer), kTuple);
  if (ec || s->status < 200 || s->status >= 300) {
    cancel(*s);  // a refusal ends here; sam-box has usually closed the stream already
    co_return;
  }

  asio::co_spawn(io_, flowToUpstream(s), asio::detached);
  // sam-box → flow: write what arrived, credit it, until the stream is closed.
  bool shut = false;
  std::string chunk;
  while (true) {
    if (!s->out.empty()) {
      chunk.swap(s->out);
      s->out.clear();
      std::tie(ec, std::ignore) = co_await asio::async_write(s->local, asio::buffer(chunk), kTuple);
      if (ec) {
        cancel(*s);
        break;
      }
      if (!dead_) {
        nghttp2_session_consume_stream(session_, s->id, chunk.size());
        kick();
      }
      continue;
    }
    if (s->closed) break;
    if (s->out_eof && !shut) {
      shut = true;
      s->local.shutdown(asio::socket_base::shutdown_send, ec);
    }
    co_await waitFor(*s);
  }
  // Closing the socket ends flowToUpstream's read too.
  s->closed = true;
  s->wake();
}

asio::awaitable<void> H2Connection::flowToUpstream(std::shared_ptr<H2MuxStream> s) {
  auto keep = shared_from_this();
  std::vector<char> buf(kMaxReadChunk);
  while (!s->closed) {
    if (s->inPending() >= kH2MuxStreamBuffer) {
      co_await waitFor(*s);
      continue;
    }
    auto [ec, n] = co_await s->local.async_read_some(asio::buffer(buf), kTuple);
    if (s->closed || dead_) break;
    if (ec == asio::error::eof) {
      s->in_eof = true;
    } else if (ec) {
      cancel(*s);
      break;
    } else {
      s->in.append(buf.data(), n);
    }
    nghttp2_session_resume_data(session_, s->id);
    kick();
    if (s->in_eof) break;
  }
}

}  // namespace netstack
