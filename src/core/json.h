// JSON input with one set of limits for every file zaya reads (config.json, safetensors headers,
// shard indexes, manifests, trainer state, tokenizer files): a depth limit, so a deeply nested
// document is refused before any recursive code (copies, dumps, comparisons) walks it, and one
// error type, so syntax errors and numbers out of range ("2e639") arrive as zaya::Error naming the
// file instead of as nlohmann exceptions. Also the typed accessors whose checks come before any
// conversion (a float like 1e300 where an integer belongs is refused, not converted: that would be
// undefined behaviour).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace zaya {

// Containers nested deeper than this are refused. Real files nest a handful of levels.
constexpr int kMaxJsonDepth = 100;

// Parses `text`; any problem is a zaya::Error "<where>: <problem>: ..." (`problem` keeps each
// caller's wording, e.g. "malformed JSON"). `callback`, when set, sees every event as nlohmann's
// parser callback does (and may discard values by returning false).
nlohmann::json parse_json(std::string_view text, const std::string& where,
                          const nlohmann::json::parser_callback_t& callback = nullptr,
                          const char* problem = "not valid JSON");
// Reads and parses a whole file; an Error names it when it cannot be read.
nlohmann::json read_json_file(const std::string& path, const char* problem = "not valid JSON");
// For SAX handlers: call when a container opens at `depth` (0 for the top level).
void check_json_depth(size_t depth, const std::string& where,
                      const char* problem = "not valid JSON");

// An integer (or a float with an integral value) that fits int64, else an Error
// "<where>: expected an integer, found ...".
int64_t json_int64(const nlohmann::json& v, const std::string& where);
// A short rendering of a value for error messages (at most about 80 characters).
std::string json_show(const nlohmann::json& v);

}  // namespace zaya
