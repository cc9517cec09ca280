#include "core/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/parallel.h"

namespace zaya {

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); i++) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

std::shared_ptr<Storage> Storage::host(size_t bytes) {
  auto st = std::shared_ptr<Storage>(new Storage());
  size_t padded = (bytes + 63) / 64 * 64;
  if (padded == 0) padded = 64;
  void* p = std::aligned_alloc(64, padded);
  if (!p) fail("out of host memory allocating {} bytes", bytes);
  zero_bytes(p, padded);  // several threads from 64 MiB: the first touch of the pages dominates
  st->data_ = p;
  st->bytes_ = bytes;
  st->release_ = [](void* q) { std::free(q); };
  return st;
}

std::shared_ptr<Storage> Storage::wrap(void* data, size_t bytes, Device dev, bool read_only,
                                       std::function<void(void*)> release) {
  auto st = std::shared_ptr<Storage>(new Storage());
  st->data_ = data;
  st->bytes_ = bytes;
  st->device_ = dev;
  st->read_only_ = read_only;
  st->release_ = std::move(release);
  return st;
}

Storage::~Storage() {
  if (release_) release_(data_);
}

static Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t s = 1;
  for (int i = int(shape.size()) - 1; i >= 0; i--) {
    st[i] = s;
    s *= shape[i];
  }
  return st;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device dev) {
  for (auto d : shape) ZAYA_CHECK(d >= 0, "negative dimension in shape {}", shape_str(shape));
  ZAYA_CHECK(dev == Device::CPU, "Tensor::empty: device storage is allocated by the CUDA backend");
  Tensor t;
  t.storage_ = Storage::host(size_t(shape_numel(shape)) * dtype_size(dtype));
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  return t;
}

Tensor Tensor::from_storage(std::shared_ptr<Storage> st, size_t byte_offset, const Shape& shape,
                            DType dtype) {
  size_t need = size_t(shape_numel(shape)) * dtype_size(dtype);
  ZAYA_CHECK(byte_offset + need <= st->bytes(),
             "tensor of shape {} {} at offset {} exceeds its storage of {} bytes", shape_str(shape),
             dtype_name(dtype), byte_offset, st->bytes());
  Tensor t;
  t.storage_ = std::move(st);
  t.offset_ = byte_offset;
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  return t;
}

Tensor Tensor::from_vector(const std::vector<float>& v, const Shape& shape) {
  ZAYA_CHECK(int64_t(v.size()) == shape_numel(shape), "from_vector: {} values for shape {}",
             v.size(), shape_str(shape));
  Tensor t = empty(shape, DType::F32);
  std::memcpy(t.raw(), v.data(), v.size() * 4);
  return t;
}

bool Tensor::is_contiguous() const {
  return strides_ == contiguous_strides(shape_);
}

void* Tensor::raw() const {
  ZAYA_ASSERT(storage_);
  return static_cast<char*>(storage_->data()) + offset_;
}

void Tensor::check_type(size_t elem) const {
  if (elem != dtype_size(dtype_))
    fail("tensor of dtype {} accessed with an element type of {} bytes", dtype_name(dtype_), elem);
}

float* Tensor::f32() const {
  ZAYA_CHECK(dtype_ == DType::F32, "expected an F32 tensor, found {}", dtype_name(dtype_));
  return static_cast<float*>(raw());
}

const uint16_t* Tensor::u16() const {
  ZAYA_CHECK(dtype_size(dtype_) == 2, "expected a 16-bit tensor, found {}", dtype_name(dtype_));
  return static_cast<const uint16_t*>(raw());
}

Tensor Tensor::view(const Shape& shape) const {
  ZAYA_CHECK(is_contiguous(), "view of a non-contiguous tensor");
  Shape s = shape;
  int neg = -1;
  int64_t known = 1;
  for (size_t i = 0; i < s.size(); i++) {
    if (s[i] == -1) {
      ZAYA_CHECK(neg < 0, "view: more than one -1 in {}", shape_str(shape));
      neg = int(i);
    } else {
      known *= s[i];
    }
  }
  if (neg >= 0) s[neg] = known ? numel() / known : 0;
  ZAYA_CHECK(shape_numel(s) == numel(), "view: cannot view {} as {}", shape_str(shape_),
             shape_str(shape));
  Tensor t = *this;
  t.shape_ = s;
  t.strides_ = contiguous_strides(s);
  return t;
}

