// MCP wire pieces (mcp_wire.h): version negotiation, JSON-RPC classification, SSE parsing.

#include "sam-node/mcp_wire.h"

#include <gtest/gtest.h>

namespace samnode::mcp {
namespace {

using nlohmann::json;

TEST(McpWire, NegotiatesKnownVersionsAndOffersLatestOtherwise) {
  EXPECT_EQ(negotiateProtocolVersion("2025-03-26"), "2025-03-26");
  EXPECT_EQ(negotiateProtocolVersion("2025-06-18"), "2025-06-18");
  EXPECT_EQ(negotiateProtocolVersion("2025-11-25"), "2025-11-25");
  EXPECT_EQ(negotiateProtocolVersion("1999-01-01"), std::string(kLatestProtocolVersion));
  EXPECT_EQ(negotiateProtocolVersion(""), std::string(kLatestProtocolVersion));
}

TEST(McpWire, ClassifiesMessages) {
  auto m = classify(json::parse(R"({"jsonrpc":"2.0","id":1,"method":"ping"})"));
  EXPECT_EQ(m.kind, MessageKind::kRequest);
  EXPECT_EQ(m.id, 1);
  EXPECT_EQ(m.method, "ping");
  m = classify(json::parse(R"({"jsonrpc":"2.0","method":"notifications/initialized"})"));
  EXPECT_EQ(m.kind, MessageKind::kNotification);
  m = classify(json::parse(R"({"jsonrpc":"2.0","id":"a","result":{}})"));
  EXPECT_EQ(m.kind, MessageKind::kResponse);
  m = classify(json::parse(R"({"jsonrpc":"2.0","id":"a","method":"x","params":{"k":1}})"));
  EXPECT_EQ(m.params["k"], 1);
}

TEST(McpWire, RefusesInvalidMessagesNamingTheMember) {
  struct Case {
    const char* text;
    const char* says;
  } cases[] = {
      {R"([{"jsonrpc":"2.0","id":1,"method":"ping"}])", "batch"},
      {R"("ping")", "JSON object"},
      {R"({"id":1,"method":"ping"})", "\"jsonrpc\""},
      {R"({"jsonrpc":"1.0","id":1,"method":"ping"})", "\"jsonrpc\""},
      {R"({"jsonrpc":"2.0","id":null,"method":"ping"})", "\"id\""},
      {R"({"jsonrpc":"2.0","id":1.5,"method":"ping"})", "\"id\""},
      {R"({"jsonrpc":"2.0","id":1,"method":7})", "\"method\""},
      {R"({"jsonrpc":"2.0","id":1,"method":"x","params":3})", "\"params\""},
      {R"({"jsonrpc":"2.0","id":1,"result":{},"error":{}})", "exactly one"},
  };
  for (const auto& c : cases) {
    auto m = classify(json::parse(c.text));
    EXPECT_EQ(m.kind, MessageKind::kInvalid) << c.text;
    EXPECT_NE(m.why.find(c.says), std::string::npos) << c.text << " -> " << m.why;
  }
}

TEST(McpWire, Shapes) {
  EXPECT_EQ(rpcError(nullptr, kParseError, "bad").dump(),
            R"({"error":{"code":-32700,"message":"bad"},"id":null,"jsonrpc":"2.0"})");
  json r = toolErrorResult("not granted");
  EXPECT_EQ(r["isError"], true);
  EXPECT_EQ(r["content"][0]["type"], "text");
  EXPECT_EQ(r["content"][0]["text"], "not granted");
  EXPECT_TRUE(isResponseTo(rpcResult(7, json::object()), 7));
  EXPECT_FALSE(isResponseTo(rpcResult(7, json::object()), 8));
  EXPECT_FALSE(isResponseTo(json::parse(R"({"jsonrpc":"2.0","id":7,"method":"x"})"), 7));
}

std::vector<SseEvent> parseAll(std::string_view text, size_t split) {
  SseParser parser;
  std::vector<SseEvent> out;
  for (size_t i = 0; i < text.size(); i += split) {
    EXPECT_TRUE(parser.feed(text.substr(i, split), out));
  }
  return out;
}

TEST(McpWire, SseEventsInAnySplit) {
  std::string stream =
      "\xEF\xBB\xBF: comment\r\n"
      "event: message\r\n"
      "id: 1\r\n"
      "data: {\"a\":\r\n"
      "data:1}\r\n"
      "\r\n"
      "retry: 10\n"
      "data: second\r"
      "\r"
      "event: ping\n"
      "\n"  // no data: not dispatched
      "data: third\n\n"
      "data: unterminated";
  for (size_t split : {1, 2, 3, 7, 1000}) {
    auto events = parseAll(stream, split);
    ASSERT_EQ(events.size(), 3u) << "split " << split;
    EXPECT_EQ(events[0].type, "message");
    EXPECT_EQ(events[0].id, "1");
    EXPECT_EQ(events[0].data, "{\"a\":\n1}");
    EXPECT_EQ(events[1].data, "second");
    EXPECT_EQ(events[1].type, "");
    EXPECT_EQ(events[2].data, "third");
  }
}

TEST(McpWire, SseRefusesOversizedEvents) {
  SseParser parser(16);
  std::vector<SseEvent> out;
  EXPECT_TRUE(parser.feed("data: short\n\n", out));
  EXPECT_FALSE(parser.feed("data: 0123456789abcdef\n", out));
  EXPECT_FALSE(parser.feed("data: x\n\n", out));  // stays failed
  EXPECT_EQ(out.size(), 1u);
}

}  // namespace
}  // namespace samnode::mcp
