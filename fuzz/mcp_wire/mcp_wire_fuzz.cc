// An upstream MCP server's answer (an SSE stream or a JSON body) and an agent's JSON-RPC
// message are untrusted bytes: SseParser must give the same events however the bytes are split
// across reads, honour its size cap, and classify() must describe every JSON value without
// crashing, agreeing with isResponseTo().
//
// Input layout: byte 0 chooses the split points and the event cap; the rest is fed to the
// parser and, separately, parsed as one JSON-RPC message.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sam-node/mcp_wire.h"

namespace {

using samnode::mcp::SseEvent;
using samnode::mcp::SseParser;

bool sameEvents(const std::vector<SseEvent>& a, const std::vector<SseEvent>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].type != b[i].type || a[i].data != b[i].data || a[i].id != b[i].id) return false;
  return true;
}

void fuzzSse(uint8_t control, std::string_view text) {
  // A small cap (sometimes) so the over-size path is reached with short inputs.
  const size_t cap = (control & 0x80) != 0 ? size_t{64} : size_t{16} * 1024 * 1024;
  std::vector<SseEvent> whole;
  SseParser one(cap);
  const bool whole_ok = one.feed(text, whole);

  // The same bytes in pieces of 1..8 bytes (stride from the control byte).
  const size_t stride = 1 + (control & 0x07);
  std::vector<SseEvent> pieces;
  SseParser many(cap);
  bool pieces_ok = true;
  for (size_t at = 0; at < text.size() && pieces_ok; at += stride)
    pieces_ok = many.feed(text.substr(at, stride), pieces);
  if (whole_ok != pieces_ok) __builtin_trap();
  if (whole_ok && !sameEvents(whole, pieces)) __builtin_trap();
  // A failed parser stays failed.
  if (!whole_ok && one.feed("data: x\n\n", whole)) __builtin_trap();
  for (const auto& e : whole) {
    if (e.data.size() > cap) __builtin_trap();
    if (e.id.find('\0') != std::string::npos) __builtin_trap();
  }
}

void fuzzJsonRpc(std::string_view text) {
  const auto value = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return;
  const samnode::mcp::Message m = samnode::mcp::classify(value);
  switch (m.kind) {
    case samnode::mcp::MessageKind::kInvalid:
      if (m.why.empty()) __builtin_trap();
      break;
    case samnode::mcp::MessageKind::kRequest:
      if (!m.id.is_string() && !m.id.is_number_integer()) __builtin_trap();
      break;
    case samnode::mcp::MessageKind::kNotification:
      if (!m.id.is_null()) __builtin_trap();
      break;
    case samnode::mcp::MessageKind::kResponse:
      if (!samnode::mcp::isResponseTo(value, m.id)) __builtin_trap();
      break;
  }
  if (m.kind != samnode::mcp::MessageKind::kInvalid && !m.params.is_null() &&
      !m.params.is_object() && !m.params.is_array())
    __builtin_trap();
  // The node answers every message; the answer must serialize whatever the id was.
  (void)samnode::mcp::rpcError(m.id, samnode::mcp::kInvalidRequest, m.why)
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (!samnode::mcp::knownProtocolVersion(samnode::mcp::negotiateProtocolVersion(text)))
    __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  fuzzSse(data[0], text);
  fuzzJsonRpc(text);
  return 0;
}
