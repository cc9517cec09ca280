#include "core/source_dir.h"

namespace zaya {

const std::string& source_dir() {
  static const std::string dir = ZAYA_SOURCE_DIR;
  return dir;
}

}  // namespace zaya
