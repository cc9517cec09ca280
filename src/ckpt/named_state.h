// Named state: how stateful training components hand their state to checkpoints. Each piece is a
// tensor under a stable name (optim.adamw.exp_avg.<param>, balance.exp_avg.<layer bias>, ...)
// with where it sits in the global tensor of that name: the global shape and the piece's start
// in every dimension. A single process stores whole tensors (offset zero, shape = global shape);
// a data-parallel rank that owns part of a tensor stores its slice under the same name, so a
// checkpoint can be read back by any number of ranks.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace zaya {

struct NamedState {
  std::string name;
  Tensor tensor;                // the piece this process holds
  Shape global_shape;           // the whole tensor's shape
  std::vector<int64_t> offset;  // the piece's start in each dimension of the global tensor

  bool is_whole() const;
};

// Whole tensors (every piece is its global tensor).
std::vector<NamedState> whole_tensors(const std::vector<std::pair<std::string, Tensor>>& named);

// Where a restoring step reads named state from: any box of any global tensor, whoever wrote
// which piece of it (ckpt/sharded.h reads the pieces of a checkpoint's rank files).
class StateSource {
 public:
  virtual ~StateSource() = default;
  virtual std::vector<std::string> names() const = 0;  // sorted
  virtual bool has(const std::string& name) const = 0;
  virtual const Shape& global_shape(const std::string& name) const = 0;
  // The box [offset, offset + shape) of `name`'s global tensor, fp32. An Error names the tensor
  // and the box when it is not inside the global shape.
  virtual Tensor read(const std::string& name, const std::vector<int64_t>& offset,
                      const Shape& shape) const = 0;
  Tensor read_whole(const std::string& name) const;
  // Rows [first, first + count) of dim 0 (every other dimension whole).
  Tensor read_rows(const std::string& name, int64_t first, int64_t count) const;
};

// A StateSource over whole tensors in memory.
class WholeStateSource : public StateSource {
 public:
  explicit WholeStateSource(std::vector<std::pair<std::string, Tensor>> named);
  std::vector<std::string> names() const override;
  bool has(const std::string& name) const override;
  const Shape& global_shape(const std::string& name) const override;
  Tensor read(const std::string& name, const std::vector<int64_t>& offset,
              const Shape& shape) const override;

 private:
  std::vector<std::pair<std::string, Tensor>> named_;
  const Tensor& at(const std::string& name) const;
};

// Copies the part of `piece` (placed at piece_offset in a global tensor) that falls inside the box
// `out` (placed at out_offset) into `out`; both fp32 and contiguous. Returns the elements copied.
int64_t copy_box_overlap(const Tensor& piece, const std::vector<int64_t>& piece_offset, Tensor& out,
                         const std::vector<int64_t>& out_offset);

}  // namespace zaya
