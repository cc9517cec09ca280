# Checkpoint checks on the GPU, sourced by tools/device/ab_step.sh as its EXTRA script (it sets Z,
# LOGS, note() and has trained ab-run-new, 30 tiny steps on the GPU):
#     EXTRA=tools/device/ckpt_gpu.sh PREBUILT=build-pack/ab.tgz bash tools/device/ab_step.sh
# 1. `zaya bench ckpt --device cuda --preset zaya1-base --layers 8`, the snapshot in GPU memory and
#    in page-locked host memory: the loop's stall per save (p50/p99) and the writer's bandwidth
#    against the disk's;
# 2. the GPU run's checkpoint exported with `zaya ckpt export-hf --dtype fp32`, loaded by
#    transformers (tools/device/export_check.py) and by zaya: cross-entropy on 300 tokens and the
#    greedy continuations side by side;
# 3. `zaya ckpt reshard` of that checkpoint to 2 ranks, verified.
# CKPT_EXPORT=0 runs step 1 only; CKPT_TIMEOUT (default 240 s) bounds each benchmark run and
# CKPT_SNAPSHOTS (default "device host") picks the snapshot kinds.
for snap in ${CKPT_SNAPSHOTS:-device host}; do
  log="$LOGS/bench_ckpt_$snap.log"
  timeout -k 5 "${CKPT_TIMEOUT:-240}" "$Z" bench ckpt --device cuda --preset zaya1-base --layers 8 --saves 3 \
    --snapshot "$snap" --dir /tmp/zaya-bench-ckpt --json "$LOGS/bench_ckpt_$snap.json" >"$log" 2>&1
  note "bench ckpt cuda, 8 layers, snapshot $snap: exit $? | $(grep -iE "snapshot|stall|MiB/s|GiB|%" "$log" | tr '\n' ' ' | cut -c1-500)"
done
# CKPT_EXPORT=0: the benchmark only (a short call).
[ "${CKPT_EXPORT:-1}" = 1 ] || return 0
exp=/tmp/ab-export
rm -rf "$exp"
"$Z" ckpt export-hf ab-run-new --out "$exp" --dtype fp32 >"$LOGS/export.log" 2>&1
note "export-hf of the GPU run: exit $?"
# The first 300 bytes of the README as token ids (the tiny run's bytes tokenizer).
head -c 300 README.md | od -An -tu1 | tr -s ' \n' ' ' >"$LOGS/export_ids.txt"
timeout -k 5 120 python3 tools/device/export_check.py "$exp" "$LOGS/export_ids.txt" 16 \
  >"$LOGS/export_tf.txt" 2>"$LOGS/export_tf.err"
note "transformers: exit $? $(tr '\n' ' ' <"$LOGS/export_tf.txt") $(tail -2 "$LOGS/export_tf.err" | tr '\n' ' ' | cut -c1-200)"
"$Z" eval --model "$exp" --ids-file "$LOGS/export_ids.txt" >"$LOGS/export_zaya.txt" 2>&1
"$Z" generate --model "$exp" --ids "$(cut -d' ' -f1-9 "$LOGS/export_ids.txt")" -n 16 --greedy \
  --print-ids >>"$LOGS/export_zaya.txt" 2>&1
note "zaya:         exit $? $(tr '\n' ' ' <"$LOGS/export_zaya.txt")"
rm -rf /tmp/ab-reshard
"$Z" ckpt reshard ab-run-new --ranks 2 --out /tmp/ab-reshard >"$LOGS/reshard.log" 2>&1
note "reshard to 2 ranks (cuda): exit $?; verify: $("$Z" ckpt verify /tmp/ab-reshard 2>&1 | tail -1)"
