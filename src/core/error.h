// Errors with context. Every failure the user can cause (bad file, bad field, bad value) is
// reported by throwing zaya::Error with a message that names the thing and what was expected; the
// CLI prints it and exits non-zero. ZAYA_CHECK is for conditions that depend on input; ZAYA_ASSERT
// for internal invariants (it adds file:line, since such a failure is a bug in zaya itself).
#pragma once
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace zaya {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// A configuration (run config file, its overrides) that cannot be used: the CLI exits with status 2
// (dist/ft_protocol.h's kExitBadConfig) instead of 1, so a supervisor does not relaunch it.
class ConfigError : public Error {
 public:
  using Error::Error;
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace zaya

#define ZAYA_CHECK(cond, ...)               \
  do {                                      \
    if (!(cond)) ::zaya::fail(__VA_ARGS__); \
  } while (0)

#define ZAYA_ASSERT(cond)                                                                \
  do {                                                                                   \
    if (!(cond))                                                                         \
      throw ::zaya::Error(                                                               \
          fmt::format("internal error: {} failed at {}:{}", #cond, __FILE__, __LINE__)); \
  } while (0)
