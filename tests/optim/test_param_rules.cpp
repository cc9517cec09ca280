// Parameter → optimizer rules: the default assignment of every ZAYA1 tensor name (ZAYA1.md §2),
// rule order, globs and regexes, fallback by rank, validation.
#include <gtest/gtest.h>

#include "core/error.h"
#include "optim/param_rules.h"

using namespace zaya;

namespace {
OptimizerKind assigned(const std::string& name, const Shape& shape) {
  return assign_param(name, shape, default_param_rules(), 0.1).optimizer;
}
}  // namespace

TEST(OptimRules, DefaultsFollowZaya1Recipe) {
  const auto M = OptimizerKind::Muon, A = OptimizerKind::AdamW, N = OptimizerKind::None;
  const std::string L = "model.layers.3.";
  struct Case {
    std::string name;
    Shape shape;
    OptimizerKind want;
  };
  const std::vector<Case> cases = {
      {L + "self_attn.qkv_proj.q_proj.weight", {256, 128}, M},
      {L + "self_attn.qkv_proj.k_proj.weight", {64, 128}, M},
      {L + "self_attn.qkv_proj.v_proj_current.weight", {32, 128}, M},
      {L + "self_attn.qkv_proj.v_proj_delayed.weight", {32, 128}, M},
      {L + "self_attn.o_proj.weight", {128, 256}, M},
      {L + "mlp.gate.down_proj.weight", {32, 128}, M},
      {L + "mlp.gate.router_mlp.fc1.weight", {32, 32}, M},
      {L + "mlp.gate.router_mlp.fc2.weight", {32, 32}, M},
      {L + "mlp.gate.router_mlp.out_proj.weight", {5, 32}, M},
      {L + "mlp.experts.gate_up_proj", {4, 256, 128}, M},
      {L + "mlp.experts.down_proj", {4, 128, 128}, M},
      {"model.embed_tokens.weight", {384, 128}, A},
      {"lm_head.weight", {384, 128}, A},
      {L + "self_attn.qkv_proj.conv_qk_depthwise.weight", {384, 1, 2}, A},
      {L + "self_attn.qkv_proj.conv_qk_depthwise.bias", {384}, A},
      {L + "self_attn.qkv_proj.conv_qk_grouped.weight", {384, 32, 2}, A},
      {L + "self_attn.qkv_proj.conv_qk_grouped.bias", {384}, A},
      {L + "self_attn.qk_norm.temp", {2}, A},
      {L + "input_layernorm.weight", {128}, A},
      {L + "post_attention_layernorm.weight", {128}, A},
      {L + "post_attention_residual_scale.hidden_states_scale", {128}, A},
      {L + "post_mlp_residual_scale.residual_bias", {128}, A},
      {L + "mlp.gate.down_proj.bias", {32}, A},
      {L + "mlp.gate.router_states_scale", {32}, A},
      {L + "mlp.gate.router_mlp.norm.weight", {32}, A},
      {L + "mlp.gate.router_mlp.fc1.bias", {32}, A},
      {"model.input_hidden_states_scale", {128}, A},
      {"model.input_hidden_states_bias", {128}, A},
      {"model.norm.weight", {128}, A},
      {L + "mlp.gate.balancing_biases", {5}, N},
  };
  for (const auto& c : cases) EXPECT_EQ(assigned(c.name, c.shape), c.want) << c.name;
  // Norms, biases, scales and temperatures are not decayed; matrices and the embedding are.
  auto rules = default_param_rules();
  EXPECT_EQ(assign_param("model.norm.weight", {128}, rules, 0.1).weight_decay, 0.0);
  EXPECT_EQ(assign_param(L + "self_attn.qk_norm.temp", {2}, rules, 0.1).weight_decay, 0.0);
  EXPECT_EQ(assign_param(L + "self_attn.o_proj.weight", {8, 8}, rules, 0.1).weight_decay, 0.1);
  EXPECT_EQ(assign_param("model.embed_tokens.weight", {8, 8}, rules, 0.1).weight_decay, 0.1);
  EXPECT_EQ(assign_param(L + "mlp.gate.balancing_biases", {5}, rules, 0.1).rule,
            ParamAssignment::kBalancingBias);
}

TEST(OptimRules, UnmatchedFallBackByRank) {
  const std::vector<ParamRule> none;
  EXPECT_EQ(assign_param("x.linear_q.weight", {8, 8}, none, 0.1).optimizer, OptimizerKind::Muon);
  EXPECT_EQ(assign_param("x.embed.weight", {8, 8}, none, 0.1).optimizer, OptimizerKind::AdamW);
  EXPECT_EQ(assign_param("x.scale", {8}, none, 0.1).optimizer, OptimizerKind::AdamW);
  EXPECT_EQ(assign_param("x.conv", {8, 1, 2}, none, 0.1).optimizer, OptimizerKind::AdamW);
  EXPECT_EQ(assign_param("x.linear_q.weight", {8, 8}, none, 0.1).rule, ParamAssignment::kByRank);
}

TEST(OptimRules, FirstMatchWinsGlobAndRegex) {
  std::vector<ParamRule> rules = {
      {"re:model\\.layers\\.[0-9]+\\.self_attn\\.o_proj\\.weight", OptimizerKind::AdamW, 0.5, 0.0},
      {"*.o_proj.weight", OptimizerKind::Muon, 1.0, {}},
  };
  auto a = assign_param("model.layers.12.self_attn.o_proj.weight", {8, 8}, rules, 0.1);
  EXPECT_EQ(a.optimizer, OptimizerKind::AdamW);
  EXPECT_EQ(a.lr_mult, 0.5);
  EXPECT_EQ(a.rule, 0);
  // The regex is a whole-name match: a longer name falls through to the glob.
  auto b = assign_param("x.model.layers.1.self_attn.o_proj.weight", {8, 8}, rules, 0.1);
  EXPECT_EQ(b.rule, 1);
  EXPECT_EQ(b.weight_decay, 0.1);
}

TEST(OptimRules, GlobSemantics) {
  EXPECT_TRUE(glob_match("*", ""));
  EXPECT_TRUE(glob_match("a*b", "a.x.y.b"));
  EXPECT_TRUE(glob_match("a?c", "abc"));
  EXPECT_FALSE(glob_match("a?c", "ac"));
  EXPECT_FALSE(glob_match("*.bias", "x.bias.y"));
  EXPECT_TRUE(glob_match("*norm*weight", "a.norm.b.weight"));
  EXPECT_FALSE(glob_match("abc", "abcd"));
  EXPECT_TRUE(glob_match("*a*a*a", "aaaa"));
}

TEST(OptimRules, ValidationNamesTheProblem) {
  EXPECT_THROW(validate_param_rule({"", OptimizerKind::AdamW, 1.0, {}}, "r"), Error);
  EXPECT_THROW(validate_param_rule({"re:(", OptimizerKind::AdamW, 1.0, {}}, "r"), Error);
  EXPECT_THROW(validate_param_rule({"*", OptimizerKind::AdamW, -1.0, {}}, "r"), Error);
  EXPECT_THROW(validate_param_rule({"*", OptimizerKind::AdamW, 1.0, -0.1}, "r"), Error);
  EXPECT_NO_THROW(validate_param_rule({"*", OptimizerKind::AdamW, 1.0, 0.0}, "r"));
  try {
    optimizer_kind_from_name("sgd", "optim.rules[2].optimizer");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("optim.rules[2].optimizer"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("sgd"), std::string::npos);
  }
}
