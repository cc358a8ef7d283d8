#pragma once
// HTTP/2 on the tunnel socket (RFC 9113, h2c with prior knowledge, §3.3): a microVM guest has
// one byte stream to the host, so it carries every flow of the sandbox as one HTTP/2 stream.
//   - TCP: CONNECT (RFC 9113 §8.5): :method CONNECT and :authority host:port, nothing else.
//   - UDP: extended CONNECT (RFC 8441, RFC 9220) with :protocol connect-udp, :scheme, :path
//     /.well-known/masque/udp/{host}/{port}/ and :authority (RFC 9298); capsules (RFC 9297)
//     travel in the stream's DATA frames.
// Each stream is judged like an HTTP/1.1 tunnel (classify(), the same resolve/forbidden-address
// checks, the same flow log line and metrics); mesh.sam.alt:80 streams carry HTTP/1.1 whose
// X-Sam-Agent is rewritten. A refusal is a response HEADERS with :status, `boundary-reason` and
// END_STREAM (then RST_STREAM NO_ERROR if the agent is still sending, RFC 9113 §8.1). A request
// that is not a tunnel is 400 malformed-request, another method 405. Framing, HPACK and flow
// control are libnghttp2's; a connection-level protocol error (a bad preface included) ends the
// connection with GOAWAY and is counted as a malformed flow.
//
// Flow control bounds memory: an agent stream's DATA is credited back to the stream
// (WINDOW_UPDATE) only as its upstream socket accepts it (kH2StreamWindowBytes per stream),
// and to the connection as it arrives, so a stream whose upstream does not read holds back
// itself alone; an upstream is read only while fewer than kH2StreamBufferBytes wait for the
// agent. Streams count against kMaxConcurrentFlows like HTTP/1.1 tunnels (503
// too-many-flows), and so does the connection itself (it was accepted as one);
// SETTINGS_MAX_CONCURRENT_STREAMS advertises the same cap. A connection with no stream and
// no byte from the agent for kTcpIdleTimeout is ended with GOAWAY NO_ERROR. A refused stream
// lives until its response is written, so streams alive over all connections are capped too
// (kMaxH2Streams): past it no connection reads its agent until some close. A header block
// begun and not finished within kHeadReadTimeout ends the connection (head-read-timeout).

#include "sam-box/flow.h"
#include "sam-box/open_flows.h"
#include "sam-box/server.h"

#include <nghttp2/nghttp2.h>
#include <sys/types.h>
#include <asio/awaitable.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/local/stream_protocol.hpp>
#include <asio/steady_timer.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>

namespace sambox {

/// Whether the first bytes of a connection are the HTTP/2 client preface. Only its first line,
/// "PRI * HTTP/2.0\r\n" (16 bytes), decides: no HTTP/1.1 tunnel request starts that way, and
/// nghttp2 checks the rest of the preface (a bad one is answered with GOAWAY).
enum class PrefaceMatch {
  kNo,     ///< HTTP/1.1 (or garbage): hand the bytes to the HTTP/1.1 parser
  kMaybe,  ///< a proper prefix of the preface line: read more
  kYes,    ///< HTTP/2
};
PrefaceMatch matchH2Preface(std::string_view first_bytes);

/// Serves one HTTP/2 connection until it ends. `received` holds every byte read from `agent`
/// so far (starting with the preface). Never throws; every failure ends in a log line.
asio::awaitable<void> serveH2Connection(Server& server, asio::local::stream_protocol::socket agent,
                                        std::string received);

/// One stream: the request as received, and the bytes in flight each way.
struct H2Stream {
  explicit H2Stream(asio::any_io_executor ex, int32_t stream_id)
      : id(stream_id), in_signal(ex), out_signal(ex) {}

