// DataParallelStep: data parallelism with ZeRO-1 over any TrainStep and a Communicator. Every rank
// holds a full model replica and runs the same loop on its own micro-batches; the step adds the
// collectives between the inner step's stages (train_step.h):
//   1. the fp32 gradients are reduce-scattered bucket by bucket, in place: the inner step keeps
//      its flat buffers in the plan's layout (dist/zero1.h), so a bucket is a range of them and
//      no bytes are packed or unpacked; each rank then holds the fully reduced gradients of the
//      tensors it owns. With overlap (the
//      default) and begin_accumulation(n) called after zero_grads, the last micro-batch's backward
//      starts each bucket as soon as the layers it holds are done (the inner step's
//      LayerGradsReady; buckets in the order the backward completes them, the same on every
//      rank): on NCCL the reduce-scatter runs on the communicator's stream,
//      ordered after the step's stream by an event, while the backward goes on; on MPI (blocking)
//      they run between layers. The rest go after the backward (the first grad_sq_norm or
//      optimizer_step of the step). Either way every bucket is reduced once, so the results are
//      the same bits;
//   2. grad_sq_norm returns the global Σg² (each rank's owned part, all-reduced), so clipping and
//      the NaN/Inf decision are the same on every rank;
//   3. optimizer_step updates the owned tensors only (the inner step keeps optimizer state only for
//      them) and all-gathers the updated masters, then weights_changed() refreshes device copies.
//      With overlap on NCCL and a step that tells when its forward needs each layer (the CUDA
//      step, TrainStep::set_weights_needed), the all-gather is only issued here, buckets in the
//      order the forward reads them, and the next forward waits layer by layer (the step's stream
//      waits for the communicator's mark after that layer's buckets; the layer's bf16 copies are
//      refreshed then); anything else that reads the weights first (evaluation, checkpoints,
//      state, sync) waits for all of it. The bytes are the same either way.
// Ownership is by whole matrix (dist/zero1.h): a 3-D Muon expert tensor (and a big AdamW tensor)
// may be split into dim-0 slices between ranks (the CPU and CUDA steps keep and update just
// their slice). Each Muon matrix is orthogonalised exactly once
// per step, by its owner, from its fully reduced gradient. The loss scale of forward_backward must
// already include 1/ranks (the caller averages over the global batch); the gradients are summed.
// The routed counts given to update_balancing must be summed over ranks by the caller.
//
// Buffers: CPU steps reduce their host buffers directly over MPI. GPU steps use NCCL on device
// buffers, or (an MPI communicator) host-staged MPI through page-locked mirrors of the flat
// buffers (the whole gradients copied out, this rank's sums back; this rank's masters out, the
// gathered ones back), which also lets several ranks share one GPU.
// Checkpoints use owned_state() (each rank's own pieces, written by that rank) and
// load_state_from() (each rank reads the pieces it owns now). state() is collective and gathers
// every owner's optimizer state as whole tensors on rank 0 (the other ranks get an empty list), for
// comparisons against one process; load_state keeps each rank's own part of whole tensors.
// Deliberately not here: overlap on the host-staged path and on CPU ranks (MPI collectives are
// blocking), and element-sharded AdamW tensors.
#pragma once
#include <memory>
#include <string>

#include "dist/comm.h"
#include "dist/zero1.h"
#include "engine/train_step.h"

namespace zaya {

// Per-rank memory of a data-parallel step, in bytes (host or device, where the step keeps it).
// masters and grads are the flat buffers, padding (each) the part of them between tensors that
// the layout's buckets need (dist/zero1.h); the collectives need no buffers of their own.
struct DataParallelMemory {
  int64_t masters = 0, grads = 0, padding = 0, optimizer_state = 0, staging = 0;
};

// Wall-clock milliseconds of the last step's data-parallel stages on this rank (each ends
// synchronised): the gradient reduce-scatter (the collectives, and the host staging copies when
// there are any), the inner optimizer update of the owned tensors, and the weight all-gather
// (the collectives and staging copies; weights_changed() is issued, not waited
// for: on the GPU its refresh of the bf16 copies lands in the next forward's time). reduce_scatter
// counts the time spent in the backward's bucket starts too; buckets_in_backward is how many
// buckets the last step started inside its backward (overlap).
struct DataParallelTimes {
  double reduce_scatter = 0, update = 0, all_gather = 0;
  // With the all-gather overlapped (NCCL): all_gather is the time to issue it, and this the
  // host's wait for it at the end of the next forward's layer gates (of the step before).
  double all_gather_wait = 0;
  int64_t buckets_in_backward = 0;
};

class DataParallelStep : public TrainStep {
 public:
  virtual const Zero1Plan& plan() const = 0;
  virtual const std::vector<Zero1Item>& items() const = 0;
  virtual DataParallelMemory memory() const = 0;
  // Collective reductions the step performed (reduce-scatter buckets, all-gather buckets).
  virtual int64_t reduce_scatters() const = 0;
  virtual const DataParallelTimes& last_times() const = 0;
};

// `comm` carries the gradients and weights (MPI: host buffers; NCCL: the rank's GPU); `host`
// is an MPI communicator over the same ranks for host-side reductions and the state gather (it
// may be `comm` itself when that is MPI). bucket_elems: fp32 elements per rank per bucket.
// overlap: start buckets during the last micro-batch's backward (see above).
std::unique_ptr<DataParallelStep> make_data_parallel_step(
    ZayaModel& model, const OptimizerSettings& optim, const BalancingSettings& balancing,
    TrainStepOptions options, Communicator& comm, Communicator& host, int64_t bucket_elems,
    bool overlap = true);

// The ZeRO-1 items (name, shape, optimizer) of a model under these optimizer settings.
std::vector<Zero1Item> zero1_items(ZayaModel& model, const OptimizerSettings& optim);

}  // namespace zaya
