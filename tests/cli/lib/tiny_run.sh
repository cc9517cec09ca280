# Shared by the data-parallel script tests (tests/cli/train_*.sh, tools/device/dp_check.sh): the
# tiny training run they launch under mpirun. Source it, then:
#   tiny_run_data PREFIX SRC          bytes-tokenised README.md + docs/TRAINING.md of SRC at PREFIX
#   tiny_run_toml PREFIX STEPS SHORT [CKPT_EVERY [DEVICE [EVAL_EVERY [EVAL_BATCHES]]]] > run.toml
# The run: the tiny preset, two phases (SHORT steps at seq_len 24, then 32) with a global batch of
# 12 sequences (micro_batch 1, so 1, 2, 3, 4 and 6 ranks all divide it), a checkpoint every
# CKPT_EVERY steps (0: only at the end), evaluation every EVAL_EVERY steps (0: none).
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
