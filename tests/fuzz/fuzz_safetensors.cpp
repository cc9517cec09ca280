// libFuzzer target: one safetensors file (header validation, then every tensor read back).
#include "core/error.h"
#include "fuzz_util.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = zaya::fuzz::write_input("model.safetensors", data, size);
  try {
    auto f = zaya::SafetensorsFile::open(path);
    volatile uint8_t sink = 0;
    for (const auto& ti : f->tensors()) {
      zaya::Tensor t = f->get(ti.name);
      const auto* p = static_cast<const uint8_t*>(t.raw());
      if (t.nbytes() > 0) sink = sink + p[0] + p[t.nbytes() - 1];
    }
    for (const auto& [k, v] : f->metadata()) sink = sink + uint8_t(k.size() + v.size());
  } catch (const zaya::Error&) {
  }
  return 0;
}
