// See json_limits.h. The depth is counted by nlohmann's parser callback, which the DOM parser
// calls at every array or object start with the number of containers already open around it.

#include "sam-node/json_limits.h"

#include <string>

namespace samnode {

namespace {

/// Thrown from the parser callback to stop at the first too-deep container: the rest of the
/// text is neither scanned nor built.
struct TooDeep {};

}  // namespace

UntrustedJson parseUntrustedJson(std::string_view text, int max_depth) {
  using nlohmann::json;
  UntrustedJson out;
  auto limit = [max_depth](int depth, json::parse_event_t event, json& /*parsed*/) {
    const bool opens =
        event == json::parse_event_t::object_start || event == json::parse_event_t::array_start;
    // `depth` counts the containers around this one, so this one is at level depth + 1.
    if (opens && depth >= max_depth) throw TooDeep{};
    return true;
  };
  try {
    out.value = json::parse(text, limit, /*allow_exceptions=*/true);
  } catch (const TooDeep&) {
    out.failure = UntrustedJson::kTooDeep;
    out.value = nullptr;
    out.why = "nested deeper than " + std::to_string(max_depth) + " arrays/objects";
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

}  // namespace samnode
