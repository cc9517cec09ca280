// libFuzzer target: a model's config.json (ZayaConfig::load, then what the program derives from
// a loaded config: parameter counts and the JSON it writes back).
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "fuzz_util.h"
#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = zaya::fuzz::write_input("config.json", data, size);
  try {
    zaya::ZayaConfig c = zaya::ZayaConfig::load(path);
    (void)c.params_total(true);
    (void)c.params_active(true);
    (void)c.rotary_dim();
    for (int64_t l = 0; l < c.num_hidden_layers && l < 64; l++) (void)c.rope_for_layer(l);
    (void)zaya::ZayaConfig::from_json(c.to_json(), path);
  } catch (const zaya::Error&) {
  }
  return 0;
}
