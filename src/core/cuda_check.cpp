// The throwing half of the CHECK macros in cuda_check.h, kept out of the header so CUDA sources do
// not need error.h (and fmt). Plain C++: built in every configuration.
#include "core/cuda_check.h"

#include "core/error.h"

namespace zaya::detail {

void platform_fail(const char* lib, const char* call, const char* file, int line,
                   const std::string& what) {
  throw ::zaya::Error(std::string(lib) + " error: " + call + " failed at " + file + ":" +
                      std::to_string(line) + ": " + what);
}

}  // namespace zaya::detail
