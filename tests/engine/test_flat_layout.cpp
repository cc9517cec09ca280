// TrainStepOptions::flat_offsets: a step whose flat buffers follow another layout (the ZeRO-1
// plan's in-place buckets) computes the same bits as the default one, and bad layouts are
// refused naming the tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "dist/zero1.h"
#include "engine/data_parallel_step.h"
#include "engine/train_step.h"
#include "flat_layout_test_util.h"
#include "model/zaya.h"

namespace zaya {
namespace {

TEST(FlatLayout, PlannedLayoutTrainsTheDefaultLayoutsBits) {
  const ZayaConfig cfg = ZayaConfig::preset("tiny");
  ZayaModel ma = ZayaModel::init(cfg, 3), mb = ZayaModel::init(cfg, 3);
  const auto items = zero1_items(ma, OptimizerSettings{});
  // Three ranks' layout (expert slices in rooted buckets, padding between chunks), used whole by
  // one process.
  const Zero1Plan plan = plan_zero1(items, 3, 5000, true);
  ASSERT_GT(plan.padding(items), 0);
  TrainStepOptions planned;
  planned.flat_offsets = plan.offset;
  planned.flat_numel = plan.flat_numel;
  auto a = make_train_step(ma, OptimizerSettings{}, BalancingSettings{}, planned);
  auto b = make_train_step(mb, OptimizerSettings{}, BalancingSettings{}, TrainStepOptions{});
  const auto& la = a->layout();
  const auto& lb = b->layout();
  ASSERT_EQ(la.size(), items.size());
  for (size_t i = 0; i < la.size(); i++) EXPECT_EQ(la[i].offset, plan.offset[i]) << la[i].name;
  EXPECT_EQ(a->grads().numel, plan.flat_numel);
  for (int step = 0; step < 2; step++) {
    test_util::train_step_both(*a, *b, cfg.vocab_size, 2, 12, step, 0);
    const FlatBuffer wa = a->masters(), wb = b->masters();
    for (size_t i = 0; i < la.size(); i++)
      EXPECT_EQ(std::memcmp(wa.data + la[i].offset, wb.data + lb[i].offset,
                            size_t(la[i].numel) * sizeof(float)),
                0)
          << la[i].name << " at step " << step;
  }
}

// The error names the tensor (or the count) and the problem.
void expect_refused(const std::vector<int64_t>& offsets, int64_t numel, const std::string& what) {
  ZayaModel m = ZayaModel::init(ZayaConfig::preset("tiny"), 1);
  TrainStepOptions o;
  o.flat_offsets = offsets;
  o.flat_numel = numel;
  try {
    make_train_step(m, OptimizerSettings{}, BalancingSettings{}, o);
    ADD_FAILURE() << "accepted a layout that should fail with: " << what;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(FlatLayout, BadLayoutsAreRefusedNamingTheTensor) {
  ZayaModel m = ZayaModel::init(ZayaConfig::preset("tiny"), 1);
  const auto items = zero1_items(m, OptimizerSettings{});
  const Zero1Plan plan = plan_zero1(items, 2, 5000, true);
  size_t q = 0, k = 0, other = 0;
  for (size_t i = 0; i < items.size(); i++) {
    if (items[i].name.find("layers.0.") == std::string::npos) continue;
    if (items[i].name.find("q_proj.weight") != std::string::npos) q = i;
    if (items[i].name.find("k_proj.weight") != std::string::npos) k = i;
    if (items[i].name.find("o_proj.weight") != std::string::npos) other = i;
  }
  ASSERT_GT(k, q);
  auto off = plan.offset;
  off.pop_back();
  expect_refused(off, plan.flat_numel, "offsets for");
  off = plan.offset;
  off[other] += 1;
  expect_refused(off, plan.flat_numel, items[other].name + "' at flat offset");
  off = plan.offset;
  off[k] += kZero1AlignFloats;
  expect_refused(off, plan.flat_numel + 4 * kZero1AlignFloats, "does not follow");
  off = plan.offset;
  off[other] = off[q];
  expect_refused(off, plan.flat_numel, "overlaps");
  expect_refused(plan.offset, plan.flat_numel - 64, "outside");
}

}  // namespace
}  // namespace zaya
