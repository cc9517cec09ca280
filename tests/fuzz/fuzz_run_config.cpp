// libFuzzer target: a TOML run config (parse, key cross-check, strict reading, validation), then
// what training derives from it: the rules applied to parameter names, phases, the TOML written
// back.
#include "core/error.h"
#include "fuzz_util.h"
#include "optim/param_rules.h"
#include "train/run_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    zaya::RunConfig c = zaya::RunConfig::from_toml(text, "fuzz.toml");
    for (const char* name : {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                             "model.layers.1.mlp.experts.down_proj"})
      (void)zaya::assign_param(name, {4, 4}, c.optim.rules, c.optim.weight_decay);
    for (int64_t step : {int64_t(0), int64_t(1), int64_t(1000), int64_t(1) << 40})
      (void)c.phase_at(step, step * 4096, 1, 10000.0);
    (void)zaya::RunConfig::from_toml(c.to_toml(), "fuzz.toml (written back)");
  } catch (const zaya::Error&) {
  }
  return 0;
}
