// Loading of the `transformers` parity fixtures (tests/fixtures/parity/<cfg>/, written by
// tools/make_parity_fixtures.py): the model directory itself loads with ZayaModel::load; this
// header reads what the reference produced from it, expected.safetensors (input_ids [B, S], logits
// [B, S, V]) and expected.json (loss, prompt, greedy continuation, skip fraction). Shared by the
// CPU parity test (tests/model/test_parity.cpp) and the GPU ones (tests/gpu/test_cuda_model.cpp,
// test_cuda_infer.cpp). Header-only, CPU-only; tolerances stay with each test.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/safetensors.h"

namespace zaya::test_util {

// Directory of the parity fixture `name` ("cfg_a", "cfg_b") in the source tree.
inline std::string parity_fixture(const std::string& name) {
  return std::string(ZAYA_SOURCE_DIR) + "/tests/fixtures/parity/" + name;
}

// What the reference implementation produced for a fixture.
struct ParityExpected {
  std::vector<int32_t> ids;  // [B·S] input ids, row-major
  int64_t B = 0, S = 0;
  Tensor logits;        // [B, S, V] fp32
  nlohmann::json meta;  // expected.json
};

inline ParityExpected load_parity_expected(const std::string& dir) {
  ParityExpected e;
  auto f = SafetensorsFile::open(dir + "/expected.safetensors");
  Tensor ids = f->get("input_ids");
  e.B = ids.size(0);
  e.S = ids.size(1);
  e.ids.assign(ids.data<int32_t>(), ids.data<int32_t>() + ids.numel());
  e.logits = f->get("logits").to(DType::F32);
  std::ifstream in(dir + "/expected.json");
  e.meta = nlohmann::json::parse(in);
  return e;
}

// The fixture's generation prompt (expected.json "prompt") without reading the logits.
inline std::vector<int32_t> parity_prompt(const std::string& dir) {
  std::ifstream in(dir + "/expected.json");
  return nlohmann::json::parse(in)["prompt"].get<std::vector<int32_t>>();
}

// max |a_i| over n values, in double (the logit scale the tolerances are relative to).
inline double max_abs(const float* a, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; i++) m = std::max(m, double(std::fabs(a[i])));
  return m;
}

}  // namespace zaya::test_util
