#include "core/dtype.h"

#include <cmath>

namespace zaya {

namespace {
struct Info {
  DType t;
  const char* name;
  size_t size;
};
constexpr Info kInfo[] = {
    {DType::F32, "F32", 4}, {DType::F16, "F16", 2}, {DType::BF16, "BF16", 2},
    {DType::F64, "F64", 8}, {DType::I32, "I32", 4}, {DType::U32, "U32", 4},
    {DType::I64, "I64", 8}, {DType::U8, "U8", 1},   {DType::I8, "I8", 1},
    {DType::I16, "I16", 2}, {DType::U16, "U16", 2}, {DType::BOOL, "BOOL", 1},
};
}  // namespace

size_t dtype_size(DType t) {
  return kInfo[int(t)].size;
}
std::string_view dtype_name(DType t) {
  return kInfo[int(t)].name;
}
bool dtype_from_name(std::string_view s, DType* out) {
  for (const auto& i : kInfo)
    if (s == i.name) {
      *out = i.t;
      return true;
    }
  return false;
}
bool dtype_is_float(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::F64;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float v;
  if (exp == 0)
    v = std::ldexp(float(man), -24);
  else if (exp == 31)
    v = man ? NAN : INFINITY;
  else
    v = std::ldexp(float(man | 0x400), int(exp) - 25);
  return sign ? -v : v;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000;
  uint32_t a = u & 0x7fffffff;
  if (a > 0x7f800000) return uint16_t(sign | 0x7e00);
  if (a >= 0x477ff000) return uint16_t(sign | 0x7c00);  // overflow (incl. inf) after rounding
  if (a < 0x38800000) {                                 // subnormal or zero in half
    float af;
    std::memcpy(&af, &a, 4);
    // scale so the half subnormal unit (2^-24) becomes 1, round to nearest even
    float s = af * 16777216.0f;
    uint32_t m = uint32_t(std::nearbyint(s));
    return uint16_t(sign | m);
  }
  uint32_t e = ((a >> 23) - 112) << 10;
  uint32_t m = (a >> 13) & 0x3ff;
  uint32_t rest = a & 0x1fff;
  uint32_t h = e | m;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
  return uint16_t(sign | h);
}

}  // namespace zaya
