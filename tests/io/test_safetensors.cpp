// safetensors: round trips of every dtype, files written by hand from the spec (an independent
// writer), our writer's bytes inspected by hand (an independent reader), every rejected header,
// zero-copy views, and sharded checkpoints with their index.
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "core/rng.h"
#include "io/safetensors.h"
#include "io_test_util.h"

using namespace zaya;
using namespace zaya::iotest;
using json = nlohmann::json;

namespace {

// The spec, written out by hand: u64 LE header length, the header text, the data section.
std::string st_bytes(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; i++) out[i] = char((n >> (8 * i)) & 0xff);
  return out + header + data;
}

std::string le_f32(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  std::string s(4, '\0');
  for (int i = 0; i < 4; i++) s[i] = char((u >> (8 * i)) & 0xff);
  return s;
}

std::string bytes_of(const Tensor& t) {
  Tensor c = t.is_contiguous() ? t : t.clone();
  return std::string(static_cast<const char*>(c.raw()), c.nbytes());
}

Tensor random_tensor(DType dt, const Shape& shape, Rng& rng) {
  Tensor t = Tensor::empty(shape, dt);
  auto* p = static_cast<unsigned char*>(t.raw());
  for (size_t i = 0; i < t.nbytes(); i++) p[i] = uint8_t(rng.next_u32());
  if (dt == DType::BOOL)
    for (size_t i = 0; i < t.nbytes(); i++) p[i] &= 1;
  return t;
}

constexpr DType kAllDTypes[] = {DType::F32, DType::F16, DType::BF16, DType::F64,
                                DType::I32, DType::U32, DType::I64,  DType::U8,
                                DType::I8,  DType::I16, DType::U16,  DType::BOOL};

}  // namespace

TEST(Safetensors, RoundTripEveryDTypeRandomData) {
  TempDir tmp;
  Rng rng(42);
  std::vector<std::pair<std::string, Tensor>> ts;
  int k = 0;
  for (DType dt : kAllDTypes) {
    const std::string base = std::string(dtype_name(dt));
    ts.push_back({base + ".matrix", random_tensor(dt, {3 + k % 4, 5}, rng)});
    ts.push_back({base + ".vector", random_tensor(dt, {7 + k}, rng)});
    k++;
  }
  ts.push_back({"scalar", random_tensor(DType::F32, {}, rng)});
  ts.push_back({"empty", random_tensor(DType::BF16, {0, 3}, rng)});
  ts.push_back({"odd.u8", random_tensor(DType::U8, {3}, rng)});  // would misalign what follows
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"step", "12"}};
  const std::string path = tmp / "all.safetensors";
  save_safetensors(path, ts, meta);

  auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f->metadata(), meta);
  EXPECT_EQ(f->tensors().size(), ts.size());
  for (const auto& [name, t] : ts) {
    ASSERT_TRUE(f->has(name)) << name;
    Tensor r = f->get(name);
    EXPECT_EQ(r.dtype(), t.dtype()) << name;
    EXPECT_EQ(r.shape(), t.shape()) << name;
    EXPECT_EQ(bytes_of(r), bytes_of(t)) << name;
    // The writer orders by element size, so every view is naturally aligned (zero-copy).
    EXPECT_EQ(reinterpret_cast<uintptr_t>(r.raw()) % dtype_size(r.dtype()), 0u) << name;
  }
  EXPECT_FALSE(f->has("nope"));
  expect_error([&] { f->get("nope"); }, {path, "'nope'"});
}

TEST(Safetensors, ReadsFileWrittenByHandFromSpec) {
  TempDir tmp;
  // Two tensors, header in a different key order than we would write, data in "b, a" order, no
  // padding: all of that is allowed by the spec.
  const std::string header = R"({"b":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},)"
                             R"("__metadata__":{"who":"hand"},)"
                             R"("a":{"shape":[2,2],"data_offsets":[4,20],"dtype":"F32"}})";
  // bf16 1.0 = 0x3f80, -2.0 = 0xc000, little-endian.
  std::string data = std::string("\x80\x3f\x00\xc0", 4) + le_f32(1.5f) + le_f32(-0.25f) +
                     le_f32(3e7f) + le_f32(0.0f);
  const std::string path = tmp / "hand.safetensors";
  write_raw(path, st_bytes(header, data));
  auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f->metadata().at("who"), "hand");
  ASSERT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(f->tensors()[0].name, "b");  // data order
  EXPECT_EQ(f->tensors()[1].begin, 4u);
  Tensor a = f->get("a");
  EXPECT_EQ(a.dtype(), DType::F32);
  EXPECT_EQ(a.shape(), (Shape{2, 2}));
  const float want[] = {1.5f, -0.25f, 3e7f, 0.0f};
  for (int i = 0; i < 4; i++) EXPECT_EQ(a.f32()[i], want[i]);
  Tensor b = f->get("b");
  EXPECT_EQ(b.dtype(), DType::BF16);
  EXPECT_EQ(b.get(0), 1.0f);
  EXPECT_EQ(b.get(1), -2.0f);
}

