// Element types and the scalar conversions between them. bf16 and fp16 are stored as raw 16-bit
// patterns; conversion to them rounds to nearest even, as the GPUs do.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace zaya {

enum class DType : uint8_t { F32, F16, BF16, F64, I32, U32, I64, U8, I8, I16, U16, BOOL };

size_t dtype_size(DType t);
// safetensors spelling: "F32", "BF16", ...
std::string_view dtype_name(DType t);
// Parses a safetensors dtype string; returns false when it is not one zaya knows.
bool dtype_from_name(std::string_view s, DType* out);
bool dtype_is_float(DType t);

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

}  // namespace zaya