Tensor Tensor::slice(int d, int64_t begin, int64_t end) const {
  if (d < 0) d += dim();
  ZAYA_CHECK(d >= 0 && d < dim() && begin >= 0 && begin <= end && end <= shape_[d],
             "slice [{}, {}) of dim {} out of range for shape {}", begin, end, d,
             shape_str(shape_));
  Tensor t = *this;
  t.offset_ += size_t(begin * strides_[d]) * dtype_size(dtype_);
  t.shape_[d] = end - begin;
  return t;
}

Tensor Tensor::select(int d, int64_t index) const {
  if (d < 0) d += dim();
  Tensor t = slice(d, index, index + 1);
  t.shape_.erase(t.shape_.begin() + d);
  t.strides_.erase(t.strides_.begin() + d);
  return t;
}

void convert_to_f32(float* dst, const void* src, DType t, int64_t n) {
  switch (t) {
    case DType::F32: std::memcpy(dst, src, size_t(n) * 4); return;
    case DType::BF16: {
      auto s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::F16: {
      auto s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; i++) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::F64: {
      auto s = static_cast<const double*>(src);
      for (int64_t i = 0; i < n; i++) dst[i] = float(s[i]);
      return;
    }
    default: fail("cannot convert {} to F32", dtype_name(t));
  }
}

void convert_from_f32(void* dst, DType t, const float* src, int64_t n) {
  switch (t) {
    case DType::F32: std::memcpy(dst, src, size_t(n) * 4); return;
    case DType::BF16: {
      auto d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; i++) d[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::F16: {
      auto d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; i++) d[i] = f32_to_f16(src[i]);
      return;
    }
    case DType::F64: {
      auto d = static_cast<double*>(dst);
      for (int64_t i = 0; i < n; i++) d[i] = src[i];
      return;
    }
    default: fail("cannot convert F32 to {}", dtype_name(t));
  }
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(DType dt) const {
  Tensor t = empty(shape_, dt);
  t.copy_from(*this);
  return t;
}

// Copies element by element over possibly strided source/destination.
void Tensor::copy_from(const Tensor& src) {
  ZAYA_CHECK(src.shape_ == shape_, "copy_from: shape {} into {}", shape_str(src.shape_),
             shape_str(shape_));
  ZAYA_CHECK(device() == Device::CPU && src.device() == Device::CPU,
             "copy_from: host tensors only");
  ZAYA_CHECK(!read_only(), "copy_from: destination is read-only");
  const int64_t n = numel();
  if (n == 0) return;
  if (is_contiguous() && src.is_contiguous()) {
    if (dtype_ == src.dtype_) {
      std::memcpy(raw(), src.raw(), nbytes());
      return;
    }
    if (dtype_is_float(dtype_) && dtype_is_float(src.dtype_)) {
      // Through fp32 in blocks of 64K elements, blocks in parallel (an elementwise conversion:
      // the result does not depend on the split). An fp32 source converts directly.
      constexpr int64_t kBlock = int64_t(1) << 16;
      const size_t ss = dtype_size(src.dtype_), ds = dtype_size(dtype_);
      const char* sp = static_cast<const char*>(src.raw());
      char* dp = static_cast<char*>(raw());
      parallel_for((n + kBlock - 1) / kBlock, [&](int64_t b, int64_t e) {
        std::vector<float> tmp;
        for (int64_t blk = b; blk < e; blk++) {
          const int64_t i0 = blk * kBlock, m = std::min(kBlock, n - i0);
          const float* f = reinterpret_cast<const float*>(sp + size_t(i0) * ss);
          if (src.dtype_ != DType::F32) {
            tmp.resize(size_t(m));
            convert_to_f32(tmp.data(), sp + size_t(i0) * ss, src.dtype_, m);
            f = tmp.data();
          }
          convert_from_f32(dp + size_t(i0) * ds, dtype_, f, m);
        }
      });
      return;
    }
    // integer conversions
    auto rd = [&](int64_t i) -> int64_t {
      const char* p = static_cast<const char*>(src.raw());
      switch (src.dtype_) {
        case DType::I32: return reinterpret_cast<const int32_t*>(p)[i];
        case DType::U32: return reinterpret_cast<const uint32_t*>(p)[i];
        case DType::I64: return reinterpret_cast<const int64_t*>(p)[i];
        case DType::U16: return reinterpret_cast<const uint16_t*>(p)[i];
        case DType::I16: return reinterpret_cast<const int16_t*>(p)[i];
        case DType::U8:
        case DType::BOOL: return reinterpret_cast<const uint8_t*>(p)[i];
        case DType::I8: return reinterpret_cast<const int8_t*>(p)[i];
        default: fail("cannot convert {} to {}", dtype_name(src.dtype_), dtype_name(dtype_));
      }
    };
    char* q = static_cast<char*>(raw());
    for (int64_t i = 0; i < n; i++) {
      int64_t v = rd(i);
      switch (dtype_) {
        case DType::I32: reinterpret_cast<int32_t*>(q)[i] = int32_t(v); break;
        case DType::U32: reinterpret_cast<uint32_t*>(q)[i] = uint32_t(v); break;
        case DType::I64: reinterpret_cast<int64_t*>(q)[i] = v; break;
        case DType::F32: reinterpret_cast<float*>(q)[i] = float(v); break;
        default: fail("cannot convert {} to {}", dtype_name(src.dtype_), dtype_name(dtype_));
      }
    }
    return;
  }
  // Strided: gather the source into a contiguous buffer of its dtype, then convert and scatter.
  const size_t es = dtype_size(src.dtype_), ed = dtype_size(dtype_);
  std::vector<int64_t> idx(shape_.size(), 0);
  Tensor tmp = Tensor::empty(shape_, src.dtype_);
  char* out = static_cast<char*>(tmp.raw());
  const char* in = static_cast<const char*>(src.raw());
  for (int64_t i = 0; i < n; i++) {
    int64_t off = 0;
    for (size_t k = 0; k < idx.size(); k++) off += idx[k] * src.strides_[k];
    std::memcpy(out + i * es, in + off * es, es);
    for (int k = int(idx.size()) - 1; k >= 0; k--) {
      if (++idx[k] < shape_[k]) break;
      idx[k] = 0;
    }
  }
  Tensor conv = dtype_ == src.dtype_ ? tmp : tmp.to(dtype_);
  const char* cin = static_cast<const char*>(conv.raw());
  char* dst = static_cast<char*>(raw());
  std::fill(idx.begin(), idx.end(), 0);
  for (int64_t i = 0; i < n; i++) {
    int64_t off = 0;
    for (size_t k = 0; k < idx.size(); k++) off += idx[k] * strides_[k];
    std::memcpy(dst + off * ed, cin + i * ed, ed);
    for (int k = int(idx.size()) - 1; k >= 0; k--) {
      if (++idx[k] < shape_[k]) break;
      idx[k] = 0;
    }
  }
}

void Tensor::fill(float v) {
  ZAYA_CHECK(is_contiguous(), "fill: non-contiguous tensor");
  ZAYA_CHECK(!read_only(), "fill: the tensor is read-only (a memory-mapped checkpoint)");
  std::vector<float> tmp(size_t(numel()), v);
  convert_from_f32(raw(), dtype_, tmp.data(), numel());
}

float Tensor::get(int64_t i) const {
  float f;
  const char* p = static_cast<const char*>(raw()) + size_t(i) * dtype_size(dtype_);
  convert_to_f32(&f, p, dtype_, 1);
  return f;
}

}  // namespace zaya
