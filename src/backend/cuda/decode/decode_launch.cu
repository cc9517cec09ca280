// The launch side of the decode kernels (decode_kernels.h) that no kernel family owns: the
// DecodePolicy's programmatic dependent launch against what the device has, the decode trace's
// switch (each decode .cu holds its own copy of the trace constants; this sets them all) and the
// trace's event names.
#include <cstdlib>

#include "backend/cuda/decode/decode_common.cuh"

namespace zaya::cuda {

namespace detail {

bool pdl_on(const DecodePolicy& policy) {
  if (!policy.pdl) return false;
  // The device's capability, once per device (the first decode step runs eagerly, so a captured
  // step makes no such query).
  static int cached_dev = -1;
  static bool cached = false;
  int dev = 0;
  ZAYA_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev != cached_dev) {
    int major = 0;
    ZAYA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    cached = major >= 9;
    cached_dev = dev;
  }
  return cached;
}

#if ZAYA_DECODE_TRACE
// One setter per decode .cu (ZAYA_DECODE_TRACE_UNIT at its end).
void set_trace_attention(unsigned long long*, unsigned long long);
void set_trace_cca(unsigned long long*, unsigned long long);
void set_trace_experts(unsigned long long*, unsigned long long);
void set_trace_gemv(unsigned long long*, unsigned long long);
void set_trace_head(unsigned long long*, unsigned long long);
void set_trace_norms(unsigned long long*, unsigned long long);
void set_trace_router(unsigned long long*, unsigned long long);
#endif

}  // namespace detail

DecodePolicy decode_policy_from_environment() {
  DecodePolicy p;
  if (const char* e = std::getenv("ZAYA_DECODE_PDL")) p.pdl = !(e[0] == '0' && e[1] == '\0');
  return p;
}

bool decode_pdl_active(const DecodePolicy& policy) {
  return detail::pdl_on(policy);
}

bool decode_trace_built() {
  return ZAYA_DECODE_TRACE != 0;
}

void set_decode_trace(unsigned long long* buf, size_t capacity) {
#if ZAYA_DECODE_TRACE
  const unsigned long long cap = buf ? capacity : 0;
  for (auto* set : {detail::set_trace_attention, detail::set_trace_cca, detail::set_trace_experts,
                    detail::set_trace_gemv, detail::set_trace_head, detail::set_trace_norms,
                    detail::set_trace_router})
    set(buf, cap);
#else
  (void)capacity;
  check(buf == nullptr,
        "decode trace: this build has no decode tracing (configure with -DZAYA_DECODE_TRACE=ON; "
        "it stays out of the default build, whose kernels it would slow)");
#endif
}

const char* decode_trace_event_name(DecodeTraceEvent ev) {
  switch (ev) {
    case DecodeTraceEvent::Gemv: return "gemv";
    case DecodeTraceEvent::GemvF32: return "gemv_f32";
    case DecodeTraceEvent::ExpertSwiglu: return "expert_swiglu";
    case DecodeTraceEvent::ExpertDown: return "expert_down";
    case DecodeTraceEvent::ExpertActDone: return "expert_act_done";
    case DecodeTraceEvent::CcaConv: return "cca_conv";
    case DecodeTraceEvent::CcaFinish: return "cca_finish";
    case DecodeTraceEvent::Attention: return "attention";
    case DecodeTraceEvent::AttnScores: return "attn_scores";
    case DecodeTraceEvent::AttnPV: return "attn_pv";
    case DecodeTraceEvent::AttnPartials: return "attn_partials";
    case DecodeTraceEvent::AttnCombine: return "attn_combine";
    case DecodeTraceEvent::Norm: return "residual_norm";
    case DecodeTraceEvent::Router: return "router";
    case DecodeTraceEvent::RouterSums: return "router_sums";
    case DecodeTraceEvent::RouterDown: return "router_down";
    case DecodeTraceEvent::RouterFc1: return "router_fc1";
    case DecodeTraceEvent::RouterFc2: return "router_fc2";
    case DecodeTraceEvent::RouterLogits: return "router_logits";
    case DecodeTraceEvent::RouterSelect: return "router_select";
    case DecodeTraceEvent::Argmax: return "argmax";
    case DecodeTraceEvent::ArgmaxFinal: return "argmax_final";
    case DecodeTraceEvent::Advance: return "advance";
    case DecodeTraceEvent::Count: break;
  }
  return "?";
}

}  // namespace zaya::cuda
