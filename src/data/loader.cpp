// DataLoader and its JSON cursor (see loader.h).
#include "data/loader.h"

#include <cmath>

#include "core/error.h"

namespace zaya {

Split parse_split(const std::string& s) {
  if (s == "all") return Split::All;
  if (s == "train") return Split::Train;
  if (s == "heldout") return Split::Heldout;
  fail("unknown split \"{}\" (expected all, train or heldout)", s);
}

const char* split_name(Split s) {
  return s == Split::All ? "all" : s == Split::Train ? "train" : "heldout";
}

namespace {

std::vector<double> source_weights(const std::vector<DataSource>& s) {
  ZAYA_CHECK(!s.empty(), "data loader: no data sources given");
  std::vector<double> w;
  for (const auto& x : s) w.push_back(x.weight);
  return w;
}

}  // namespace

DataLoader::DataLoader(DataLoaderOptions opts)
    : opts_(std::move(opts)), blender_(source_weights(opts_.sources)) {
  ZAYA_CHECK(opts_.seq_len >= 1, "data loader: seq_len must be >= 1, got {}", opts_.seq_len);
  ZAYA_CHECK(opts_.world >= 1 && opts_.rank >= 0 && opts_.rank < opts_.world,
             "data loader: rank {} is outside world size {}", opts_.rank, opts_.world);
  set_batch_size(opts_.batch_size);
  ZAYA_CHECK(opts_.heldout_fraction >= 0 && opts_.heldout_fraction < 1,
             "data loader: heldout_fraction {} must be in [0, 1)", opts_.heldout_fraction);
  ZAYA_CHECK(opts_.split == Split::All || opts_.heldout_fraction > 0,
             "data loader: split {} needs heldout_fraction > 0", split_name(opts_.split));
  std::map<std::string, std::shared_ptr<const IndexedDataset>> open;
  for (size_t i = 0; i < opts_.sources.size(); i++) {
    const auto& src = opts_.sources[i];
    auto& ds = open[src.prefix];
    if (!ds) {
      ds = std::make_shared<const IndexedDataset>(src.prefix);
      if (opts_.vocab_size > 0) ds->check_vocab(opts_.vocab_size);
    }
    const int64_t nd = ds->num_documents();
    int64_t b = 0, e = nd;
    if (opts_.split != Split::All) {
      const int64_t held = std::max<int64_t>(1, std::llround(opts_.heldout_fraction * double(nd)));
      ZAYA_CHECK(held < nd,
                 "{}: holding out {} of {} documents (heldout_fraction {}) leaves none to train on",
                 src.prefix, held, nd, opts_.heldout_fraction);
      if (opts_.split == Split::Train)
        e = nd - held;
      else
        b = nd - held;
    }
    sources_.push_back(std::make_unique<PackedSource>(ds, b, e, opts_.seq_len, opts_.seed,
                                                      uint64_t(i), opts_.shuffle));
  }
}

void DataLoader::set_batch_size(int64_t b) {
  ZAYA_CHECK(b >= 1 && b % opts_.world == 0,
             "data loader: global batch size {} must be a positive multiple of the world size {}",
             b, opts_.world);
  opts_.batch_size = b;
}

void DataLoader::next(int32_t* out) {
  const int64_t lb = local_batch_size(), first = opts_.rank * lb, row = row_len();
  last_samples_.clear();
  for (int64_t r = 0; r < opts_.batch_size; r++) {
    const int s = blender_.next();
    const int64_t n = blender_.counts()[size_t(s)] - 1;
    // Other ranks' rows only advance the blend; their tokens are never read here.
    if (r >= first && r < first + lb) {
      sources_[size_t(s)]->sample(n, out + (r - first) * row);
      last_samples_.emplace_back(s, n);
    }
  }
}

std::vector<int32_t> DataLoader::next() {
  std::vector<int32_t> v(size_t(local_batch_size() * row_len()));
  next(v.data());
  return v;
}

Tensor DataLoader::next_tensor() {
  Tensor t = Tensor::empty({local_batch_size(), row_len()}, DType::I32);
  next(t.data<int32_t>());
  return t;
}

DataCursor DataLoader::cursor() const {
  DataCursor c;
  c.seed = opts_.seed;
  c.seq_len = opts_.seq_len;
  c.samples = blender_.total();
  c.source_samples = blender_.counts();
  for (const auto& s : sources_) {
    c.prefixes.push_back(s->dataset().prefix());
    c.source_samples_per_epoch.push_back(s->samples_per_epoch());
  }
  return c;
}

void DataLoader::restore(const DataCursor& c) {
  ZAYA_CHECK(c.seed == opts_.seed, "data cursor: seed {} differs from the loader's seed {}", c.seed,
             opts_.seed);
  ZAYA_CHECK(c.seq_len == opts_.seq_len,
             "data cursor: seq_len {} differs from the loader's seq_len {} (samples would be cut "
             "differently)",
             c.seq_len, opts_.seq_len);
  ZAYA_CHECK(c.source_samples.size() == sources_.size() && c.prefixes.size() == sources_.size(),
             "data cursor: has {} sources, the loader has {}", c.source_samples.size(),
             sources_.size());
  int64_t total = 0;
  for (size_t i = 0; i < sources_.size(); i++) {
    ZAYA_CHECK(c.prefixes[i] == sources_[i]->dataset().prefix(),
               "data cursor: source {} is \"{}\", the loader's is \"{}\"", i, c.prefixes[i],
               sources_[i]->dataset().prefix());
    if (!c.source_samples_per_epoch.empty())
      ZAYA_CHECK(c.source_samples_per_epoch.size() == sources_.size() &&
                     c.source_samples_per_epoch[i] == sources_[i]->samples_per_epoch(),
                 "data cursor: source {} (\"{}\") had {} samples per epoch, now {} (the dataset "
                 "or the split changed)",
                 i, c.prefixes[i], c.source_samples_per_epoch.at(i),
                 sources_[i]->samples_per_epoch());
    total += c.source_samples[i];
  }
  ZAYA_CHECK(total == c.samples, "data cursor: source sample counts sum to {}, samples is {}",
             total, c.samples);
  blender_.restore(c.source_samples);
}

void DataLoader::reset() {
  blender_.restore(std::vector<int64_t>(sources_.size(), 0));
}

double DataLoader::epochs(int i) const {
  return double(blender_.counts().at(size_t(i))) /
         double(sources_.at(size_t(i))->samples_per_epoch());
}

nlohmann::json DataCursor::to_json() const {
  nlohmann::json j;
  j["version"] = 1;
  j["seed"] = seed;
  j["seq_len"] = seq_len;
  j["samples"] = samples;
  j["sources"] = nlohmann::json::array();
  for (size_t i = 0; i < source_samples.size(); i++) {
    nlohmann::json s;
    s["prefix"] = prefixes.at(i);
    s["samples"] = source_samples[i];
    if (i < source_samples_per_epoch.size() && source_samples_per_epoch[i] > 0) {
      s["samples_per_epoch"] = source_samples_per_epoch[i];
      s["epoch"] = source_samples[i] / source_samples_per_epoch[i];
      s["position"] = source_samples[i] % source_samples_per_epoch[i];
    }
    j["sources"].push_back(s);
  }
  return j;
}

DataCursor DataCursor::from_json(const nlohmann::json& j) {
  auto field = [](const nlohmann::json& o, const char* k, const std::string& where) {
    ZAYA_CHECK(o.is_object() && o.contains(k), "data cursor: missing field \"{}{}\"", where, k);
    return o.at(k);
  };
  auto integer = [&](const nlohmann::json& o, const char* k, const std::string& where) {
    auto v = field(o, k, where);
    ZAYA_CHECK(v.is_number_integer(), "data cursor: field \"{}{}\" must be an integer, got {}",
               where, k, v.dump());
    return v;
  };
  DataCursor c;
  const int64_t version = integer(j, "version", "").get<int64_t>();
  ZAYA_CHECK(version == 1, "data cursor: version {} is not supported (expected 1)", version);
  c.seed = integer(j, "seed", "").get<uint64_t>();
  c.seq_len = integer(j, "seq_len", "").get<int64_t>();
  c.samples = integer(j, "samples", "").get<int64_t>();
  auto src = field(j, "sources", "");
  ZAYA_CHECK(src.is_array(), "data cursor: field \"sources\" must be an array");
  for (size_t i = 0; i < src.size(); i++) {
    const std::string where = "sources[" + std::to_string(i) + "].";
    auto p = field(src[i], "prefix", where);
    ZAYA_CHECK(p.is_string(), "data cursor: field \"{}prefix\" must be a string", where);
    c.prefixes.push_back(p.get<std::string>());
    c.source_samples.push_back(integer(src[i], "samples", where).get<int64_t>());
    if (src[i].contains("samples_per_epoch"))
      c.source_samples_per_epoch.push_back(
          integer(src[i], "samples_per_epoch", where).get<int64_t>());
  }
  if (c.source_samples_per_epoch.size() != c.source_samples.size())
    c.source_samples_per_epoch.clear();
  return c;
}

}  // namespace zaya
