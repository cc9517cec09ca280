// The source tree zaya was built from: where the built-in configs (configs/) and the offline data
// fetched by scripts/setup.sh (.cache/) are found when no path is given. One translation unit holds
// the path, so the other objects do not depend on where the tree is checked out.
#pragma once
#include <string>

namespace zaya {

const std::string& source_dir();

}  // namespace zaya
