// Minimal leveled logging to stderr. PINSTAGE_LOG=debug|info|warn|error|off sets the
// threshold (default warn).
#pragma once

#include <string>

#include "pinstage/export.h"

namespace pinstage {

enum class LogLevel { debug = 0, info = 1, warn = 2, error = 3, off = 4 };

// The threshold: messages below it are dropped (PINSTAGE_LOG, default warn).
PINSTAGE_API LogLevel log_level();
PINSTAGE_API void set_log_level(LogLevel level);
// Writes "pinstage [level] message" to stderr when level passes the threshold.
PINSTAGE_API void log(LogLevel level, const std::string& message);

}  // namespace pinstage
