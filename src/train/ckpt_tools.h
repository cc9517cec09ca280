// Offline checkpoint tools that need the run config stored in trainer.json: reshaping a checkpoint
// for another number of ranks (`zaya ckpt reshard`), and the tokenizer of the run that wrote one
// (the default of `zaya ckpt export-hf`).
//
// Reshaping writes the checkpoint M ranks would have written at the same step: the ZeRO-1 plan
// for M (the run's optimizer settings, with the dim-0 slices the trainer plans on either device),
// then for each virtual rank r the weights it writes and the state
// pieces it owns (dist/zero1.h's weight_writers and owned_state_pieces, the functions the training
// step itself uses), read from the source at any world size (ShardedState::read), written through
// the same files and background writer as a training save, a manifest last, and trainer.json with
// world = M and a new save id. The output is staged and renamed into place. A resumed run reads a
// reshaped checkpoint exactly as it reads the original (each rank's boxes are the same bytes), but
// from only its own file.
//
// Deliberately not here: changing anything but the layout (the step, data cursor and config stay),
// and memory bounds below one rank's state: rank r's pieces are in memory while its files are
// written.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/async_writer.h"

namespace zaya {

struct ReshardOptions {
  int64_t ranks = 0;   // M >= 1
  bool force = false;  // replace an existing OUT (once the new one is complete)
};

struct ReshardResult {
  std::string dir, save_id;
  int64_t from_world = 0, to_world = 0, step = 0;
  std::vector<WrittenFile> files;
  uint64_t bytes = 0;
};

// Reshapes checkpoint `src` (fully verified first) into `out`. Errors name the file or field: an
// invalid source, M < 1 or above 99999 (the file names' five digits), an M that a phase's global
// batch does not divide (the run could not resume at M ranks), state that does not fit the
// model's ZeRO-1 items, an existing `out` without force.
ReshardResult reshard_checkpoint(const std::string& src, const std::string& out,
                                 const ReshardOptions& options);

// data.tokenizer of the run config stored in checkpoint `dir`'s trainer.json: "bytes" or a path.
// Returns "" (and the reason in *why) when the checkpoint names none or the file is gone.
std::string checkpoint_tokenizer(const std::string& dir, std::string* why);

}  // namespace zaya
