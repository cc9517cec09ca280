// The classes of non-GEMM kernels the cost model prices with a measured (or default) efficiency:
// attention forward and backward (compute-bound, as a fraction of the bf16 peak) and the
// memory-bound groups of the training step (as a fraction of the device copy bandwidth). Each
// forward op of model_shape.h names its class; hardware profiles carry one efficiency table per
// class; `zaya bench kernels` measures them on the model's own CUDA kernels.
#pragma once
#include <string>

namespace zaya::sizing {

enum class KernelClass {
  None,          // GEMMs (their own measured table) and ops without a class
  AttentionFwd,  // flash attention forward: work = 4·T·keys·Hq·d FLOPs
  AttentionBwd,  // flash attention backward: work = 2.5 × the forward's FLOPs (FlashAttention's
                 // count: QKᵀ recomputed, dV, dP, dQ, dK)
  NormResidual,  // RMSNorms fused with the residual affines, forward and backward
  Elementwise,   // SwiGLU, expert dispatch/combine, router softmax
  Cca,           // CCA convolutions, QK-norm, RoPE and the delayed values
  Loss,          // the LM head's cross-entropy passes over the fp32 logits (and the final norm)
  Optimizer,     // the elementwise optimizer update and the gradient norm
};

inline constexpr KernelClass kKernelClasses[] = {
    KernelClass::AttentionFwd, KernelClass::AttentionBwd, KernelClass::NormResidual,
    KernelClass::Elementwise,  KernelClass::Cca,          KernelClass::Loss,
    KernelClass::Optimizer};

// "attention_fwd", "attention_bwd", "norm_residual", "elementwise", "cca", "loss", "optimizer"
// ("" for None).
const char* kernel_class_name(KernelClass c);
// The class of a name above; false when there is none.
bool kernel_class_from_name(const std::string& name, KernelClass* out);
// Attention classes are priced in FLOPs against the bf16 peak, the others in bytes against the
// copy bandwidth.
inline bool kernel_class_is_compute(KernelClass c) {
  return c == KernelClass::AttentionFwd || c == KernelClass::AttentionBwd;
}
// Backward FLOPs of flash attention per forward FLOP (FlashAttention-2/3 papers' convention).
inline constexpr double kAttentionBwdFlopFactor = 2.5;

}  // namespace zaya::sizing
