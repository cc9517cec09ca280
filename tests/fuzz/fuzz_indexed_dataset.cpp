// libFuzzer target: a Megatron .idx/.bin pair. The input is a 4-byte little-endian length L, then
// L bytes of .idx, then the .bin; every sequence and document is read back after open.
#include <cstring>

#include "core/error.h"
#include "data/indexed_dataset.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  uint32_t n = 0;
  std::memcpy(&n, data, 4);
  const size_t idx_len = std::min<size_t>(n, size - 4);
  zaya::fuzz::write_input("ds.idx", data + 4, idx_len);
  zaya::fuzz::write_input("ds.bin", data + 4 + idx_len, size - 4 - idx_len);
  try {
    zaya::IndexedDataset ds(zaya::fuzz::work_dir() + "/ds");
    for (int64_t i = 0; i < ds.num_sequences(); i++) (void)ds.sequence(i);
    for (int64_t d = 0; d < ds.num_documents(); d++) (void)ds.document(d);
    (void)ds.max_token_id();
    ds.check_vocab(1 << 16);
  } catch (const zaya::Error&) {
  }
  return 0;
}
