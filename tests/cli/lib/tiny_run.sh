# Shared by the data-parallel script tests (tests/cli/train_*.sh, tools/device/dp_check.sh): the
# tiny training run they launch under mpirun. Source it, then:
#   mpi_script_setup                  (see below)
#   tiny_run_data PREFIX SRC          bytes-tokenised README.md + docs/TRAINING.md of SRC at PREFIX
#   tiny_run_toml PREFIX STEPS SHORT [CKPT_EVERY [DEVICE [EVAL_EVERY [EVAL_BATCHES]]]] > run.toml
# The run: the tiny preset, two phases (SHORT steps at seq_len 24, then 32) with a global batch of
# 12 sequences (micro_batch 1, so 1, 2, 3, 4 and 6 ranks all divide it), a checkpoint every
# CKPT_EVERY steps (0: only at the end), evaluation every EVAL_EVERY steps (0: none).
# mpi_script_setup: the common start of an MPI script test (needs $zaya): exits 0 with SKIP when
# the build or the machine has no MPI; allows mpirun as root and oversubscription; makes the
# temporary directory $T (removed at exit) and fail().
mpi_script_setup() {
  if ! "$zaya" version | grep -q "mpi: yes"; then echo "SKIP: zaya built without MPI"; exit 0; fi
  if ! command -v mpirun >/dev/null; then echo "SKIP: no mpirun"; exit 0; fi
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
  T="$(mktemp -d)"
  trap 'rm -rf "$T"' EXIT
  fail() { echo "FAIL: $*"; exit 1; }
}
tiny_run_data() {
  "$zaya" data prepare --input "$2/README.md" "$2/docs/TRAINING.md" --output-prefix "$1" \
    --tokenizer bytes > "$1.prep.log" 2>&1 || { cat "$1.prep.log"; return 1; }
}
tiny_run_toml() {
  cat <<EOT
[model]
config = "tiny"
[data]
tokenizer = "bytes"
[[data.blend]]
prefix = "$1"
[eval]
every = ${6:-0}
batches = ${7:-8}
[checkpoint]
every = ${4:-0}
keep_last = 3
[schedule]
warmup_steps = 5
[train]
device = "${5:-cpu}"
micro_batch = 1
seq_len = 32
steps = $2
log_every = 10
[[phase]]
name = "short"
steps = $3
seq_len = 24
batch_size = 12
[[phase]]
name = "long"
seq_len = 32
batch_size = 12
EOT
}
