// Tensor: a typed, shaped view of a Storage (a byte buffer on one device). Views share storage.
// Strides are in elements; most ops require contiguous tensors and say so. Host storage may be
// owned memory or a read-only memory map (weights loaded from safetensors stay in their stored
// dtype and are not copied). Device storage is allocated by a backend (CUDA) through the same type.
//
// Legend for shape names used across the code base: B batch, S sequence, D hidden, H heads,
// d head dim, E experts, I expert width, R router width, V vocabulary.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace zaya {

enum class Device : uint8_t { CPU, CUDA };

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

class Storage {
 public:
  // Owned host memory, zero-filled, 64-byte aligned.
  static std::shared_ptr<Storage> host(size_t bytes);
  // Wraps foreign memory; `release` runs when the last view goes away (munmap, cudaFree, ...).
  static std::shared_ptr<Storage> wrap(void* data, size_t bytes, Device dev, bool read_only,
                                       std::function<void(void*)> release);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  bool read_only() const { return read_only_; }

 private:
  Storage() = default;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_ = Device::CPU;
  bool read_only_ = false;
  std::function<void(void*)> release_;
};

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(const Shape& shape, DType dtype, Device dev = Device::CPU);
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32) { return empty(shape, dtype); }
  static Tensor from_storage(std::shared_ptr<Storage> st, size_t byte_offset, const Shape& shape,
                             DType dtype);
  static Tensor from_vector(const std::vector<float>& v, const Shape& shape);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::CPU; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int dim() const { return int(shape_.size()); }
  int64_t size(int i) const { return shape_.at(i < 0 ? i + dim() : i); }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const;
  bool read_only() const { return storage_ && storage_->read_only(); }
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  size_t byte_offset() const { return offset_; }

  void* raw() const;
  template <typename T>
  T* data() const {
    check_type(sizeof(T));
    return static_cast<T*>(raw());
  }
  float* f32() const;
  const uint16_t* u16() const;

  // Views (share storage).
  Tensor view(const Shape& shape) const;  // contiguous only; one -1 allowed
  Tensor slice(int dim, int64_t begin, int64_t end) const;
  Tensor select(int dim, int64_t index) const;  // drops the dimension

  // Copies.
  Tensor clone() const;               // contiguous copy, same dtype
  Tensor to(DType dtype) const;       // contiguous copy converted (float types, int types)
  void copy_from(const Tensor& src);  // same shape; converts dtype
  void fill(float v);
  // Element i of a contiguous float tensor as float (any float dtype).
  float get(int64_t i) const;

 private:
  void check_type(size_t elem) const;
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;
  DType dtype_ = DType::F32;
  Shape shape_;
  Shape strides_;
};

// Converts n contiguous elements of a float dtype to fp32.
void convert_to_f32(float* dst, const void* src, DType src_type, int64_t n);
void convert_from_f32(void* dst, DType dst_type, const float* src, int64_t n);

}  // namespace zaya
