#pragma once
// One HTTP/2 client connection of the mux (h2_mux.h) over one byte stream, and its streams.
// Internal to netstack. Kept alive (shared_ptr) by its reader, writer and stream coroutines,
// so an old connection finishes its streams while the mux already uses a new one.

#include <nghttp2/nghttp2.h>
#include <asio/awaitable.hpp>
#include <asio/io_context.hpp>
#include <asio/local/stream_protocol.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/steady_timer.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>

namespace netstack {

/// One flow's stream: its socketpair end and the bytes in flight each way.
struct H2MuxStream {
  H2MuxStream(asio::io_context& io, int fd);

  int32_t id = -1;  ///< -1 until the request is submitted
  asio::local::stream_protocol::socket local;
  asio::steady_timer signal;  ///< cancelled (wake()) whenever anything below changes
  bool udp = false;
  int status = -1;        ///< the response's :status
  std::string reason;     ///< its boundary-reason
  bool response = false;  ///< the response HEADERS arrived
  std::string in;         ///< read from the flow, not yet framed (from in_off on)
  size_t in_off = 0;
  bool in_eof = false;   ///< the flow shut down its sending side
  std::string out;       ///< DATA from sam-box not yet written to the flow
  bool out_eof = false;  ///< sam-box sent END_STREAM
  bool closed = false;   ///< nghttp2 closed the stream, or the connection failed
  uint32_t close_code = 0;

  void wake() { signal.cancel(); }
  [[nodiscard]] size_t inPending() const { return in.size() - in_off; }
};

class H2Connection : public std::enable_shared_from_this<H2Connection> {
 public:
  /// Takes ownership of `fd`, the open byte stream. `failures` is the mux's failure counter.
  H2Connection(asio::io_context& io, int fd, std::shared_ptr<uint64_t> failures);
  ~H2Connection();
  H2Connection(const H2Connection&) = delete;
  H2Connection& operator=(const H2Connection&) = delete;

  /// Creates the nghttp2 client session and queues SETTINGS. False with `*error` on failure.
  bool init(std::string* error);
  /// Starts reading, writing and the keep-alive PINGs.
  void run();
  /// Serves one flow's stream on `fd` (the mux's end of the socketpair; ownership passes).
  void addStream(int fd);
  /// Ends the connection: every stream's socket is closed. Idempotent. `failure` false for an
  /// orderly stop (not logged as a failure, not counted).
  void fail(const std::string& reason, bool failure = true);

  [[nodiscard]] bool dead() const { return dead_; }
  /// A new stream may be started (not dead, no GOAWAY received).
  [[nodiscard]] bool usable() const { return !dead_ && !goaway_; }

 private:
  static int onHeader(nghttp2_session*, const nghttp2_frame* frame, const uint8_t* name,
                      size_t namelen, const uint8_t* value, size_t valuelen, uint8_t flags,
                      void* self);
  static int onFrameRecv(nghttp2_session*, const nghttp2_frame* frame, void* self);
  static int onDataChunk(nghttp2_session*, uint8_t flags, int32_t stream_id, const uint8_t* data,
                         size_t len, void* self);
  static int onStreamClose(nghttp2_session*, int32_t stream_id, uint32_t error_code, void* self);
  static ssize_t readIn(nghttp2_session*, int32_t stream_id, uint8_t* buf, size_t length,
                        uint32_t* data_flags, nghttp2_data_source* source, void* self);

  asio::awaitable<void> readLoop();
  asio::awaitable<void> writeLoop();
  asio::awaitable<void> keepAlive();
  asio::awaitable<void> serveStream(std::shared_ptr<H2MuxStream> s);
  asio::awaitable<void> flowToUpstream(std::shared_ptr<H2MuxStream> s);
  /// Waits for `s.signal`.
  static asio::awaitable<void> waitFor(H2MuxStream& s);
  /// Wakes the writer: nghttp2 may have frames to send.
  void kick();
  /// RST_STREAM CANCEL, if the stream is still open.
  void cancel(H2MuxStream& s);
  std::shared_ptr<H2MuxStream> find(int32_t id);

  asio::io_context& io_;
  asio::posix::stream_descriptor upstream_;
  std::shared_ptr<uint64_t> failures_;
  nghttp2_session* session_ = nullptr;
  std::map<int32_t, std::shared_ptr<H2MuxStream>> by_id_;
  std::set<std::shared_ptr<H2MuxStream>> streams_;  ///< every stream not yet finished
  asio::steady_timer write_signal_;
  asio::steady_timer ping_timer_;
  bool dead_ = false;
  bool goaway_ = false;
};

}  // namespace netstack
