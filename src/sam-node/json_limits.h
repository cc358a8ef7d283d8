#pragma once
// Parsing JSON that comes from outside the node (agents' request bodies, upstream MCP, model
// and a2a answers) with a bound on nesting depth. nlohmann::json parses iteratively and frees
// iteratively, but copying a value, comparing it and dump() recurse once per nesting level:
// a megabyte of '[' parses fine and then overflows a connection thread's stack at the first
// copy. Every value from outside goes through parseUntrustedJson() before it is used.

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace samnode {

/// Most arrays and objects one inside another in a JSON text from outside the node. Real
/// JSON-RPC messages, chat requests and tool schemas nest a dozen levels at most; 64 leaves
/// room for deep schemas and keeps any later recursion (copy, dump, ==) a few KiB of stack.
inline constexpr int kMaxJsonDepth = 64;

/// The outcome of parseUntrustedJson().
struct UntrustedJson {
  enum Failure {
    kNone,     ///< `value` holds the parsed value
    kSyntax,   ///< not JSON (RFC 8259), incl. invalid UTF-8, trailing bytes, a number beyond double
    kTooDeep,  ///< more than the allowed nesting of arrays and objects
  };
  Failure failure = kNone;
  nlohmann::json value;  ///< the parsed value; null unless failure == kNone
  std::string why;       ///< failure != kNone: the reason, for a log line or an error message

  [[nodiscard]] bool ok() const { return failure == kNone; }
};

/// Parses `text` (one whole JSON text, RFC 8259; the caller has already bounded its size) and
/// refuses it once an array or object opens at nesting level `max_depth` + 1 (the top-level
/// value is level 1), without building anything deeper. Never throws for bad input; the result
/// carries kSyntax or kTooDeep and a reason such as "nested deeper than 64 arrays/objects" or
/// "not valid JSON (at byte 7)" (never a quote of the input).
UntrustedJson parseUntrustedJson(std::string_view text, int max_depth = kMaxJsonDepth);

}  // namespace samnode
