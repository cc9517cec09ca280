// What a ZAYA-style model costs, counted from its configuration alone: parameters tensor by tensor
// (the ZAYA1.md §2 name table, independent of ZayaConfig::params_*), the forward ops of one
// training micro-batch with their FLOPs, bytes and GEMM shapes, model FLOPs per token (DESIGN.md),
// activation and optimizer memory under ZeRO-1, and KV-cache bytes per token.
//
// Sizing explores hypothetical models, so top-k above 1 is allowed here (ZayaConfig::validate
// rejects it because the trainer only implements top-1). Not here: timing (cost_model.h) and any
// judgement of the numbers (rules.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "sizing/kernel_class.h"

namespace zaya::sizing {

// Throws zaya::Error naming the field when the shape is impossible (zero or negative sizes, query
// heads not a multiple of KV heads, odd value width, top-k outside 1..E).
void validate_shape(const ZayaConfig& c, const std::string& where);

enum class ParamKind { Matrix, Conv, Vector, Embedding };

struct ParamTensor {
  std::string name;   // HF name with {i} for the layer or {e} folded into the first dim
  int64_t numel = 0;  // summed over layers where the tensor repeats
  ParamKind kind = ParamKind::Vector;
  bool expert = false;  // one slice of the first dim per expert
};

struct ParamCounts {
  std::vector<ParamTensor> tensors;  // model-level and all layers
  int64_t total = 0;                 // without the embedding
  int64_t embedding = 0;             // V*D (tied: also the LM head)
  int64_t active = 0;                // per token, top-k experts, without the embedding
  int64_t expert = 0;                // all experts, all layers
  int64_t matrix = 0;                // 2-D weight matrices (Muon), embedding excluded
  // Weights each token multiplies once in training (matmuls, both convolutions, LM head): the N of
  // "6N" in the FLOP count.
  int64_t matmul_active_with_head = 0;
  int64_t total_with_embedding() const { return total + embedding; }
};
ParamCounts count_params(const ZayaConfig& c);

enum class OpKind { Gemm, Attention, Memory };

// One forward op of a micro-batch, `count` identical instances (per layer, per expert), with what
// its backward costs (by default twice the forward: dX and dW GEMMs, DESIGN.md's 6 = 2 + 4).
struct Op {
  std::string name;
  OpKind kind = OpKind::Memory;
  // The efficiency table that prices it (Attention: AttentionFwd, whose backward is AttentionBwd;
  // Memory: one of the memory-bound classes; Gemm: None).
  KernelClass cls = KernelClass::None;
  double m = 0, n = 0, k = 0;  // Gemm: [m,k] x [k,n]; m may be fractional (tokens per expert)
  double flops = 0;            // one instance
  double bytes = 0;            // one instance, bf16 operands, read + written
  double bwd_flops = 0;        // one instance of its backward
  double bwd_bytes = 0;
  int64_t count = 1;
  bool per_layer = true;  // recomputed under activation checkpointing (the LM head is not)
  bool expert = false;
  double total_flops() const { return flops * double(count); }
};

// Forward ops for `tokens` tokens made of sequences of length `seq` (attention cost depends on it).
// Tokens are spread evenly over experts: tokens*k/E per expert.
std::vector<Op> forward_ops(const ZayaConfig& c, int64_t tokens, int64_t seq);

// Mean number of keys a query attends to in a causal sequence of length `seq` (window 0: none).
// Full causal attention uses seq/2, matching DESIGN.md's 6·S·Hq·d.
double mean_keys(int64_t seq, int64_t window);
// Training model FLOPs per token: 6 × matmul_active_with_head + Σ_layers 6 · keys·2 · Hq · d
// (= 6·S·Hq·d per full-attention layer).
double train_flops_per_token(const ZayaConfig& c, int64_t seq);
// Forward FLOPs split: attention (projections, convs, scores) vs MoE (router, experts) vs LM head.
struct FlopSplit {
  double attention_proj = 0, attention_core = 0, moe = 0, head = 0;
  double total() const { return attention_proj + attention_core + moe + head; }
};
FlopSplit forward_flop_split(const ZayaConfig& c, int64_t seq);  // per token

// Activation bytes one token keeps per layer for backward (itemised in model_shape.cpp), the
// LM-head/loss bytes per token, and the micro-batch totals with and without full per-layer
// recomputation (recompute keeps each layer's fp32 input plus one layer's full set).
int64_t activation_bytes_per_token_layer(const ZayaConfig& c);
int64_t head_activation_bytes_per_token(const ZayaConfig& c);
double activation_bytes(const ZayaConfig& c, int64_t tokens, bool recompute);
// Context parallelism over `cp` ranks: the keys and values of the other ranks' chunks that each
// rank gathers (bf16, every layer's kept for backward; one layer's with recomputation).
double context_parallel_kv_bytes(const ZayaConfig& c, int64_t micro_batch, int64_t seq, int cp,
                                 bool recompute);

enum class OptimizerKind { Muon, AdamW };
const char* optimizer_name(OptimizerKind o);

// Per-GPU training memory under ZeRO-1 over `ranks` data-parallel ranks: bf16 weights and gradients
// are replicated, fp32 master weights and optimizer states are sharded. Muon keeps one momentum
// per matrix element (and AdamW's two states for the rest); AdamW keeps two everywhere.
struct MemoryPlan {
  double weights = 0, grads = 0, master = 0, optimizer = 0;
  double activations = 0, activations_recompute = 0;
  double static_bytes() const { return weights + grads + master + optimizer; }
  double total(bool recompute) const {
    return static_bytes() + (recompute ? activations_recompute : activations);
  }
};
MemoryPlan memory_plan(const ZayaConfig& c, int ranks, int64_t micro_tokens, OptimizerKind opt,
                       int grad_bytes);

// KV cache per token over all layers in bf16: CCA keeps K and V of the Hkv compressed heads.
int64_t kv_bytes_per_token(const ZayaConfig& c);
// The same model with standard multi-head attention (D/d heads of K and V).
int64_t mha_kv_bytes_per_token(const ZayaConfig& c);

// Expected number of distinct experts that `tokens` tokens touch with top-k of E routing spread
// uniformly: E·(1 − (1 − k/E)^tokens).
double experts_touched(int64_t experts, int64_t top_k, int64_t tokens);

}  // namespace zaya::sizing
