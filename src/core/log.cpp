#include "core/log.h"

#include <cstdlib>
#include <cstring>

namespace zaya {

static LogLevel g_level = [] {
  const char* s = std::getenv("ZAYA_LOG");
  if (s && !std::strcmp(s, "debug")) return LogLevel::Debug;
  if (s && !std::strcmp(s, "warn")) return LogLevel::Warn;
  if (s && !std::strcmp(s, "error")) return LogLevel::Error;
  return LogLevel::Info;
}();

LogLevel log_level() {
  return g_level;
}
void set_log_level(LogLevel l) {
  g_level = l;
}

}  // namespace zaya
