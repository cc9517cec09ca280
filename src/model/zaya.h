// The ZAYA1 model (ZAYA1.md §3): weights under their Hugging Face names, the forward pass on the
// CPU reference ops and incremental decoding with the CCA state. Reading and writing checkpoints
// (the `transformers` layout and the original release layout) is ckpt/model_io.h's.
//
// Weights stay in their stored dtype (bf16 for released checkpoints, memory-mapped, no copy); the
// small vectors (norms, biases, scales, temperatures, conv filters) are widened to fp32 on load.
// Freshly initialised models (for training) hold fp32 master weights.
//
// Legend: B batch, S sequence, N = B*S tokens, D hidden, Hq/Hkv heads, d head dim, C conv channels,
// R router width, E experts, I expert width, V vocab, P = (t0-1)+(t1-1) conv history length.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace zaya {

struct ResidualScaleWeights {
  Tensor hs, hb, rs, rb;  // hidden_states_scale, hidden_states_bias, residual_scale, residual_bias
};

struct LayerWeights {
  Tensor ln_in, ln_post;                            // [D]
  Tensor wq, wk, wv_cur, wv_del, wo;                // [Hq*d,D] [Hkv*d,D] [Hkv*d/2,D] x2 [D,Hq*d]
  Tensor conv_dw_w, conv_dw_b, conv_g_w, conv_g_b;  // [C,1,t0] [C] [C,d,t1] [C]
  Tensor temp;                                      // [Hkv]
  ResidualScaleWeights post_attn, post_mlp;
  Tensor r_down_w, r_down_b, r_states_scale;  // [R,D] [R] [R] (no states scale in layer 0)
  Tensor r_norm, r_fc1_w, r_fc1_b, r_fc2_w, r_fc2_b, r_out_w;  // [R] [R,R] [R] [R,R] [R] [E+1,R]
  Tensor balancing_bias;                                       // [E+1], fp32 buffer
  Tensor experts_gate_up, experts_down;                        // [E,2I,D] [E,D,I]
};

// Per-layer state for incremental decoding.
struct LayerCache {
  std::vector<float> k, v;        // [B, capacity, Hkv, d] post-norm, post-temperature, post-RoPE
  std::vector<float> conv_hist;   // [B, P, C] the last P pre-convolution [q0 | k0] columns
  std::vector<float> v_del_last;  // [B, Hkv*d/2]: Wv_del x of the last token
};

struct InferenceCache {
  int64_t batch = 0, capacity = 0, length = 0;  // length = tokens already processed
  std::vector<LayerCache> layers;
};

// Routing decisions of one forward pass, per layer: choice[n] in 0..E (E = skip).
struct RoutingRecord {
  std::vector<std::vector<int32_t>> choice;
};

class ZayaModel {
 public:
  ZayaConfig cfg;
  Tensor embed;                    // [V, D] (tied LM head)
  Tensor input_scale, input_bias;  // [D]
  Tensor final_norm;               // [D]
  std::vector<LayerWeights> layers;

  // Random initialisation for training (fp32): normal(0, init_std) matrices, ones for norms and
  // scales, zeros for biases, temperature 1, skip balancing bias -1.
  static ZayaModel init(const ZayaConfig& cfg, uint64_t seed, float init_std = 0.02f);
  // Every tensor under its `transformers` name (lm_head omitted: tied).
  std::vector<std::pair<std::string, Tensor>> named_tensors() const;
  // The same names with the model's own tensor slots, in the same order, for code that fills or
  // replaces the weights (loading a checkpoint, taking owned copies).
  std::vector<std::pair<std::string, Tensor*>> tensor_slots();

  // Full forward pass over ids [B,S]. Returns logits [B, S, V] for all positions when
  // `all_logits`, else for the last position only [B, 1, V].
  Tensor forward(const std::vector<int32_t>& ids, int64_t B, int64_t S, bool all_logits = true,
                 InferenceCache* cache = nullptr, RoutingRecord* routing = nullptr) const;
  // Mean next-token cross-entropy over ids [B,S] (targets are ids shifted by one).
  double loss(const std::vector<int32_t>& ids, int64_t B, int64_t S) const;

  InferenceCache new_cache(int64_t batch, int64_t capacity) const;

 private:
  void attention_forward(int64_t li, const float* x, float* out, int64_t B, int64_t S,
                         InferenceCache* cache) const;
  void moe_forward(int64_t li, const float* x, float* out, std::vector<float>& router_state,
                   int64_t N, std::vector<int32_t>* choices) const;
};

// The shape of every named tensor of a model with config `c`, from the config alone: in
// named_tensors() order, and by name.
std::vector<std::pair<std::string, Shape>> tensor_shapes_in_order(const ZayaConfig& c);
std::map<std::string, Shape> expected_tensor_shapes(const ZayaConfig& c);
// Whether a tensor continues the packed qkv matrix that q_proj starts (k_proj, v_proj_current,
// v_proj_delayed: the CUDA step multiplies the four as one matrix, so they sit back to back in
// its buffers).
bool continues_packed_qkv(const std::string& name);
// Whether the tensor `name` of shape `sh` is a weight matrix (kept in its stored dtype when
// loaded) rather than a vector or convolution filter (widened to fp32).
bool is_matrix_tensor(const std::string& name, const Shape& sh);

}  // namespace zaya
