// The ZeRO-1 plan from a config alone (sizing/zero1_layout.h): the same items as the training
// step's own, and for ZAYA1-base a layout whose padding stays a fraction of a per cent of the
// fp32 buffers at every world size from one GPU to ZAYA1's 1,024.
#include <gtest/gtest.h>

#include "engine/data_parallel_step.h"
#include "model/zaya.h"
#include "sizing/zero1_layout.h"

namespace zaya {
namespace {

TEST(Zero1Layout, ShapesInOrderGiveTheStepsItems) {
  const ZayaConfig c = ZayaConfig::preset("tiny");
  ZayaModel m = ZayaModel::init(c, 1);
  const auto from_model = zero1_items(m, OptimizerSettings{});
  const auto from_config = zero1_items(tensor_shapes_in_order(c), OptimizerSettings{});
  ASSERT_EQ(from_model.size(), from_config.size());
  int followers = 0;
  for (size_t i = 0; i < from_model.size(); i++) {
    EXPECT_EQ(from_model[i].name, from_config[i].name);
    EXPECT_EQ(from_model[i].shape, from_config[i].shape) << from_model[i].name;
    EXPECT_EQ(from_model[i].kind, from_config[i].kind) << from_model[i].name;
    EXPECT_EQ(from_model[i].follows_previous, from_config[i].follows_previous);
    followers += from_config[i].follows_previous;
  }
  EXPECT_EQ(followers, 3 * c.num_hidden_layers);  // k, v_current, v_delayed after each q
}

TEST(Zero1Layout, BasePaddingStaysSmallAtAnyWorldSize) {
  const ZayaConfig c = ZayaConfig::preset("zaya1-base");
  const int64_t bucket = int64_t(25) << 18;  // the [parallel] default, 25 MiB
  for (int n : {1, 2, 3, 8, 16, 48, 128, 1024}) {
    const sizing::Zero1LayoutSummary s = sizing::zero1_layout(c, n, OptimizerSettings{}, bucket);
    EXPECT_LE(double(s.padding_elems), 0.005 * double(s.flat_elems)) << n << " ranks";
    EXPECT_LE(s.state_max_over_mean, 1.05) << n << " ranks";
    if (n == 1) {
      EXPECT_EQ(s.rooted, 0);
      EXPECT_LT(s.padding_elems, 1244 * kZero1AlignFloats);  // alignment only
    }
    if (n == 1024) EXPECT_GT(s.rooted, 0);  // few tensors per rank: parts packed per owner
  }
}

}  // namespace
}  // namespace zaya
