// Minimal leveled logging to stderr. Results go to stdout; progress and diagnostics to stderr.
#pragma once
#include <fmt/format.h>

#include <cstdio>

namespace zaya {

enum class LogLevel { Debug, Info, Warn, Error };
LogLevel log_level();
void set_log_level(LogLevel l);

template <typename... Args>
void log(LogLevel l, fmt::format_string<Args...> f, Args&&... args) {
  if (l < log_level()) return;
  static const char* tag[] = {"debug", "info", "warn", "error"};
  fmt::print(stderr, "[{}] {}\n", tag[int(l)], fmt::format(f, std::forward<Args>(args)...));
}
#define ZAYA_INFO(...) ::zaya::log(::zaya::LogLevel::Info, __VA_ARGS__)
#define ZAYA_WARN(...) ::zaya::log(::zaya::LogLevel::Warn, __VA_ARGS__)

}  // namespace zaya
