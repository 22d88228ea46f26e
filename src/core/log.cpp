#include "pinstage/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace pinstage {
namespace {

LogLevel level_from_env() {
  const char* env = std::getenv("PINSTAGE_LOG");
  if (env == nullptr) return LogLevel::warn;
  static constexpr const char* kNames[] = {"debug", "info", "warn", "error", "off"};
  for (int i = 0; i < 5; ++i)
    if (std::strcmp(env, kNames[i]) == 0) return static_cast<LogLevel>(i);
  return LogLevel::warn;
}

std::atomic<LogLevel>& threshold() {
  static std::atomic<LogLevel> level{level_from_env()};
  return level;
}

}  // namespace

LogLevel log_level() { return threshold().load(std::memory_order_relaxed); }

void set_log_level(LogLevel level) { threshold().store(level, std::memory_order_relaxed); }

void log(LogLevel level, const std::string& message) {
  if (level < log_level() || level == LogLevel::off) return;
  static constexpr const char* kNames[] = {"debug", "info", "warn", "error"};
  // One fprintf per message keeps lines whole when threads log at once.
  std::fprintf(stderr, "pinstage [%s] %s\n", kNames[static_cast<int>(level)], message.c_str());
}

}  // namespace pinstage
