// See json_limits.h. The depth is counted by nlohmann's parser callback, which the DOM parser
// calls at every array or object start with the number of containers already open around it.

#include "sam-node/json_limits.h"

#include <string>

namespace samnode {

namespace {

/// Thrown from the parser callback to stop at the first too-deep container: the rest of the
/// text is neither scanned nor built.
struct TooDeep {};
/// The same, at the first value past the value limit.
struct TooMany {};

bool opens(nlohmann::json::parse_event_t event) {
  return event == nlohmann::json::parse_event_t::object_start ||
         event == nlohmann::json::parse_event_t::array_start;
}

}  // namespace

UntrustedJson parseUntrustedJson(std::string_view text, int max_depth, size_t max_values) {
  using nlohmann::json;
  UntrustedJson out;
  size_t values = 0;
  auto limit = [max_depth, max_values, &values](int depth, json::parse_event_t event,
                                                json& /*parsed*/) {
    // `depth` counts the containers around this one, so this one is at level depth + 1.
    if (opens(event) && depth >= max_depth) throw TooDeep{};
    // A value starts: a container when it opens, a scalar when it is parsed.
    if ((opens(event) || event == json::parse_event_t::value) && ++values > max_values)
      throw TooMany{};
    return true;
  };
  try {
    out.value = json::parse(text, limit, /*allow_exceptions=*/true);
  } catch (const TooDeep&) {
    out.failure = UntrustedJson::kTooDeep;
    out.value = nullptr;
    out.why = "nested deeper than " + std::to_string(max_depth) + " arrays/objects";
  } catch (const TooMany&) {
    out.failure = UntrustedJson::kTooMany;
    out.value = nullptr;
    out.why = "more than " + std::to_string(max_values) + " values";
  } catch (const json::parse_error& e) {
    out.failure = UntrustedJson::kSyntax;
    out.value = nullptr;
    // The byte offset, not e.what(): that quotes the input, which may be anything.
    out.why = "not valid JSON (at byte " + std::to_string(e.byte) + ")";
  } catch (const json::exception&) {
    // out_of_range 406: a number beyond double (1e999999); the parser gives no offset.
    out.failure = UntrustedJson::kSyntax;
    out.value = nullptr;
    out.why = "not valid JSON (a number out of range)";
  }
  return out;
}

std::optional<std::string> topLevelString(std::string_view text, std::string_view key,
                                          int max_depth) {
  using nlohmann::json;
  std::string member;  // the key of the top-level member being parsed
  auto keep = [&](int depth, json::parse_event_t event, json& parsed) {
    if (opens(event) && depth >= max_depth) throw TooDeep{};
    switch (event) {
      case json::parse_event_t::key:
        // Another key, kept, would leave an entry (holding a discarded value) per key: a body
        // of a million distinct keys would build a million-entry map.
        if (depth == 1) member = parsed.get<std::string>();
        return depth == 1 && member == key;
      case json::parse_event_t::value:
        // A scalar of the top-level object is at depth 1; keep only the one asked for.
        return depth == 0 || (depth == 1 && member == key && parsed.is_string());
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        return depth == 0;  // a nested container is dropped once complete
      default:
        return true;
    }
  };
  try {
    const json doc = json::parse(text, keep, /*allow_exceptions=*/true);
    if (!doc.is_object()) return std::nullopt;
    const auto it = doc.find(key);
    if (it == doc.end() || !it->is_string()) return std::nullopt;
    return it->get<std::string>();
  } catch (const TooDeep&) {
    return std::nullopt;
  } catch (const json::exception&) {
    return std::nullopt;
  }
}

}  // namespace samnode