  int32_t id;
  // The request's pseudo-header fields; `bad` names the first malformation seen.
  std::string method, protocol, scheme, path, authority;
  std::string bad;
  bool regular_seen = false;  ///< a regular field came; pseudo-fields must not follow
  bool too_large = false;     ///< over kMaxRequestHeadBytes or kMaxHeaderFields
  size_t header_bytes = 0;
  size_t header_fields = 0;

  std::string in;         ///< agent DATA not yet taken by the upstream (not yet credited)
  bool in_eof = false;    ///< the agent sent END_STREAM
  std::string out;        ///< upstream bytes not yet framed for the agent
  size_t out_sent = 0;    ///< prefix of `out` already framed
  bool out_eof = false;   ///< END_STREAM once `out` is framed
  bool closed = false;    ///< nghttp2 closed the stream (both ends done, RST, or connection end)
  bool finished = false;  ///< the route is done: DATA from now on is credited and dropped
  bool rst_after_end = false;  ///< refused: RST_STREAM NO_ERROR once our END_STREAM is sent
  bool served = false;         ///< its header block ended and its route was started
  /// When its header block began (the head-read-timeout counts from here).
  std::chrono::steady_clock::time_point begun = std::chrono::steady_clock::now();
  asio::steady_timer in_signal;   ///< cancelled when `in` grows or the stream ends
  asio::steady_timer out_signal;  ///< cancelled when `out` drains or the stream ends
  std::function<void()> cancel;   ///< closes the route's upstream socket(s)
  std::chrono::steady_clock::time_point last_activity = std::chrono::steady_clock::now();

  [[nodiscard]] size_t outPending() const { return out.size() - out_sent; }
};

/// The connection: nghttp2's server session over the agent's socket, and its streams. Only
/// the io_context thread touches it. Kept alive (shared_ptr) by its reader/writer and by each
/// stream's route coroutine.
class H2Session : public std::enable_shared_from_this<H2Session> {
 public:
  H2Session(Server& server, asio::local::stream_protocol::socket agent);
  ~H2Session();
  H2Session(const H2Session&) = delete;
  H2Session& operator=(const H2Session&) = delete;

  /// Sends SETTINGS, feeds `received`, then reads and writes until the connection ends;
  /// then ends every stream.
  asio::awaitable<void> run(std::string received);

 private:
  using TcpSocket = asio::ip::tcp::socket;

  // nghttp2 callbacks (user_data is the session).
  static int onBeginHeaders(nghttp2_session*, const nghttp2_frame* frame, void* self);
  static int onHeader(nghttp2_session*, const nghttp2_frame* frame, const uint8_t* name,
                      size_t namelen, const uint8_t* value, size_t valuelen, uint8_t flags,
                      void* self);
  static int onFrameRecv(nghttp2_session*, const nghttp2_frame* frame, void* self);
  static int onFrameSend(nghttp2_session*, const nghttp2_frame* frame, void* self);
  static int onDataChunk(nghttp2_session*, uint8_t flags, int32_t stream_id, const uint8_t* data,
                         size_t len, void* self);
  static int onStreamClose(nghttp2_session*, int32_t stream_id, uint32_t error_code, void* self);
  static int onError(nghttp2_session*, int code, const char* msg, size_t len, void* self);
  static ssize_t readOut(nghttp2_session*, int32_t stream_id, uint8_t* buf, size_t length,
                         uint32_t* data_flags, nghttp2_data_source* source, void* self);

  asio::awaitable<void> readLoop(std::string received);
  asio::awaitable<void> writeLoop();
  /// Ends (GOAWAY NO_ERROR) a connection with no stream and no byte read for kTcpIdleTimeout.
  asio::awaitable<void> idleConnection();
  /// Wakes the writer: nghttp2 has frames to send.
  void kick();
  /// `n` streams left streams_: counts them out of Server::h2_streams_ and wakes connections
  /// waiting for room.
  void streamsGone(size_t n);
  /// Returns once Server::h2_streams_ is below kMaxH2Streams (or the connection is dead).
  asio::awaitable<void> roomForStreams();
  /// Logs and counts a connection-level protocol error once, as a malformed flow.
  void protocolError(const std::string& detail);
  std::shared_ptr<H2Stream> find(int32_t id);

