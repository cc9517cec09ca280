// How the decode kernels (decode_kernels.h) are launched: a value the inference engine holds and
// passes to every decode launch, in place of settings global to the process. Plain C++ (no CUDA
// headers), so that the engine's public header can carry one.
#pragma once

namespace zaya::cuda {

// Results are the same bits under every policy; only when kernels start changes.
struct DecodePolicy {
  // Programmatic dependent launch (sm_90 and later; ignored on older devices): every decode kernel
  // is launched so that it may start while the previous kernel of the stream finishes, loading its
  // weights, and waits on the device before it reads anything that kernel (or an earlier one)
  // wrote; captured into a graph the launches become programmatic edges. A graph keeps the policy
  // it was captured with.
  bool pdl = true;
};

// The default policy with the environment's say: ZAYA_DECODE_PDL=0 switches PDL off.
DecodePolicy decode_policy_from_environment();

}  // namespace zaya::cuda