TEST(Safetensors, ReadsReferenceDocExample) {
  // The byte string from the reference implementation's own documentation (tensor.rs), which
  // its writer produced: a 2x2 I32 tensor of zeros with a 60-byte header.
  TempDir tmp;
  const std::string path = tmp / "ref.safetensors";
  write_raw(path, std::string("<\x00\x00\x00\x00\x00\x00\x00", 8) +
                      R"({"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}})" +
                      std::string(16, '\0'));
  auto f = SafetensorsFile::open(path);
  Tensor t = f->get("test");
  EXPECT_EQ(t.dtype(), DType::I32);
  EXPECT_EQ(t.shape(), (Shape{2, 2}));
  for (int i = 0; i < 4; i++) EXPECT_EQ(t.data<int32_t>()[i], 0);
}

TEST(Safetensors, WrittenBytesFollowSpec) {
  // Inspects our writer's output with nothing but the spec: length prefix, space padding to 8,
  // header entries, tensor bytes at the stated offsets, data section fully covered.
  TempDir tmp;
  Rng rng(7);
  Tensor m = random_tensor(DType::F32, {4, 6}, rng);
  Tensor strided = m.slice(1, 1, 4);  // non-contiguous [4, 3]
  Tensor h = random_tensor(DType::F16, {5}, rng);
  Tensor i8 = random_tensor(DType::I8, {3}, rng);
  const std::string path = tmp / "w.safetensors";
  save_safetensors(path, {{"z.i8", i8}, {"h", h}, {"s", strided}, {"m", m}}, {{"k", "v"}});

  const std::string raw = read_raw(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = (n << 8) | uint8_t(raw[i]);
  ASSERT_LE(8 + n, raw.size());
  EXPECT_EQ(n % 8, 0u);
  const std::string header = raw.substr(8, n);
  const size_t last = header.find_last_not_of(' ');
  EXPECT_EQ(header[last], '}');
  EXPECT_LT(header.size() - last - 1, 8u);  // at most 7 padding spaces
  const std::string data = raw.substr(8 + n);
  json j = json::parse(header);
  EXPECT_EQ(j["__metadata__"], json({{"k", "v"}}));
  // Expected layout: 4-byte tensors first in the given order (s, m), then h, then z.i8.
  struct Want {
    const char* name;
    const char* dtype;
    Tensor t;
  };
  std::vector<Want> order = {
      {"s", "F32", strided}, {"m", "F32", m}, {"h", "F16", h}, {"z.i8", "I8", i8}};
  size_t off = 0;
  for (const auto& w : order) {
    const json& e = j[w.name];
    EXPECT_EQ(e["dtype"], w.dtype) << w.name;
    EXPECT_EQ(e["shape"].get<std::vector<int64_t>>(), w.t.shape()) << w.name;
    const size_t b = e["data_offsets"][0], en = e["data_offsets"][1];
    EXPECT_EQ(b, off) << w.name;
    // Element by element from the source view, using its strides (independent of clone()).
    std::string want;
    const size_t es = dtype_size(w.t.dtype());
    const char* base = static_cast<const char*>(w.t.raw());
    for (int64_t r = 0; r < (w.t.dim() == 2 ? w.t.size(0) : 1); r++)
      for (int64_t c = 0; c < w.t.size(-1); c++) {
        int64_t el = w.t.dim() == 2 ? r * w.t.strides()[0] + c * w.t.strides()[1] : c;
        want.append(base + el * es, es);
      }
    EXPECT_EQ(data.substr(b, en - b), want) << w.name;
    off = en;
  }
  EXPECT_EQ(off, data.size());
  // The header's keys come in the order written: metadata first, then data order.
  EXPECT_LT(header.find("__metadata__"), header.find("\"s\""));
  EXPECT_LT(header.find("\"s\""), header.find("\"m\""));
  EXPECT_LT(header.find("\"h\""), header.find("\"z.i8\""));
}

TEST(Safetensors, ZeroCopyReadOnlyViewOutlivesFile) {
  TempDir tmp;
  const std::string path = tmp / "zc.safetensors";
  save_safetensors(path, {{"w", Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3})}});
  auto f = SafetensorsFile::open(path);
  Tensor a = f->get("w"), b = f->get("w");
  EXPECT_TRUE(a.read_only());
  EXPECT_EQ(a.raw(), b.raw());  // same mapped bytes, no copy
  EXPECT_EQ(a.storage(), b.storage());
  expect_error([&] { a.copy_from(Tensor::zeros({2, 3})); }, {"read-only"});
  f.reset();  // the view keeps the mapping alive
  EXPECT_EQ(a.f32()[5], 6.0f);
  // Replacing the file (as a new save does) does not disturb a live mapping of the old one.
  save_safetensors(path, {{"w", Tensor::from_vector({9, 9, 9, 9, 9, 9}, {2, 3})}});
  EXPECT_EQ(a.f32()[0], 1.0f);
  EXPECT_EQ(SafetensorsFile::open(path)->get("w").f32()[0], 9.0f);
}