  // The agent side of a stream, for the routes (h2_routes.cc).
  /// Waits for agent DATA. True with `s.in` non-empty; false once the agent ended or the
  /// stream closed.
  asio::awaitable<bool> agentData(H2Stream& s);
  /// The upstream took `n` bytes that were taken out of `s.in`: credit them to the agent.
  void consumed(H2Stream& s, size_t n);
  /// Queues `data` for the agent, first waiting until fewer than kH2StreamBufferBytes wait.
  /// False if the stream or the connection ended.
  asio::awaitable<bool> sendToAgent(H2Stream& s, std::string_view data);
  /// END_STREAM after the queued bytes.
  void endToAgent(H2Stream& s);
  /// Relays what `from` (the TCP upstream or the node's socket) sends to the agent until EOF
  /// (END_STREAM) or an error (RST_STREAM CONNECT_ERROR), adding to `bytes_down` (bytes).
  template <class Socket>
  asio::awaitable<void> relayToAgent(H2Stream& s, Socket& from, uint64_t& bytes_down);
  /// RST_STREAM with an RFC 9113 §7 error code (after a 200, when the flow fails).
  void reset(H2Stream& s, uint32_t code);
  /// The response HEADERS: `status`; `reason` as boundary-reason if non-null; `tunnel` opens
  /// the stream's DATA towards the agent (otherwise END_STREAM), `capsules` adds
  /// capsule-protocol: ?1.
  void respond(H2Stream& s, int status, const char* reason, bool tunnel, bool capsules);

  // The routes (h2_routes.cc): the same decisions as HTTP/1.1 tunnels, per stream.
  asio::awaitable<void> serveStream(std::shared_ptr<H2Stream> stream);
  asio::awaitable<void> refuseStream(H2Stream& s, FlowRecord& record, int status,
                                     const char* reason, bool is_error);
  asio::awaitable<void> streamTcp(H2Stream& s, FlowRecord& record);
  asio::awaitable<void> streamUdp(H2Stream& s, FlowRecord& record);
  asio::awaitable<void> streamMesh(H2Stream& s, FlowRecord& record);
  /// Returns once no byte has moved on `s` (its last_activity) for `timeout`, counting
  /// `limit` — or, when `half_close` and one direction has ended (the agent's END_STREAM, or
  /// the upstream's EOF), for the half-closed timeout, counting half-closed-timeout, as the
  /// HTTP/1.1 relay does (relay.h). Checks at least every Config::tcp_timeouts.check_interval;
  /// returns early (without counting) when cancelled.
  asio::awaitable<void> idleWatch(const H2Stream& s, std::chrono::milliseconds timeout,
                                  const char* limit, bool half_close);
  /// finishFlow(), saying boundary-stopped if the boundary's stop ended the connection.
  void finishStream(FlowRecord& record);

  Server& server_;
  asio::local::stream_protocol::socket agent_;
  nghttp2_session* session_ = nullptr;
  std::map<int32_t, std::shared_ptr<H2Stream>> streams_;
  asio::steady_timer write_signal_;
  bool dead_ = false;  ///< the connection is gone: no more frames
  bool protocol_error_counted_ = false;
  std::string last_error_;  ///< nghttp2's words for the last error, for the log
  std::chrono::steady_clock::time_point last_read_ = std::chrono::steady_clock::now();
  bool stopped_ = false;  ///< the boundary's stop closed the connection
  bool paused_ = false;   ///< not reading the agent: no room for more streams (kMaxH2Streams)
  std::chrono::steady_clock::time_point resumed_{};  ///< when the last such pause ended
  /// Held as long as the session (every stream's route holds it): Server::stop() closes the
  /// connection, which ends every stream, each with its flow line.
  OpenFlows::Entry open_;
};

}  // namespace sambox
