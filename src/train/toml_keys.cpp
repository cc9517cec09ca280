// The TOML key cross-check; see toml_keys.h.
#include "train/toml_keys.h"

#include <set>

#include "core/error.h"

namespace zaya {

namespace {

// Lines on which a key/value statement begins (top level or under a [table] header).
std::set<int64_t> statement_lines(std::string_view s) {
  std::set<int64_t> out;
  const size_t n = s.size();
  size_t i = 0;
  int64_t line = 1;
  // At a quote: skips the string (basic or literal, single- or multi-line), counting newlines.
  const auto skip_string = [&] {
    const char q = s[i];
    if (s.substr(i, 3) == std::string(3, q)) {
      i += 3;
      while (i < n) {
        if (q == '"' && s[i] == '\\') {
          if (i + 1 < n && s[i + 1] == '\n') line++;
          i += 2;
        } else if (s.substr(i, 3) == std::string(3, q)) {
          i += 3;
          for (int extra = 0; extra < 2 && i < n && s[i] == q; extra++) i++;  // """a"""" is a"
          return;
        } else {
          line += s[i] == '\n';
          i++;
        }
      }
      return;
    }
    for (i++; i < n && s[i] != '\n'; i++) {
      if (q == '"' && s[i] == '\\' && i + 1 < n && s[i + 1] != '\n')
        i++;
      else if (s[i] == q) {
        i++;
        return;
      }
    }
  };
  const auto skip_comment = [&] {
    while (i < n && s[i] != '\n') i++;
  };
  while (i < n) {
    const char c = s[i];
    if (c == ' ' || c == '\t' || c == '\r') {
      i++;
    } else if (c == '\n') {
      line++;
      i++;
    } else if (c == '#') {
      skip_comment();
    } else if (c == '[') {  // a [table] or [[array]] header: to the end of the line
      while (i < n && s[i] != '\n' && s[i] != '#') {
        if (s[i] == '"' || s[i] == '\'')
          skip_string();
        else
          i++;
      }
    } else {
      out.insert(line);
      while (i < n && s[i] != '=' && s[i] != '\n') {  // the key, dotted and quoted parts included
        if (s[i] == '"' || s[i] == '\'')
          skip_string();
        else
          i++;
      }
      if (i < n && s[i] == '=') i++;
      int depth = 0;  // the value: up to the end of the line outside brackets, braces and strings
      while (i < n) {
        const char v = s[i];
        if (v == '"' || v == '\'') {
          skip_string();
          continue;
        }
        if (v == '#') {
          skip_comment();
          continue;
        }
        if (v == '\n') {
          if (depth <= 0) break;
          line++;
        }
        depth += (v == '[' || v == '{') - (v == ']' || v == '}');
        i++;
      }
    }
  }
  return out;
}

bool is_header_array(const toml::array& a) {
  return !a.empty() && a.is_array_of_tables() && !a.front().as_table()->is_inline();
}

// Lines of the values in `t`: one per key/value statement (tables from headers and dotted keys are
// walked into; inline tables and arrays are values).
void value_lines(const toml::table& t, std::set<int64_t>* out) {
  for (auto&& [k, v] : t) {
    if (auto* sub = v.as_table(); sub && !sub->is_inline()) {
      value_lines(*sub, out);
    } else if (auto* arr = v.as_array(); arr && is_header_array(*arr)) {
      for (auto& e : *arr) value_lines(*e.as_table(), out);
    } else {
      out->insert(int64_t(v.source().begin.line));
    }
  }
}

}  // namespace

void check_toml_keys_read(std::string_view text, const toml::table& root,
                          const std::string& where) {
  const std::set<int64_t> in_file = statement_lines(text);
  std::set<int64_t> read;
  value_lines(root, &read);
  const std::string why = fmt::format(
      "the TOML library (toml++ {}.{}.{}) misread the file, as it does for some multi-line "
      "strings; refusing a config that would run with keys missing or wrong (write the string on "
      "one line)",
      TOML_LIB_MAJOR, TOML_LIB_MINOR, TOML_LIB_PATCH);
  for (int64_t l : in_file)
    if (!read.count(l)) fail("{}:{}: the key on this line was not read: {}", where, l, why);
  for (int64_t l : read)
    if (!in_file.count(l))
      fail("{}:{}: a key was read from this line, which holds none: {}", where, l, why);
}

}  // namespace zaya
