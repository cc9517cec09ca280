// Packing documents into fixed-length training samples, with seeded shuffling.
//
// One epoch of a source is its documents in a shuffled order, concatenated into one token stream
// (each document already ends with its EOS when `zaya data prepare` wrote it), and cut into
// samples of S+1 tokens that overlap by one token: sample k is stream[k·S, k·S + S + 1). Inputs
// are the first S tokens and targets the last S, so every stream position is an input exactly once
// and a target exactly once per epoch, and documents run across sample boundaries (Megatron's
// GPTDataset with add_extra_token_to_sequence). The leftover tail of fewer than S+1 tokens is not
// used in that epoch; the next epoch's different document order puts other tokens there.
// The samples of an epoch are then visited in a second shuffled order, so rows of a batch come
// from unrelated places. Both orders are Fisher-Yates driven by the counter-based Philox stream
// keyed by (seed, source, epoch, purpose), so any epoch can be rebuilt on its own.
//
// Deliberately not here: attention masks or position resets at document boundaries (the model
// sees packed documents as one sequence, as in Megatron's default), padding-based packing.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "data/indexed_dataset.h"

namespace zaya {

// A Philox seed for one purpose: (seed, source, epoch, purpose) hashed through philox4x32.
uint64_t derive_seed(uint64_t seed, uint64_t source, uint64_t epoch, uint32_t purpose);
// Uniform in [0, n), unbiased (Lemire's multiply-and-reject on 64 random bits).
class Rng;
uint64_t uniform_below(Rng& rng, uint64_t n);
// A uniformly random permutation of [0, n) (Fisher-Yates) from Rng(seed).
std::vector<int64_t> random_permutation(int64_t n, uint64_t seed);

// The documents [doc_begin, doc_end) of one dataset, packed as described above.
class PackedSource {
 public:
  PackedSource(std::shared_ptr<const IndexedDataset> ds, int64_t doc_begin, int64_t doc_end,
               int64_t seq_len, uint64_t seed, uint64_t source_id, bool shuffle);

  int64_t samples_per_epoch() const { return samples_per_epoch_; }
  int64_t tokens() const { return tokens_; }
  int64_t seq_len() const { return seq_len_; }
  const IndexedDataset& dataset() const { return *ds_; }
  int64_t doc_begin() const { return doc_begin_; }
  int64_t doc_end() const { return doc_end_; }
  // Writes the S+1 tokens of this source's sample number `n` (n = epoch·samples_per_epoch + k).
  void sample(int64_t n, int32_t* out);
  // Where sample k of an epoch starts in that epoch's stream (k·S): exposed for tests.
  struct Epoch {
    std::vector<int64_t> doc_order;     // dataset document ids in stream order
    std::vector<int64_t> starts;        // starts[i] = stream offset of doc_order[i]; size+1 entries
    std::vector<int64_t> sample_order;  // empty when not shuffling
  };
  const Epoch& epoch(int64_t e);

 private:
  std::shared_ptr<const IndexedDataset> ds_;
  int64_t doc_begin_, doc_end_, seq_len_;
  uint64_t seed_, source_id_;
  bool shuffle_;
  int64_t tokens_ = 0, samples_per_epoch_ = 0;
  // At most two epochs cached: a batch can straddle one epoch boundary.
  std::map<int64_t, std::shared_ptr<Epoch>> cache_;
};

}  // namespace zaya
