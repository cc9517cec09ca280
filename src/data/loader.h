// The training data loader: a weighted blend of packed, shuffled indexed datasets, delivered as
// batches of int32 token rows [B, S+1] (inputs are row[0:S], targets row[1:S+1]), with a cursor
// small enough to store in a checkpoint's JSON.
//
// Determinism: global sample g is assigned to a source by the Megatron blending rule (blend.h)
// and to that source's next sample number; a source's sample number n is epoch n / N and position
// n % N of its packed, shuffled epochs (packing.h). The whole state is therefore the seed and the
// per-source sample counts, and a loader restored from a cursor yields exactly the batches the
// original would have. Data parallelism: every rank walks the same global sequence and fills only
// its slice of rows [rank·B/world, (rank+1)·B/world) of each global batch.
//
// Held-out split: with heldout_fraction f > 0, the last round(f·D) documents of each source (at
// least one) are held out; Split::Train reads the others, Split::Heldout only those. A separate
// evaluation dataset is just another loader with Split::All.
//
// Deliberately not here: background prefetch threads (a batch of a few hundred rows is a few
// memcpys from the page cache), and per-rank file sharding (every rank maps the same files).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "data/blend.h"
#include "data/packing.h"

namespace zaya {

enum class Split { All, Train, Heldout };
Split parse_split(const std::string& s);  // "all", "train", "heldout"
const char* split_name(Split s);

struct DataSource {
  std::string prefix;  // <prefix>.idx / <prefix>.bin
  double weight = 1.0;
};

struct DataLoaderOptions {
  std::vector<DataSource> sources;
  int64_t seq_len = 0;     // S: rows are S+1 tokens
  int64_t batch_size = 0;  // global rows per batch, across all data-parallel ranks
  uint64_t seed = 1234;
  bool shuffle = true;
  Split split = Split::All;
  double heldout_fraction = 0.0;
  int rank = 0, world = 1;
  int64_t vocab_size = 0;  // > 0: every source's token ids are checked against it at open
};

// The loader's whole state. samples = Σ source_samples (global samples consumed).
struct DataCursor {
  uint64_t seed = 0;
  int64_t seq_len = 0;
  int64_t samples = 0;
  std::vector<std::string> prefixes;
  std::vector<int64_t> source_samples;
  std::vector<int64_t> source_samples_per_epoch;  // to report epoch/position; checked on restore

  nlohmann::json to_json() const;
  // Errors name the missing or mistyped field.
  static DataCursor from_json(const nlohmann::json& j);
};

class DataLoader {
 public:
  explicit DataLoader(DataLoaderOptions opts);

  int64_t seq_len() const { return opts_.seq_len; }
  int64_t row_len() const { return opts_.seq_len + 1; }
  int64_t global_batch_size() const { return opts_.batch_size; }
  int64_t local_batch_size() const { return opts_.batch_size / opts_.world; }
  // Changes the global batch size from the next batch on (batch-size ramp-up); the cursor counts
  // samples, so it stays valid.
  void set_batch_size(int64_t global_batch);

  // The next batch: local_batch_size() rows of row_len() tokens, row-major.
  void next(int32_t* out);
  std::vector<int32_t> next();
  // The next batch as a CPU int32 tensor [local_batch_size, seq_len+1].
  Tensor next_tensor();

  // This rank's rows of the last batch as global sample ids: (source, that source's sample
  // number), the same ids whatever the world size (for checking that resumes neither skip nor
  // repeat samples).
  const std::vector<std::pair<int, int64_t>>& last_samples() const { return last_samples_; }

  DataCursor cursor() const;
  // Continues from a cursor made by a loader with the same sources, seq_len, seed and split. An
  // Error names the field that disagrees.
  void restore(const DataCursor& c);
  void reset();  // back to the first batch

  int num_sources() const { return int(sources_.size()); }
  PackedSource& source(int i) { return *sources_.at(size_t(i)); }
  const std::vector<double>& weights() const { return blender_.weights(); }
  // Epochs completed by source i, fractional.
  double epochs(int i) const;

 private:
  DataLoaderOptions opts_;
  std::vector<std::unique_ptr<PackedSource>> sources_;
  Blender blender_;
  std::vector<std::pair<int, int64_t>> last_samples_;
};

}  // namespace zaya
