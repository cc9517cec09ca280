// Document packing and seeded shuffles (see packing.h). Memory per cached epoch: 16 bytes per
// document and 8 bytes per sample, which is small next to the token data for sequence lengths
// in the thousands.
#include "data/packing.h"

#include <algorithm>

#include "core/error.h"
#include "core/rng.h"

namespace zaya {

uint64_t derive_seed(uint64_t seed, uint64_t source, uint64_t epoch, uint32_t purpose) {
  auto r = philox4x32({uint32_t(source), uint32_t(epoch), uint32_t(epoch >> 32), purpose},
                      {uint32_t(seed), uint32_t(seed >> 32)});
  return (uint64_t(r[0]) << 32 | r[1]) ^ (uint64_t(r[2]) << 32 | r[3]) ^ (source >> 32);
}

uint64_t uniform_below(Rng& rng, uint64_t n) {
  ZAYA_ASSERT(n > 0);
  auto draw = [&] { return uint64_t(rng.next_u32()) << 32 | rng.next_u32(); };
  unsigned __int128 m = (unsigned __int128)draw() * n;
  uint64_t low = uint64_t(m);
  if (low < n) {
    const uint64_t threshold = (0 - n) % n;
    while (low < threshold) {
      m = (unsigned __int128)draw() * n;
      low = uint64_t(m);
    }
  }
  return uint64_t(m >> 64);
}

std::vector<int64_t> random_permutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> p(size_t(std::max<int64_t>(n, 0)));
  for (int64_t i = 0; i < n; i++) p[i] = i;
  Rng rng(seed);
  for (int64_t i = n - 1; i > 0; i--) std::swap(p[i], p[uniform_below(rng, uint64_t(i) + 1)]);
  return p;
}

namespace {
constexpr uint32_t kDocOrder = 1, kSampleOrder = 2;
}

PackedSource::PackedSource(std::shared_ptr<const IndexedDataset> ds, int64_t doc_begin,
                           int64_t doc_end, int64_t seq_len, uint64_t seed, uint64_t source_id,
                           bool shuffle)
    : ds_(std::move(ds)),
      doc_begin_(doc_begin),
      doc_end_(doc_end),
      seq_len_(seq_len),
      seed_(seed),
      source_id_(source_id),
      shuffle_(shuffle) {
  ZAYA_CHECK(seq_len_ >= 1, "seq_len must be >= 1, got {}", seq_len_);
  ZAYA_CHECK(0 <= doc_begin_ && doc_begin_ <= doc_end_ && doc_end_ <= ds_->num_documents(),
             "{}: document range [{}, {}) is outside [0, {})", ds_->prefix(), doc_begin_, doc_end_,
             ds_->num_documents());
  tokens_ = ds_->document_begin(doc_end_) - ds_->document_begin(doc_begin_);
  ZAYA_CHECK(tokens_ >= seq_len_ + 1,
             "{}: documents [{}, {}) hold {} tokens, fewer than one sample of seq_len+1 = {}",
             ds_->prefix(), doc_begin_, doc_end_, tokens_, seq_len_ + 1);
  samples_per_epoch_ = (tokens_ - 1) / seq_len_;
}

const PackedSource::Epoch& PackedSource::epoch(int64_t e) {
  auto it = cache_.find(e);
  if (it != cache_.end()) return *it->second;
  auto ep = std::make_shared<Epoch>();
  const int64_t nd = doc_end_ - doc_begin_;
  if (shuffle_) {
    ep->doc_order = random_permutation(nd, derive_seed(seed_, source_id_, uint64_t(e), kDocOrder));
    for (auto& d : ep->doc_order) d += doc_begin_;
    ep->sample_order = random_permutation(
        samples_per_epoch_, derive_seed(seed_, source_id_, uint64_t(e), kSampleOrder));
  } else {
    ep->doc_order.resize(size_t(nd));
    for (int64_t i = 0; i < nd; i++) ep->doc_order[i] = doc_begin_ + i;
  }
  ep->starts.resize(size_t(nd) + 1);
  int64_t s = 0;
  for (int64_t i = 0; i < nd; i++) {
    ep->starts[i] = s;
    s += ds_->document_length(ep->doc_order[i]);
  }
  ep->starts[nd] = s;
  if (cache_.size() >= 2) cache_.erase(cache_.begin());
  return *cache_.emplace(e, std::move(ep)).first->second;
}

void PackedSource::sample(int64_t n, int32_t* out) {
  ZAYA_ASSERT(n >= 0);
  const int64_t e = n / samples_per_epoch_, j = n % samples_per_epoch_;
  const Epoch& ep = epoch(e);
  const int64_t k = ep.sample_order.empty() ? j : ep.sample_order[j];
  int64_t pos = k * seq_len_, need = seq_len_ + 1;
  // The document holding stream offset pos: last i with starts[i] <= pos (skipping empty ones).
  size_t i =
      size_t(std::upper_bound(ep.starts.begin(), ep.starts.end(), pos) - ep.starts.begin()) - 1;
  while (need > 0) {
    ZAYA_ASSERT(i + 1 < ep.starts.size());
    const int64_t d = ep.doc_order[i];
    const int64_t off = pos - ep.starts[i];
    const int64_t take = std::min(need, ep.starts[i + 1] - pos);
    if (take > 0) {
      ds_->read(ds_->document_begin(d) + off, take, out);
      out += take;
      need -= take;
      pos += take;
    }
    i++;
  }
}

}  // namespace zaya
