// A cross-check of the TOML library: every key/value line of the file must have been read, and
// nothing read may come from a line that holds no key. toml++ 3.3.0 (Debian 12's) mishandles some
// multi-line strings and can return a table with keys missing (a run config that silently trains
// with defaults); this refuses such a parse with the line named. The scan is deliberately small:
// it only finds where statements begin (skipping strings, comments, arrays and inline tables) and
// relies on the library for everything else.
#pragma once
#include <string>
#include <string_view>

#if __has_include(<toml++/toml.hpp>)
#include <toml++/toml.hpp>
#else
#include <toml++/toml.h>
#endif

namespace zaya {

// Throws zaya::Error "<where>:<line>: ..." when `root` (parsed from `text`) disagrees with the
// key/value lines of `text`.
void check_toml_keys_read(std::string_view text, const toml::table& root, const std::string& where);

}  // namespace zaya
