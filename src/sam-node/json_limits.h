#pragma once
// Parsing JSON that comes from outside the node (agents' request bodies, upstream MCP, model
// and a2a answers) with a bound on nesting depth. nlohmann::json parses iteratively and frees
// iteratively, but copying a value, comparing it and dump() recurse once per nesting level:
// a megabyte of '[' parses fine and then overflows a connection thread's stack at the first
// copy. Every value from outside goes through parseUntrustedJson() before it is used.

#include <nlohmann/json.hpp>

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace samnode {

/// Most arrays and objects one inside another in a JSON text from outside the node. Real
/// JSON-RPC messages, chat requests and tool schemas nest a dozen levels at most; 64 leaves
/// room for deep schemas and keeps any later recursion (copy, dump, ==) a few KiB of stack.
inline constexpr int kMaxJsonDepth = 64;

/// Most values (scalars, arrays and objects, each counted once) in one JSON text from outside
/// the node. Built, a value costs about 35 bytes of heap: a 16 MiB body of "0,0,0,..." was
/// 8 million values and about 280 MB, and a few such requests at once from an agent with no
/// grant at all could get the node OOM-killed. JSON-RPC messages, tool lists and agent cards
/// are far smaller; 100,000 values bound one parse to a few MB.
inline constexpr size_t kMaxJsonValues = 100000;

/// The outcome of parseUntrustedJson().
struct UntrustedJson {
  enum Failure {
    kNone,     ///< `value` holds the parsed value
    kSyntax,   ///< not JSON (RFC 8259), incl. invalid UTF-8, trailing bytes, a number beyond double
    kTooDeep,  ///< more than the allowed nesting of arrays and objects
    kTooMany,  ///< more than the allowed number of values
  };
  Failure failure = kNone;
  nlohmann::json value;  ///< the parsed value; null unless failure == kNone
  std::string why;       ///< failure != kNone: the reason, for a log line or an error message

  [[nodiscard]] bool ok() const { return failure == kNone; }
  /// Valid JSON as far as it was read, but over a limit (kTooDeep or kTooMany).
  [[nodiscard]] bool overLimit() const { return failure == kTooDeep || failure == kTooMany; }
};

/// Parses `text` (one whole JSON text, RFC 8259; the caller has already bounded its size) and
/// refuses it once an array or object opens at nesting level `max_depth` + 1 (the top-level
/// value is level 1), or once its value number `max_values` + 1 starts, without building
/// anything past that point. Never throws for bad input; the result carries kSyntax, kTooDeep
/// or kTooMany and a reason such as "nested deeper than 64 arrays/objects", "more than 100000
/// values" or "not valid JSON (at byte 7)" (never a quote of the input).
UntrustedJson parseUntrustedJson(std::string_view text, int max_depth = kMaxJsonDepth,
                                 size_t max_values = kMaxJsonValues);

/// The string value of member `key` of the top-level object of `text`, building nothing else:
/// every other value is dropped as soon as it is parsed, so memory stays small whatever the
/// size of the rest (used to route /v1 requests by "model" without a value limit: an
/// embeddings request may carry a million token ids). nullopt when `text` is not JSON, is
/// nested deeper than `max_depth`, is not an object, or has no such string member.
std::optional<std::string> topLevelString(std::string_view text, std::string_view key,
                                          int max_depth = kMaxJsonDepth);

}  // namespace samnode