TEST(Safetensors, MisalignedTensorFromForeignWriterIsCopiedAligned) {
  TempDir tmp;
  // Header of 64 bytes (data section 8-aligned), U8[1] then F32[1] at data offset 1.
  std::string header = R"({"u":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                       R"("f":{"dtype":"F32","shape":[1],"data_offsets":[1,5]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  const std::string path = tmp / "mis.safetensors";
  write_raw(path, st_bytes(header, "\x07" + le_f32(2.75f)));
  auto f = SafetensorsFile::open(path);
  Tensor t = f->get("f");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % 4, 0u);
  EXPECT_EQ(t.f32()[0], 2.75f);
  EXPECT_TRUE(t.read_only());
  EXPECT_EQ(f->get("u").data<uint8_t>()[0], 7);
}

TEST(Safetensors, EmptyFileWithNoTensors) {
  TempDir tmp;
  const std::string path = tmp / "none.safetensors";
  save_safetensors(path, {});
  EXPECT_EQ(read_raw(path), st_bytes("{}      ", ""));
  EXPECT_TRUE(SafetensorsFile::open(path)->tensors().empty());
}

// ------------------------------------------------------------------------------------------
// Every malformed input: the Error names the file and the tensor or field.
namespace {
struct BadCase {
  const char* what;
  std::string bytes;
  std::vector<std::string> parts;
};

std::string one(const std::string& entry, const std::string& data = std::string(16, '\0')) {
  return st_bytes(R"({"w":)" + entry + "}", data);
}
}  // namespace

TEST(Safetensors, RejectsEveryMalformedHeaderWithNamedField) {
  TempDir tmp;
  const std::string ok_w = R"({"dtype":"F32","shape":[2,2],"data_offsets":[0,16]})";
  std::string huge_len(8, '\0');
  {
    uint64_t n = 100'000'001;
    for (int i = 0; i < 8; i++) huge_len[i] = char((n >> (8 * i)) & 0xff);
  }
  std::vector<BadCase> cases = {
      {"shorter than 8 bytes", std::string("\x05\x00\x00", 3), {"3 bytes", "shorter than"}},
      {"header past end",
       st_bytes("{}", "").substr(0, 8) + "{",
       {"header length 2", "past the end"}},
      {"header too large", huge_len + "{}", {"100000001", "limit"}},
      {"invalid utf-8", st_bytes("{\"w\xff\":{}}", ""), {"UTF-8", "byte 3"}},
      {"not json", st_bytes("{\"w\": nope}", ""), {"not valid JSON"}},
      {"not an object", st_bytes("[1,2]", ""), {"JSON object", "'['"}},
      {"trailing garbage", st_bytes("{} x", ""), {"not valid JSON"}},
      {"entry not an object", one("[1]"), {"tensor 'w'", "expected an object"}},
      {"missing dtype", one(R"({"shape":[2,2],"data_offsets":[0,16]})"), {"tensor 'w'", "'dtype'"}},
      {"missing shape", one(R"({"dtype":"F32","data_offsets":[0,16]})"), {"tensor 'w'", "'shape'"}},
      {"missing offsets",
       one(R"({"dtype":"F32","shape":[2,2]})"),
       {"tensor 'w'", "'data_offsets'"}},
      {"unknown field",
       one(R"({"dtype":"F32","shape":[2,2],"data_offsets":[0,16],"x":1})"),
       {"tensor 'w'", "unexpected field 'x'"}},
      {"unknown dtype",
       one(R"({"dtype":"F8_E4M3","shape":[2,2],"data_offsets":[0,16]})"),
       {"tensor 'w'", "unknown dtype \"F8_E4M3\"", "BF16"}},
      {"dtype not string",
       one(R"({"dtype":4,"shape":[2,2],"data_offsets":[0,16]})"),
       {"tensor 'w'", "dtype", "expected a string"}},
      {"shape not list",
       one(R"({"dtype":"F32","shape":4,"data_offsets":[0,16]})"),
       {"tensor 'w'", "shape", "list of non-negative integers"}},
      {"negative dim",
       one(R"({"dtype":"F32","shape":[2,-2],"data_offsets":[0,16]})"),
       {"tensor 'w'", "shape[1]", "negative integer", "-2"}},
      {"float dim",
       one(R"({"dtype":"F32","shape":[2.5,2],"data_offsets":[0,16]})"),
       {"tensor 'w'", "shape[0]", "non-integer", "2.5"}},
      {"string dim",
       one(R"({"dtype":"F32","shape":["2",2],"data_offsets":[0,16]})"),
       {"tensor 'w'", "shape[0]", "string"}},
      {"shape overflow",
       one(R"({"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]})"),
       {"tensor 'w'", "overflow"}},
      {"offsets arity",
       one(R"({"dtype":"F32","shape":[2,2],"data_offsets":[0]})"),
       {"tensor 'w'", "data_offsets", "two non-negative integers", "[0]"}},
      {"offsets not list",
       one(R"({"dtype":"F32","shape":[2,2],"data_offsets":"0-16"})"),
       {"tensor 'w'", "data_offsets"}},
      {"offset negative",
       one(R"({"dtype":"F32","shape":[2,2],"data_offsets":[-1,16]})"),
       {"tensor 'w'", "data_offsets[0]", "negative"}},
      {"offset float",
       one(R"({"dtype":"F32","shape":[2,2],"data_offsets":[0,16.0]})"),
       {"tensor 'w'", "data_offsets[1]", "non-integer"}},
      {"begin after end",
       one(R"({"dtype":"F32","shape":[0],"data_offsets":[16,0]})"),
       {"tensor 'w'", "[16, 0]", "begin is after end"}},
      {"end past data",
       one(R"({"dtype":"F32","shape":[2,3],"data_offsets":[0,24]})"),
       {"tensor 'w'", "[0, 24]", "past the end of the data section (16 bytes)"}},
      {"size mismatch",
       one(R"({"dtype":"F32","shape":[2,3],"data_offsets":[0,16]})"),
       {"tensor 'w'", "[2, 3]", "needs 24 bytes", "hold 16"}},
      {"overlap",
       st_bytes(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},)"
                R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                std::string(16, '\0')),
       {"tensor 'b'", "overlaps tensor 'a'"}},
      {"hole",
       st_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                R"("b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})",
                std::string(16, '\0')),
       {"bytes [8, 12)", "tensor 'b'", "contiguously"}},
      {"trailing bytes",
       one(ok_w, std::string(20, '\0')),
       {"cover 16 bytes", "holds 20 bytes", "4 trailing"}},
      {"duplicate name",
       st_bytes(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                R"("w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                std::string(16, '\0')),
       {"duplicate tensor name 'w'"}},
      {"duplicate field",
       one(R"({"dtype":"F32","dtype":"I32","shape":[2,2],"data_offsets":[0,16]})"),
       {"'w'", "duplicate field 'dtype'"}},
      {"metadata value not string",
       st_bytes(R"({"__metadata__":{"step":12},"w":)" + ok_w + "}", std::string(16, '\0')),
       {"__metadata__ key 'step'", "expected a string", "12"}},
      {"metadata not object",
       st_bytes(R"({"__metadata__":"x","w":)" + ok_w + "}", std::string(16, '\0')),
       {"__metadata__", "expected an object"}},
  };
  int i = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string path = tmp / ("bad" + std::to_string(i++) + ".safetensors");
    write_raw(path, c.bytes);
    std::vector<std::string> parts = c.parts;
    parts.push_back(path);
    expect_error([&] { SafetensorsFile::open(path); }, parts);
  }
  expect_error([&] { SafetensorsFile::open(tmp / "absent.safetensors"); },
               {tmp / "absent.safetensors", "No such file"});
  expect_error([&] { SafetensorsFile::open(tmp.path()); }, {tmp.path(), "not a regular file"});
  // The two edge cases that must stay accepted: zero-sized tensors and null metadata.
  const std::string path = tmp / "edge.safetensors";
  write_raw(path, st_bytes(R"({"__metadata__":null,"z":{"dtype":"F32","shape":[0,4],)"
                           R"("data_offsets":[0,0]},"w":)" +
                               ok_w + "}",
                           std::string(16, '\0')));
  auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f->get("z").numel(), 0);
  EXPECT_TRUE(f->metadata().empty());
}

