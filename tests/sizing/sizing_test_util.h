// Shared by the sizing tests.
#pragma once
#include <functional>
#include <string>

#include "core/error.h"

namespace zaya::sizing::test {

// The message of the zaya::Error that f throws, or "" when it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace zaya::sizing::test
