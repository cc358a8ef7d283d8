#pragma once
// A tiny JSON-lines logger on stderr. netstack is linked into the static nano-init, so it
// cannot use common/log (spdlog is a shared library on Debian); one line per event, with the
// same shape as common's lines: {"level":..,"msg":..,<fields>}.

#include <nlohmann/json.hpp>

#include <string_view>

namespace netstack::log {

void info(std::string_view msg, const nlohmann::json& fields = nlohmann::json::object());
void warn(std::string_view msg, const nlohmann::json& fields = nlohmann::json::object());
void error(std::string_view msg, const nlohmann::json& fields = nlohmann::json::object());
/// Debug lines are written only when NANO_INIT_DEBUG is set in the environment.
void debug(std::string_view msg, const nlohmann::json& fields = nlohmann::json::object());

}  // namespace netstack::log
