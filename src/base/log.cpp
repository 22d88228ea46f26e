#include "pinstage/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "pinstage/settings.h"

namespace pinstage {
namespace {

// A bad PINSTAGE_LOG is reported by check_settings() (Worker::init, the CLI, Python);
// logging itself must never throw, so here it keeps the default and says so once.
LogLevel level_from_env() {
  static constexpr const char* kNames[] = {"debug", "info", "warn", "error", "off"};
  try {
    const auto name = setting_choice(Setting::log);
    if (!name) return LogLevel::warn;
    for (int i = 0; i < 5; ++i)
      if (*name == kNames[i]) return static_cast<LogLevel>(i);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pinstage [error] %s\n", e.what());
  }
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