TEST(Safetensors, WriterRejectsBadInputAndLeavesNoFile) {
  TempDir tmp;
  const std::string path = tmp / "x.safetensors";
  Tensor t = Tensor::zeros({2});
  expect_error([&] { save_safetensors(path, {{"a", t}, {"a", t}}); }, {path, "'a'", "twice"});
  expect_error([&] { save_safetensors(path, {{"__metadata__", t}}); }, {path, "reserved"});
  expect_error([&] { save_safetensors(path, {{"u", Tensor()}}); }, {path, "'u'", "undefined"});
  expect_error([&] { save_safetensors(path, {{"bad\xff", t}}); }, {path, "UTF-8"});
  EXPECT_TRUE(list_dir(tmp.path()).empty());
}

// ------------------------------------------------------------------------------------------
namespace {
std::vector<std::pair<std::string, Tensor>> shard_fixture(Rng& rng) {
  // F32 sizes in bytes: a 40, b 40, c 120, d 20, e 80.
  return {{"a", random_tensor(DType::F32, {10}, rng)},
          {"b", random_tensor(DType::F32, {2, 5}, rng)},
          {"c", random_tensor(DType::F32, {30}, rng)},
          {"d", random_tensor(DType::F32, {5}, rng)},
          {"e", random_tensor(DType::F32, {4, 5}, rng)}};
}
}  // namespace

