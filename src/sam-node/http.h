#pragma once
// The node's HTTP/1.1 server on its API socket (RFC 9112), one thread per connection: the
// node serves the few sam-box connections of one host, and a blocking handler keeps each
// route (proxy, MCP, probe) a plain function. Requests are parsed by llhttp; bodies are
// buffered up to kMaxRequestBody; responses may be streamed (Transfer-Encoding: chunked).
//
// Stopping: stop() shuts the client sockets down and raises a flag that handlers see through
// stopRequested(); upstream transfers (upstream.h) poll it, so a handler waiting on a silent
// upstream gives up within about a second and serve() returns.

#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace samnode {

/// Largest request body buffered (bytes); a larger one is answered 413.
inline constexpr size_t kMaxRequestBody = size_t{16} * 1024 * 1024;
/// Most connections served at once. At the limit, the connection that has waited longest
/// between requests (idle keep-alive) is closed to make room ("idle-evicted"); if none is
/// idle, the new one is answered 503 and closed ("too-many-connections").
inline constexpr size_t kMaxConnections = 256;
/// Most connections one peer process (SO_PEERCRED pid: one sam-box, i.e. one agent) holds at
/// once; its next one is answered 503 and closed ("too-many-connections"), so one agent
/// cannot take every slot of the node from the others.
inline constexpr size_t kMaxConnectionsPerPeer = 64;
/// A keep-alive connection with no request for this long is closed (refusal reason
/// "idle-timeout"). The node's clients are the host's sam-boxes, which reconnect on demand;
/// the limit only reclaims threads of boxes that went away without closing. Also bounds each
/// wait for more bytes of a request body.
inline constexpr std::chrono::milliseconds kIdleTimeout = std::chrono::minutes(5);
/// A request head (request line and fields) must be complete this long after its first byte,
/// else 408 and close (refusal reason "request-head-timeout"): a client trickling a head
/// (slowloris) holds a thread for at most this long.
inline constexpr std::chrono::milliseconds kRequestHeadTimeout = std::chrono::seconds(30);

/// At the connection limit with no idle connection, a connection whose request has been
/// arriving for longer than this is closed (408 "slow-request-evicted") to make room: a client
/// trickling a head or a body cannot hold a slot against others once the node is full.
inline constexpr std::chrono::milliseconds kSlowRequest = std::chrono::seconds(5);
/// Memory the request bodies of all connections may take at once, each counted as its bytes
/// times kBodyMemoryFactor; a body that would pass it is answered 503 "node-busy".
inline constexpr size_t kMaxBodiesHeld = size_t{256} * 1024 * 1024;
/// What one body byte costs at the peak of its request: the raw body, its parsed JSON and, for
/// an MCP call, the message forwarded upstream and its serialization are alive at once (one
/// 15 MiB tools/call took the node from 16 to 108 MiB of RSS). Counting raw bytes only, 24
/// concurrent 15 MiB calls took it to 1.9 GB.
inline constexpr size_t kBodyMemoryFactor = 6;

/// A response write that the client takes nothing of for this long fails and the connection
/// is closed ("send-timeout"): an agent that sends requests and never reads the answers held
/// its connections in a blocked write, out of reach of every other limit.
inline constexpr std::chrono::milliseconds kSendTimeout = std::chrono::seconds(10);

/// The server's connection limits; tests shorten them.
struct ServerLimits {
  std::chrono::milliseconds idle_timeout = kIdleTimeout;
  std::chrono::milliseconds head_timeout = kRequestHeadTimeout;
  size_t connections = kMaxConnections;
  size_t connections_per_peer = kMaxConnectionsPerPeer;
  std::chrono::milliseconds slow_request = kSlowRequest;
  size_t bodies_held = kMaxBodiesHeld;
  std::chrono::milliseconds send_timeout = kSendTimeout;
};

