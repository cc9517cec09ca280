// Checked integer arithmetic for sizes and counts that come from files: an overflow is reported
// as zaya::Error naming what was computed, instead of wrapping (undefined behaviour for signed
// integers) before the check that should refuse the value.
#pragma once
#include <cstdint>
#include <string_view>

#include "core/error.h"

namespace zaya {

// a*b and a+b, or an Error "<what>: <a> × <b> overflows 64-bit integers".
inline int64_t checked_mul(int64_t a, int64_t b, std::string_view what) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) fail("{}: {} × {} overflows 64-bit integers", what, a, b);
  return r;
}
inline int64_t checked_add(int64_t a, int64_t b, std::string_view what) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) fail("{}: {} + {} overflows 64-bit integers", what, a, b);
  return r;
}

// An int64 whose + - * throw zaya::Error on overflow, for formulas over sizes read from files
// (parameter counts, byte counts). The message names only the operation; callers that know the
// file catch and rethrow with it.
struct CheckedI64 {
  int64_t v = 0;
  constexpr CheckedI64() = default;
  constexpr CheckedI64(int64_t x)
      : v(x) {}  // NOLINT: implicit on purpose, like the int64_t it wraps
  friend CheckedI64 operator*(CheckedI64 a, CheckedI64 b) { return checked_mul(a.v, b.v, "size"); }
  friend CheckedI64 operator+(CheckedI64 a, CheckedI64 b) { return checked_add(a.v, b.v, "size"); }
  friend CheckedI64 operator-(CheckedI64 a, CheckedI64 b) {
    int64_t r;
    if (__builtin_sub_overflow(a.v, b.v, &r))
      fail("size: {} - {} overflows 64-bit integers", a.v, b.v);
    return r;
  }
  CheckedI64& operator+=(CheckedI64 b) { return *this = *this + b; }
  CheckedI64& operator-=(CheckedI64 b) { return *this = *this - b; }
};

}  // namespace zaya
