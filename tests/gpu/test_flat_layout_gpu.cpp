// TrainStepOptions::flat_offsets on the CUDA step (label gpu; skipped without a CUDA device): a
// step whose master and gradient buffers follow a ZeRO-1 plan's in-place layout (three ranks'
// buckets, used whole by one process: padding between chunks, rooted parts, the packed qkv
// matrix kept back to back) computes the default layout's bits, and reports the plan's offsets.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "../engine/flat_layout_test_util.h"
#include "core/error.h"
#include "dist/zero1.h"
#include "engine/data_parallel_step.h"
#include "engine/train_step.h"
#include "gpu_test_util.h"
#include "model/zaya.h"

namespace zaya {
namespace {

TEST(FlatLayoutCuda, PlannedLayoutTrainsTheDefaultLayoutsBits) {
  SKIP_WITHOUT_GPU();
  const ZayaConfig c = test_util::small_gpu_config(2);
  ZayaModel ma = ZayaModel::init(c, 4), mb = ZayaModel::init(c, 4);
  const auto items = zero1_items(ma, OptimizerSettings{});
  const Zero1Plan plan = plan_zero1(items, 3, 3000, true);
  ASSERT_GT(plan.padding(items), 0);
  const int64_t B = 2, S = 32;
  TrainStepOptions planned, plain;
  for (TrainStepOptions* o : {&planned, &plain}) {
    o->device = "cuda";
    o->max_tokens = B * S;
    o->max_seq = S;
  }
  planned.flat_offsets = plan.offset;
  planned.flat_numel = plan.flat_numel;
  auto a = make_train_step(ma, OptimizerSettings{}, BalancingSettings{}, planned);
  auto b = make_train_step(mb, OptimizerSettings{}, BalancingSettings{}, plain);
  const auto& la = a->layout();
  const auto& lb = b->layout();
  ASSERT_EQ(la.size(), items.size());
  for (size_t i = 0; i < la.size(); i++) EXPECT_EQ(la[i].offset, plan.offset[i]) << la[i].name;
  EXPECT_EQ(a->grads().numel, plan.flat_numel);
  for (int step = 0; step < 3; step++) {
    test_util::train_step_both(*a, *b, c.vocab_size, B, S, step, 1);
    a->weights_changed();
    b->weights_changed();
  }
  a->sync();
  b->sync();
  const FlatBuffer wa = a->masters(), wb = b->masters();
  std::vector<float> ha(size_t(wa.numel)), hb(size_t(wb.numel));
  ASSERT_CUDA_OK(cudaMemcpy(ha.data(), wa.data, ha.size() * 4, cudaMemcpyDeviceToHost));
  ASSERT_CUDA_OK(cudaMemcpy(hb.data(), wb.data, hb.size() * 4, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < la.size(); i++)
    EXPECT_EQ(std::memcmp(ha.data() + la[i].offset, hb.data() + lb[i].offset,
                          size_t(la[i].numel) * sizeof(float)),
              0)
        << la[i].name;
}

}  // namespace
}  // namespace zaya