/// Told the kebab-case reason of every request or connection the server itself refuses or
/// closes at a limit ("malformed-request", "head-too-large", "body-too-large",
/// "too-many-connections", "upgrade-not-supported", "idle-timeout", "idle-evicted",
/// "slow-request-evicted", "node-busy", "send-timeout", "request-head-timeout");
/// the node counts them in
/// sam_node_refusals_total. Called from connection threads: must be thread-safe.
using RefusalCounter = std::function<void(std::string_view reason)>;

using Headers = std::vector<std::pair<std::string, std::string>>;

/// Value of the first field named `name` (case-insensitive), or nullopt.
std::optional<std::string> findHeader(const Headers& headers, std::string_view name);

struct Request {
  std::string method;
  std::string target;  ///< as sent (origin-form)
  std::string path;    ///< target without the query, percent-decoding NOT applied
  std::string query;   ///< after '?', without it; empty if none
  Headers headers;
  std::string body;
  /// X-Sam-Agent as set by sam-box; empty if absent.
  std::string agent;
};

/// Writes one response. Either send() once, or begin() then any number of write() then
/// finish(). Every call returns false once the client has gone away (the handler should then
/// stop producing).
class ResponseWriter {
 public:
  virtual ~ResponseWriter() = default;
  /// Complete response with Content-Length.
  virtual bool send(int status, const Headers& headers, std::string_view body) = 0;
  /// Starts a response. A field of `headers` that is not a valid field (proto::isToken(),
  /// proto::isFieldValue()) is not written: logged once per response and counted as the refusal
  /// "bad-response-field" (routes sanitise what they relay; this is the last line).
  /// `content_length` set: exactly that many body bytes follow, and a non-empty body's head is held
  /// back to go out with the first write() (one wake-up of the client per response); unset: the
  /// body is sent chunked and the head goes out at once. Hop-by-hop fields in `headers`
  /// (Connection, Transfer-Encoding, Content-Length, Keep-Alive) are dropped; the writer sets its
  /// own.
  virtual bool begin(int status, const Headers& headers, std::optional<size_t> content_length) = 0;
  /// Sends body bytes now (no buffering beyond the socket's).
  virtual bool write(std::string_view data) = 0;
  /// Ends the body.
  virtual bool finish() = 0;
  /// True once begin() or send() was called.
  [[nodiscard]] virtual bool started() const = 0;
  /// The status given to begin() or send(); 0 before either was called.
  [[nodiscard]] virtual int status() const = 0;
};

using Handler = std::function<void(const Request&, ResponseWriter&)>;

/// True while the calling thread serves a request of an HttpServer whose stop() was called;
/// false on any other thread. Long work inside a handler polls it to give up promptly.
bool stopRequested();

/// Serves `handler` on a Unix socket at `socket_path` (mode 0600). Throws std::runtime_error
/// naming the path and errno if it cannot bind. `refusals` (optional) counts what the server
/// refuses on its own; `limits` are the idle and request-head timeouts.
class HttpServer {
 public:
  HttpServer(std::string socket_path, Handler handler, RefusalCounter refusals = {},
             ServerLimits limits = {});
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;
  /// Accepts until stop(); returns after every connection thread has finished (handlers
  /// blocked on an upstream transfer give up within about a second of stop()).
  void serve();
  /// Thread- and async-signal-safe: makes serve() return; stopRequested() turns true on the
  /// connection threads.
  void stop();

 private:
  struct Impl;
  Impl* impl_;
};

/// Convenience: a JSON response.
bool sendJson(ResponseWriter& out, int status, const std::string& json);

/// The answer every refusal and failure gives (docs/sam-node.md): status `status`, body
/// {"error": {"message": message, "type": type, "code": reason}}, and `reason` (kebab case)
/// in Sam-Node-Reason. `type` is "sam_node_refusal" (the request was refused) or
/// "sam_node_error" (allowed, but the node or an upstream failed). Bytes of `message` that are
/// not UTF-8 are replaced by U+FFFD. Returns what ResponseWriter::send() returns.
bool sendProblem(ResponseWriter& out, int status, std::string_view type, std::string_view reason,
                 std::string_view message);

}  // namespace samnode
