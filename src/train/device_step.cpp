// make_cuda_step for a build without the CUDA backend: the one place that says so (the CUDA build
// defines it in device_step_cuda.cpp).
#include "train/device_step.h"

#include "core/error.h"

namespace zaya {

#if !defined(ZAYA_HAVE_CUDA)
void check_cuda_step_available(int) {
  fail(
      "train.device = \"cuda\": this zaya was built without CUDA (configure with -DZAYA_CUDA=ON "
      "on a machine with nvcc to get the GPU training path)");
}

std::unique_ptr<DeviceStep> make_cuda_step(const ZayaModel&, const OptimizerSettings&,
                                           const DeviceStepOptions& o) {
  check_cuda_step_available(o.device);
  return nullptr;  // not reached
}
#endif

}  // namespace zaya
