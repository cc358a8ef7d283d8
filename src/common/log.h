#pragma once
// Structured logging: every line on stderr is one JSON object, so an operator can grep, jq or
// ship it. Built on spdlog; the JSON encoding is nlohmann-json's, so field values are escaped.

#include <nlohmann/json.hpp>

#include <string_view>

namespace common::log {

enum class Level { kDebug, kInfo, kWarn, kError };

/// Sets up the process-wide logger. `program` becomes the "program" field of every line.
/// `min_level` filters lines below it. Safe to call more than once (the last call wins).
void init(std::string_view program, Level min_level = Level::kInfo);

/// Sets only the "program" field, leaving the logger to be made at the first line: for a
/// short-lived program that may write none (compass-runner pays for every page it touches
/// at start-up; bench/runner_bench.py).
void setProgram(std::string_view program);

/// Writes one JSON line: {"ts": RFC 3339 UTC with ms, "level", "program", "msg", ...fields}.
/// `fields` must be a JSON object (or null); its keys are merged into the line.
void write(Level level, std::string_view msg, const nlohmann::json& fields = nullptr);

inline void info(std::string_view msg, const nlohmann::json& fields = nullptr) {
  write(Level::kInfo, msg, fields);
}
inline void warn(std::string_view msg, const nlohmann::json& fields = nullptr) {
  write(Level::kWarn, msg, fields);
}
inline void error(std::string_view msg, const nlohmann::json& fields = nullptr) {
  write(Level::kError, msg, fields);
}
inline void debug(std::string_view msg, const nlohmann::json& fields = nullptr) {
  write(Level::kDebug, msg, fields);
}

/// Parses "debug", "info", "warn" or "error"; throws std::invalid_argument otherwise.
Level parseLevel(std::string_view text);

}  // namespace common::log
