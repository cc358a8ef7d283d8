#include "sam-node/mcp_wire.h"

#include <array>

namespace samnode::mcp {

using nlohmann::json;

bool knownProtocolVersion(std::string_view version) {
  static constexpr std::array<std::string_view, 4> kKnown = {"2024-11-05", "2025-03-26",
                                                             "2025-06-18", "2025-11-25"};
  for (auto known : kKnown) {
    if (version == known) return true;
  }
  return false;
}

std::string negotiateProtocolVersion(std::string_view requested) {
  return std::string(knownProtocolVersion(requested) ? requested : kLatestProtocolVersion);
}

json rpcResult(const json& id, json result) {
  return json{{"jsonrpc", "2.0"}, {"id", id}, {"result", std::move(result)}};
}

json rpcError(const json& id, int code, std::string_view message) {
  return json{{"jsonrpc", "2.0"},
              {"id", id},
              {"error", {{"code", code}, {"message", std::string(message)}}}};
}

json toolErrorResult(std::string_view text) {
  return json{{"content", json::array({{{"type", "text"}, {"text", std::string(text)}}})},
              {"isError", true}};
}

namespace {

Message invalid(std::string why, json id = nullptr) {
  Message m;
  m.kind = MessageKind::kInvalid;
  m.why = std::move(why);
  m.id = std::move(id);
  return m;
}

}  // namespace

Message classify(json value) {
  if (value.is_array()) {
    return invalid(
        "batch requests (JSON arrays) are not supported: MCP 2025-06-18 removed "
        "JSON-RPC batching; send one message per POST");
  }
  if (!value.is_object()) return invalid("a JSON-RPC message must be a JSON object");
  auto version = value.find("jsonrpc");
  if (version == value.end() || !version->is_string() || *version != "2.0") {
    return invalid("\"jsonrpc\" must be \"2.0\"");
  }
  json id = nullptr;
  auto id_it = value.find("id");
  bool has_id = id_it != value.end();
  if (has_id) {
    // MCP: "the ID MUST NOT be null"; JSON-RPC allows string or number, MCP integers.
    if (!id_it->is_string() && !id_it->is_number_integer()) {
      return invalid("\"id\" must be a string or an integer");
    }
    id = *id_it;
  }
  auto method = value.find("method");
  if (method != value.end()) {
    if (!method->is_string()) return invalid("\"method\" must be a string", id);
    Message m;
    m.kind = has_id ? MessageKind::kRequest : MessageKind::kNotification;
    m.id = id;
    m.method = method->get<std::string>();
    auto params = value.find("params");
    if (params != value.end()) {
      if (!params->is_object() && !params->is_array()) {
        return invalid("\"params\" must be an object or an array", id);
      }
      m.params = std::move(*params);  // a large argument is not held twice
    }
    return m;
  }
  bool has_result = value.contains("result");
  bool has_error = value.contains("error");
  if (has_id && has_result != has_error) {
    Message m;
    m.kind = MessageKind::kResponse;
    m.id = id;
    return m;
  }
  return invalid(
      "a message needs \"method\" (request, notification) or \"id\" with exactly one "
      "of \"result\" and \"error\" (response)",
      id);
}

bool isResponseTo(const json& message, const json& id) {
  if (!message.is_object()) return false;
  auto it = message.find("id");
  if (it == message.end() || *it != id) return false;
  return message.contains("result") != message.contains("error");
}

bool SseParser::feed(std::string_view bytes, std::vector<SseEvent>& out) {
  if (failed_) return false;
  for (size_t i = 0; i < bytes.size(); ++i) {
    char c = bytes[i];
    if (skip_lf_) {
      skip_lf_ = false;
      if (c == '\n') continue;
    }
    if (!started_) {
      // A UTF-8 BOM may open the stream; collect up to three bytes before deciding.
      pending_ += c;
      static constexpr std::string_view kBom = "\xEF\xBB\xBF";
      if (kBom.starts_with(pending_)) {
        if (pending_.size() == kBom.size()) {
          pending_.clear();
          started_ = true;
        }
        continue;
      }
      started_ = true;
      std::string replay = std::move(pending_);
      pending_.clear();
      if (!feed(replay, out)) return false;
      continue;
    }
    if (c == '\r' || c == '\n') {
      line(pending_, out);
      pending_.clear();
      skip_lf_ = c == '\r';
      continue;
    }
    pending_ += c;
    if (pending_.size() + event_.data.size() > max_event_bytes_) {
      failed_ = true;
      return false;
    }
  }
  if (event_.data.size() > max_event_bytes_) {
    failed_ = true;
    return false;
  }
  return true;
}

void SseParser::line(std::string_view text, std::vector<SseEvent>& out) {
  if (text.empty()) {
    // A blank line dispatches the event; one without data is dropped (§9.2.6).
    if (has_data_) out.push_back(std::move(event_));
    event_ = SseEvent{};
    has_data_ = false;
    return;
  }
  if (text[0] == ':') return;
  std::string_view field = text;
  std::string_view value;
  if (auto colon = text.find(':'); colon != std::string_view::npos) {
    field = text.substr(0, colon);
    value = text.substr(colon + 1);
    if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
  }
  if (field == "data") {
    if (has_data_) event_.data += '\n';
    event_.data += value;
    has_data_ = true;
  } else if (field == "event") {
    event_.type = value;
  } else if (field == "id") {
    if (value.find('\0') == std::string_view::npos) event_.id = value;
  }
}

}  // namespace samnode::mcp
