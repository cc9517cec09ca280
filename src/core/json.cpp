// JSON parsing with zaya's limits and errors; see json.h.
#include "core/json.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace zaya {

using json = nlohmann::json;

void check_json_depth(size_t depth, const std::string& where, const char* problem) {
  if (depth >= size_t(kMaxJsonDepth))
    fail("{}: {}: arrays and objects nest deeper than {} levels", where, problem, kMaxJsonDepth);
}

json parse_json(std::string_view text, const std::string& where,
                const json::parser_callback_t& callback, const char* problem) {
  // The parser itself is iterative; the callback refuses depth before the tree is ever walked
  // recursively.
  const json::parser_callback_t limit = [&](int depth, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::object_start || ev == json::parse_event_t::array_start)
      check_json_depth(size_t(depth), where, problem);
    return callback ? callback(depth, ev, parsed) : true;
  };
  try {
    return json::parse(text.begin(), text.end(), limit);
  } catch (const json::exception& e) {
    fail("{}: {}: {}", where, problem, e.what());
  }
}

json read_json_file(const std::string& path, const char* problem) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open {}", path);
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) fail("{}: read error", path);
  return parse_json(buf.view(), path, nullptr, problem);
}

std::string json_show(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

int64_t json_int64(const json& v, const std::string& where) {
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() <= uint64_t(INT64_MAX)) return int64_t(v.get<uint64_t>());
  } else if (v.is_number_integer()) {
    return v.get<int64_t>();
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    // [-2^63, 2^63) is exactly the range of doubles that convert to int64 without overflow.
    if (std::isfinite(d) && d == std::trunc(d) && d >= -9223372036854775808.0 &&
        d < 9223372036854775808.0)
      return int64_t(d);
  }
  fail("{}: expected an integer that fits 64 bits, found {}", where, json_show(v));
}

}  // namespace zaya