TEST(Safetensors, ShardedRoundTripWithIndex) {
  TempDir tmp;
  Rng rng(5);
  auto ts = shard_fixture(rng);
  const std::string dir = tmp / "ckpt";
  auto written = save_sharded(dir, ts, 100, {{"step", "3"}});
  // huggingface_hub's rule with a 100-byte limit: c (120 > 100) alone first; a+b+d = 100 fits
  // exactly; e would tip it over and starts the last shard.
  EXPECT_EQ(written, (std::vector<std::string>{
                         "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                         "model-00003-of-00003.safetensors", "model.safetensors.index.json"}));
  EXPECT_EQ(list_dir(dir),
            (std::vector<std::string>{
                "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                "model-00003-of-00003.safetensors", "model.safetensors.index.json"}));
  json idx = json::parse(read_raw(dir + "/model.safetensors.index.json"));
  EXPECT_EQ(idx["metadata"]["total_size"], 300);
  EXPECT_EQ(idx["weight_map"], json({{"a", "model-00002-of-00003.safetensors"},
                                     {"b", "model-00002-of-00003.safetensors"},
                                     {"c", "model-00001-of-00003.safetensors"},
                                     {"d", "model-00002-of-00003.safetensors"},
                                     {"e", "model-00003-of-00003.safetensors"}}));
  // Each shard is a plain safetensors file with the caller's metadata plus format=pt.
  auto shard2 = SafetensorsFile::open(dir + "/model-00002-of-00003.safetensors");
  EXPECT_EQ(shard2->tensors().size(), 3u);
  EXPECT_EQ(shard2->metadata(),
            (std::map<std::string, std::string>{{"format", "pt"}, {"step", "3"}}));

  for (const std::string& p : {dir, dir + "/model.safetensors.index.json"}) {
    auto s = TensorStore::open(p);
    EXPECT_EQ(s->names(), (std::vector<std::string>{"a", "b", "c", "d", "e"}));
    EXPECT_EQ(s->total_bytes(), 300u);
    EXPECT_EQ(s->files().size(), 3u);
    for (const auto& [name, t] : ts) {
      Tensor r = s->get(name);
      EXPECT_EQ(r.shape(), t.shape());
      EXPECT_EQ(bytes_of(r), bytes_of(t)) << name;
      EXPECT_EQ(s->info(name).shape, t.shape());
    }
    EXPECT_NE(s->file_of("e").find("model-00003-of-00003"), std::string::npos);
    expect_error([&] { s->get("zz"); }, {"'zz'"});
  }
}

TEST(Safetensors, ShardedSaveSwitchesLayoutsAndRemovesStaleFiles) {
  TempDir tmp;
  Rng rng(6);
  auto ts = shard_fixture(rng);
  const std::string dir = tmp / "ckpt";
  save_sharded(dir, ts, 100);
  // Everything fits: one model.safetensors, and the old index and shards are gone.
  EXPECT_EQ(save_sharded(dir, ts, 1 << 20), (std::vector<std::string>{"model.safetensors"}));
  EXPECT_EQ(list_dir(dir), (std::vector<std::string>{"model.safetensors"}));
  auto s = TensorStore::open(dir);
  EXPECT_EQ(s->files().size(), 1u);
  EXPECT_EQ(bytes_of(s->get("c")), bytes_of(ts[2].second));
  EXPECT_EQ(s->metadata().at("format"), "pt");
  // And back to two shards: the single file goes.
  save_sharded(dir, ts, 200);
  EXPECT_EQ(list_dir(dir), (std::vector<std::string>{"model-00001-of-00002.safetensors",
                                                     "model-00002-of-00002.safetensors",
                                                     "model.safetensors.index.json"}));
  EXPECT_EQ(bytes_of(TensorStore::open(dir)->get("e")), bytes_of(ts[4].second));
}

TEST(Safetensors, ShardedIndexErrorsNameShardAndTensor) {
  TempDir tmp;
  Rng rng(8);
  auto ts = shard_fixture(rng);
  const std::string dir = tmp / "ckpt";
  save_sharded(dir, ts, 100);
  const std::string index = dir + "/model.safetensors.index.json";
  const std::string good = read_raw(index);

  std::filesystem::rename(dir + "/model-00003-of-00003.safetensors", tmp / "moved");
  expect_error([&] { TensorStore::open(dir); },
               {index, "model-00003-of-00003.safetensors", "missing", "'e'"});
  std::filesystem::rename(tmp / "moved", dir + "/model-00003-of-00003.safetensors");
  EXPECT_NO_THROW(TensorStore::open(dir));

  json j = json::parse(good);
  j["weight_map"]["e"] = "model-00001-of-00003.safetensors";
  write_raw(index, j.dump());
  expect_error([&] { TensorStore::open(dir); },
               {index, "tensor 'e'", "model-00001-of-00003.safetensors", "no tensor"});

  j = json::parse(good);
  j["weight_map"]["e"] = 3;
  write_raw(index, j.dump());
  expect_error([&] { TensorStore::open(dir); }, {index, "weight_map['e']", "file name"});

  j["weight_map"]["e"] = "../outside.safetensors";
  write_raw(index, j.dump());
  expect_error([&] { TensorStore::open(dir); }, {index, "../outside.safetensors", "relative"});

  write_raw(index, R"({"metadata":{"total_size":1}})");
  expect_error([&] { TensorStore::open(dir); }, {index, "weight_map"});
  write_raw(index, R"({"metadata":{"total_size":-1},"weight_map":{}})");
  expect_error([&] { TensorStore::open(dir); }, {index, "total_size"});
  write_raw(index, "{not json");
  expect_error([&] { TensorStore::open(dir); }, {index, "not valid JSON"});

  // A corrupt shard is reported with the shard's own path.
  write_raw(index, good);
  write_raw(dir + "/model-00002-of-00003.safetensors", "short");
  expect_error([&] { TensorStore::open(dir); }, {"model-00002-of-00003.safetensors", "shorter"});

  expect_error([&] { TensorStore::open(tmp / "nothing"); }, {tmp / "nothing", "does not exist"});
  std::filesystem::create_directory(tmp / "emptydir");
  expect_error([&] { TensorStore::open(tmp / "emptydir"); },
               {"model.safetensors.index.json", "model.safetensors"});
}

TEST(Safetensors, ShardFileNamesMatchTransformers) {
  EXPECT_EQ(shard_file_name(1, 4), "model-00001-of-00004.safetensors");
  EXPECT_EQ(shard_file_name(12, 123), "model-00012-of-00123.safetensors");
}
