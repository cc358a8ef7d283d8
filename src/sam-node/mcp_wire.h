#pragma once
// The wire pieces of MCP's Streamable HTTP transport (MCP spec 2025-03-26, 2025-06-18,
// 2025-11-25, "Transports"; JSON-RPC 2.0), kept pure so they are unit-tested without a server:
// protocol version negotiation, JSON-RPC message shapes, and the Server-Sent Events parser
// (WHATWG HTML, "Server-sent events", §9.2.6 "Interpreting an event stream") an MCP client needs
// when a server answers a POST with text/event-stream.

#include <nlohmann/json.hpp>

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace samnode::mcp {

/// The newest revision this node speaks; offered to upstreams and answered to clients that
/// ask for a revision we do not know.
inline constexpr std::string_view kLatestProtocolVersion = "2025-11-25";

/// True for a revision this node implements ("2024-11-05", "2025-03-26", "2025-06-18",
/// "2025-11-25"): they share initialize, ping, tools/list and tools/call as used here.
bool knownProtocolVersion(std::string_view version);

/// The version the server answers to initialize: the client's if known (spec, "Version
/// Negotiation": the server MUST respond with the same version if it supports it), else
/// kLatestProtocolVersion.
std::string negotiateProtocolVersion(std::string_view requested);

/// JSON-RPC 2.0 error codes (JSON-RPC 2.0 §5.1).
inline constexpr int kParseError = -32700;
inline constexpr int kInvalidRequest = -32600;
inline constexpr int kMethodNotFound = -32601;
inline constexpr int kInvalidParams = -32602;
inline constexpr int kInternalError = -32603;

/// {"jsonrpc":"2.0","id":id,"result":result}.
nlohmann::json rpcResult(const nlohmann::json& id, nlohmann::json result);
/// {"jsonrpc":"2.0","id":id,"error":{"code":code,"message":message}}; `id` null when the
/// request's id could not be read (JSON-RPC 2.0 §5).
nlohmann::json rpcError(const nlohmann::json& id, int code, std::string_view message);
/// A tools/call result that reports a failure to the model rather than to the transport
/// (MCP "Tools", error handling): {"content":[{"type":"text","text":text}],"isError":true}.
nlohmann::json toolErrorResult(std::string_view text);

enum class MessageKind { kRequest, kNotification, kResponse, kInvalid };

/// One JSON-RPC message as received.
struct Message {
  MessageKind kind = MessageKind::kInvalid;
  nlohmann::json id;      ///< string or integer; null for notifications and invalid ones
  std::string method;     ///< requests and notifications
  nlohmann::json params;  ///< object or array; null if absent
  std::string why;        ///< kInvalid: what is wrong, naming the member
};

/// Classifies a parsed JSON value. kInvalid (with `why`) for: not an object, "jsonrpc" not
/// "2.0", an id that is not a string or an integer, a method that is not a string, params
/// that are neither object nor array, a response without exactly one of result/error.
/// Arrays (JSON-RPC batches) are kInvalid: MCP 2025-06-18 removed batching. Takes `value` by
/// value so that a caller done with it can move it in: params are moved out, not copied.
Message classify(nlohmann::json value);

/// True if `message` is a JSON-RPC response (result or error) whose id equals `id`.
bool isResponseTo(const nlohmann::json& message, const nlohmann::json& id);

/// One dispatched SSE event.
struct SseEvent {
  std::string type;  ///< the "event" field; empty means "message"
  std::string data;  ///< "data" lines joined with '\n'
  std::string id;    ///< the "id" field, empty if none
};

/// Incremental SSE parser: feed() bytes as they arrive in any split; complete events come out.
/// Lines end with CRLF, LF or CR (a CR at the end of one chunk and an LF at the start of the
/// next are one line end); ':' lines are comments; a leading BOM is skipped; "retry" is ignored.
class SseParser {
 public:
  /// Most bytes of one event (its data plus the current line); beyond it feed() fails.
  explicit SseParser(size_t max_event_bytes = size_t{16} * 1024 * 1024)
      : max_event_bytes_(max_event_bytes) {}
  /// Appends dispatched events to `out`. Returns false (and stays failed) once an event grew
  /// beyond max_event_bytes.
  bool feed(std::string_view bytes, std::vector<SseEvent>& out);
  /// Bytes held for the event not yet dispatched (its data and the current line).
  size_t held() const { return pending_.size() + event_.data.size(); }

 private:
  void line(std::string_view text, std::vector<SseEvent>& out);
  size_t max_event_bytes_;
  std::string pending_;  ///< the current, unterminated line
  SseEvent event_;
  bool has_data_ = false;
  bool skip_lf_ = false;  ///< the last byte seen was a CR ending a line
  bool started_ = false;  ///< past the optional BOM
  bool failed_ = false;
};

}  // namespace samnode::mcp
