#include "netstack/log.h"

#include <unistd.h>

#include <cstdlib>
#include <string>

namespace netstack::log {
namespace {

void write(const char* level, std::string_view msg, const nlohmann::json& fields) {
  nlohmann::json line = {{"level", level}, {"program", "nano-init"}, {"msg", msg}};
  if (fields.is_object()) {
    for (const auto& [key, value] : fields.items()) line[key] = value;
  }
  // Replace invalid UTF-8 (fields may hold bytes from the network) instead of throwing.
  std::string text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  text.push_back('\n');
  // One write(2) per line, so lines from nano-init and its child never interleave mid-line.
  [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, text.data(), text.size());
}

}  // namespace

void info(std::string_view msg, const nlohmann::json& fields) { write("info", msg, fields); }
void warn(std::string_view msg, const nlohmann::json& fields) { write("warn", msg, fields); }
void error(std::string_view msg, const nlohmann::json& fields) { write("error", msg, fields); }
void debug(std::string_view msg, const nlohmann::json& fields) {
  static const bool enabled = std::getenv("NANO_INIT_DEBUG") != nullptr;
  if (enabled) write("debug", msg, fields);
}

}  // namespace netstack::log
