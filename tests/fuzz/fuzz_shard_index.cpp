// libFuzzer target: model.safetensors.index.json (TensorStore::open of a directory whose two
// valid shards hold tensors "a" and "b"; the input is the index).
#include "core/error.h"
#include "core/tensor.h"
#include "fuzz_util.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  using zaya::Tensor;
  const std::string& d = zaya::fuzz::work_dir();
  zaya::save_safetensors(d + "/model-00001-of-00002.safetensors",
                         {{"a", Tensor::zeros({2, 3}, zaya::DType::F32)}});
  zaya::save_safetensors(d + "/model-00002-of-00002.safetensors",
                         {{"b", Tensor::zeros({4}, zaya::DType::BF16)}});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = zaya::fuzz::write_input("model.safetensors.index.json", data, size);
  try {
    auto s = zaya::TensorStore::open(zaya::fuzz::work_dir());
    for (const auto& n : s->names()) {
      (void)s->get(n);
      (void)s->file_of(n);
    }
    (void)s->metadata();
  } catch (const zaya::Error&) {
  }
  return 0;
}
