#include "common/log.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <ctime>
#include <stdexcept>
#include <string>

namespace common::log {
namespace {

std::string g_program = "compass";  // NOLINT(cert-err58-cpp): set once at start-up
Level g_min_level = Level::kInfo;

std::shared_ptr<spdlog::logger> logger() {
  static std::shared_ptr<spdlog::logger> instance = [] {
    auto l = spdlog::stderr_logger_mt("json");
    l->set_pattern("%v");
    l->flush_on(spdlog::level::trace);
    return l;
  }();
  return instance;
}

const char* levelName(Level level) {
  switch (level) {
    case Level::kDebug:
      return "debug";
    case Level::kInfo:
      return "info";
    case Level::kWarn:
      return "warn";
    case Level::kError:
      return "error";
  }
  return "info";
}

std::string timestamp() {
  const auto now = std::chrono::system_clock::now();
  const auto secs = std::chrono::system_clock::to_time_t(now);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[40];
  const size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  return std::string(buf, n) + "." + std::to_string(1000 + ms).substr(1) + "Z";
}

}  // namespace

void setProgram(std::string_view program) { g_program = std::string(program); }

void init(std::string_view program, Level min_level) {
  g_program = std::string(program);
  g_min_level = min_level;
  logger();
}

void write(Level level, std::string_view msg, const nlohmann::json& fields) {
  if (level < g_min_level) return;
  nlohmann::json line = {{"ts", timestamp()},
                         {"level", levelName(level)},
                         {"program", g_program},
                         {"msg", std::string(msg)}};
  if (fields.is_object()) {
    for (const auto& [key, value] : fields.items()) line[key] = value;
  }
  logger()->info(line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

Level parseLevel(std::string_view text) {
  if (text == "debug") return Level::kDebug;
  if (text == "info") return Level::kInfo;
  if (text == "warn") return Level::kWarn;
  if (text == "error") return Level::kError;
  throw std::invalid_argument("log level must be one of debug, info, warn, error");
}

}  // namespace common::log
