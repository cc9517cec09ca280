#!/bin/bash
# tools/gemm_kernels.py on a synthetic cublasLt.h and two synthetic runs: the kept algorithm's enum
# values are named from the header, the peer's nvjet kernel name is read for its tile and cluster,
# and each shape gets its verdict (the same kernel, the same with M and N swapped, or not).
# Usage: bash gemm_kernels.sh <zaya-binary> <source-dir>
set -u
SRC="$2"
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
cat >"$T/cublasLt.h" <<'H'
typedef enum {
  CUBLASLT_MATMUL_TILE_UNDEFINED = 0,
  CUBLASLT_MATMUL_TILE_128x64 = 18,
  CUBLASLT_MATMUL_TILE_192x192 = 209,
  CUBLASLT_MATMUL_TILE_24x64 = 400,
  CUBLASLT_MATMUL_TILE_END
} cublasLtMatmulTile_t;
typedef enum {
  CUBLASLT_MATMUL_STAGES_64xAUTO = 35,
} cublasLtMatmulStages_t;
typedef enum {
  CUBLASLT_CLUSTER_SHAPE_2x1x1 = 3,
  CUBLASLT_CLUSTER_SHAPE_1x2x1 = 5,
  CUBLASLT_CLUSTER_SHAPE_4x2x1 = 7,
} cublasLtClusterShape_t;
H
python3 - "$T" <<'PY' || fail "could not write the synthetic runs"
import json, sys
T = sys.argv[1]
def z(m, tile, cluster):
    return {"name": "s", "m": m, "n": m, "k": 4096, "groups": 1, "dtype": "bf16", "method": "lt",
            "algo_fields": {"id": 66, "tile": tile, "stages": 35, "cluster_shape": cluster}}
rows = [z(1024, 18, 5), z(2048, 209, 7), z(384, 400, 7),
        {"name": "cb", "m": 512, "n": 512, "k": 512, "groups": 1, "dtype": "bf16",
         "method": "cublas"}]
json.dump({"results": rows}, open(f"{T}/z.json", "w"))
peer = [
    {"m": 1024, "n": 1024, "k": 4096, "groups": 1, "dtype": "bf16",
     "kernels": ["nvjet_sm90_tst_128x64_64x8_1x2_h_bz_TNT"]},
    {"m": 2048, "n": 2048, "k": 4096, "groups": 1, "dtype": "bf16",
     "kernels": ["Memset (Device)", "nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_TNN"]},
    {"m": 384, "n": 384, "k": 4096, "groups": 1, "dtype": "bf16",
     "kernels": ["nvjet_sm90_tst_64x24_64x16_2x4_h_bz_TNT"]},
]
json.dump({"gemm": peer}, open(f"{T}/p.json", "w"))
PY
out="$(python3 "$SRC/tools/gemm_kernels.py" "$T/z.json" "$T/p.json" --header "$T/cublasLt.h")" ||
  fail "gemm_kernels.py exited non-zero"
row() { echo "$out" | grep "^bf16  $1x" || fail "no row for $1: $out"; }
[ "$(row 1024 | awk '{print $3, $4, $5, $6, $7, $8, $9}')" = "128x64 1x2 64xAUTO 128x64 1x2 8 yes" ] ||
  fail "1024: $(row 1024)"
[ "$(row 2048 | awk '{print $3, $4, $6, $7, $9}')" = "192x192 4x2 192x192 2x1 no" ] ||
  fail "2048 (cluster differs): $(row 2048)"
[ "$(row 384 | awk '{print $3, $4, $6, $7, $9}')" = "24x64 4x2 64x24 2x4 swap" ] ||
  fail "384 (transposed): $(row 384)"
echo "$out" | grep -q "Memset" && fail "memsets listed as kernels: $out"
echo "$out" | grep -q "^# 2 of 3 shapes" || fail "count: $out"
# An unreadable input is an error naming the file.
err="$(python3 "$SRC/tools/gemm_kernels.py" "$T/none.json" "$T/p.json" --header "$T/cublasLt.h" 2>&1)" &&
  fail "missing input accepted"
echo "$err" | grep -q "none.json" || fail "error does not name the file: $err"
echo "PASS"
