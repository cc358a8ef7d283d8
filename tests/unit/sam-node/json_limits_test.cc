// parseUntrustedJson (json_limits.h): the depth cap every JSON from outside the node goes
// through, and that a refused text neither crashes nor is half-used.

#include "sam-node/json_limits.h"

#include <gtest/gtest.h>

#include <string>

namespace samnode {
namespace {

std::string nested(size_t depth, char open = '[', char close = ']') {
  return std::string(depth, open) + std::string(depth, close);
}

TEST(JsonLimits, ParsesOrdinaryJson) {
  UntrustedJson r = parseUntrustedJson(R"({"jsonrpc":"2.0","id":1,"params":{"a":[1,{"b":null}]}})");
  ASSERT_TRUE(r.ok()) << r.why;
  EXPECT_EQ(r.value["params"]["a"][1]["b"], nullptr);
  EXPECT_TRUE(r.why.empty());
  EXPECT_TRUE(parseUntrustedJson("3").ok());
  EXPECT_TRUE(parseUntrustedJson(R"("x")").ok());
}

TEST(JsonLimits, TakesExactlyTheCapAndRefusesOneMore) {
  UntrustedJson at = parseUntrustedJson(nested(kMaxJsonDepth));
  ASSERT_TRUE(at.ok()) << at.why;
  UntrustedJson over = parseUntrustedJson(nested(kMaxJsonDepth + 1));
  EXPECT_EQ(over.failure, UntrustedJson::kTooDeep);
  EXPECT_EQ(over.why, "nested deeper than 64 arrays/objects");
  EXPECT_TRUE(over.value.is_null());
  // Objects and arrays count alike, mixed.
  std::string mixed;
  for (int i = 0; i <= kMaxJsonDepth; ++i) mixed += i % 2 ? "[" : R"({"k":)";
  mixed += "0";
  for (int i = kMaxJsonDepth; i >= 0; --i) mixed += i % 2 ? "]" : "}";
  EXPECT_EQ(parseUntrustedJson(mixed).failure, UntrustedJson::kTooDeep);
  EXPECT_EQ(parseUntrustedJson(nested(3), 2).failure, UntrustedJson::kTooDeep);
  EXPECT_TRUE(parseUntrustedJson(nested(2), 2).ok());
}

TEST(JsonLimits, WideIsNotDeep) {
  std::string wide = "[";
  for (int i = 0; i < 1000; ++i) wide += std::string(i ? "," : "") + nested(kMaxJsonDepth - 1);
  wide += "]";
  EXPECT_TRUE(parseUntrustedJson(wide).ok());
}

TEST(JsonLimits, HalfAMillionLevelsAreRefusedWithoutACrash) {
  // The text the hostile-agent test sends: a copy or dump() of it overflows a thread's stack.
  std::string text = R"({"jsonrpc":"2.0","id":1,"params":{"x":)" + nested(500000) + "}}";
  EXPECT_EQ(parseUntrustedJson(text).failure, UntrustedJson::kTooDeep);
  // Deep and broken: refused either way, never thrown.
  EXPECT_FALSE(parseUntrustedJson(std::string(500000, '[')).ok());
}

TEST(JsonLimits, SyntaxErrorsNameTheByteNotTheInput) {
  for (const char* text : {"", "{", "{oops", R"({"a":1}x)", "[1,]", "\"\xff\"", "nul"}) {
    SCOPED_TRACE(text);
    UntrustedJson r = parseUntrustedJson(text);
    EXPECT_EQ(r.failure, UntrustedJson::kSyntax);
    EXPECT_EQ(r.why.rfind("not valid JSON (at byte ", 0), 0u) << r.why;
    EXPECT_EQ(r.why.find("oops"), std::string::npos);
  }
  // nlohmann reports a number beyond double as out_of_range, not parse_error: still refused.
  UntrustedJson huge = parseUntrustedJson(R"({"id":1e999999})");
  EXPECT_EQ(huge.failure, UntrustedJson::kSyntax);
  EXPECT_EQ(huge.why, "not valid JSON (a number out of range)");
}

std::string zeros(size_t n) {
  std::string text = "[";
  for (size_t i = 0; i < n; ++i) text += i ? ",0" : "0";
  return text + "]";
}

TEST(JsonLimits, TakesExactlyTheValueCapAndRefusesOneMore) {
  // The array itself is one value.
  EXPECT_TRUE(parseUntrustedJson(zeros(kMaxJsonValues - 1)).ok());
  UntrustedJson over = parseUntrustedJson(zeros(kMaxJsonValues));
  EXPECT_EQ(over.failure, UntrustedJson::kTooMany);
  EXPECT_TRUE(over.overLimit());
  EXPECT_EQ(over.why, "more than 100000 values");
  EXPECT_TRUE(over.value.is_null());
  // Containers count like scalars.
  EXPECT_EQ(parseUntrustedJson("[[],{},[]]", kMaxJsonDepth, 3).failure, UntrustedJson::kTooMany);
  EXPECT_TRUE(parseUntrustedJson(R"({"a":"b"})", kMaxJsonDepth, 2).ok());
}

TEST(JsonLimits, SixteenMegabytesOfZerosAreRefused) {
  // What the adversarial review sent to /ops/spawn: 8 million values, about 280 MB built.
  EXPECT_EQ(parseUntrustedJson(zeros(8u << 20)).failure, UntrustedJson::kTooMany);
}

TEST(JsonLimits, TopLevelStringKeepsOnlyThatMember) {
  EXPECT_EQ(topLevelString(R"({"model":"chat","messages":[{"model":"x"}]})", "model"), "chat");
  EXPECT_EQ(topLevelString(R"({"messages":[{"role":"user"}],"model":"m","n":[1,[2,{}]]})", "model"),
            "m");
  // Only the top-level member: not one of a nested object, not a non-string.
  EXPECT_EQ(topLevelString(R"({"a":{"model":"nested"}})", "model"), std::nullopt);
  EXPECT_EQ(topLevelString(R"([{"model":"in-array"}])", "model"), std::nullopt);
  EXPECT_EQ(topLevelString(R"({"model":7})", "model"), std::nullopt);
  EXPECT_EQ(topLevelString(R"({"model":["chat"]})", "model"), std::nullopt);
  EXPECT_EQ(topLevelString(R"("model")", "model"), std::nullopt);
  EXPECT_EQ(topLevelString("{oops", "model"), std::nullopt);
  EXPECT_EQ(topLevelString(R"({"model":"x",)" + nested(500000) + "}", "model"), std::nullopt);
  // Duplicate keys: the last one wins, as for the whole parse.
  EXPECT_EQ(topLevelString(R"({"model":"a","model":"b"})", "model"), "b");
  // A million distinct keys beside it: none is kept (each used to leave a map entry).
  std::string keys = "{";
  for (int i = 0; i < 1000000; ++i) keys += "\"" + std::to_string(i) + "\":0,";
  EXPECT_EQ(topLevelString(keys + R"("model":"k"})", "model"), "k");
  // No value limit: a million token ids route like any request.
  EXPECT_EQ(topLevelString(R"({"input":)" + zeros(1000000) + R"(,"model":"embed"})", "model"),
            "embed");
}

}  // namespace
}  // namespace samnode
