#!/usr/bin/env python3
"""An independent reader/writer of Megatron-LM "MMIDIDX" indexed datasets, for tests.

Written from the format as Megatron-LM's megatron/core/datasets/indexed_dataset.py lays it out
(_IndexWriter/_IndexReader), using only the standard library (struct), so zaya's C++ reader and
writer are checked against a second implementation rather than against themselves. Also holds a
transcription of Megatron's build_blending_indices (helpers.cpp) for the blend test.

  megatron_idx.py write PREFIX SEED CODES NUM_DOCS   for each dtype code in the comma-separated
                                                     CODES writes PREFIX_<code>.bin/.idx; prints
                                                     {code: dataset} as JSON
  megatron_idx.py read PREFIX...                      prints the datasets as a JSON list
  megatron_idx.py blend "W1,W2,...;W1,..." N          prints Megatron's choices for each blend
"""
import json
import struct
import sys

HEADER = b"MMIDIDX\x00\x00"
# Megatron's DType codes -> struct format letters (float codes are not token types).
FORMATS = {1: "B", 2: "b", 3: "h", 4: "i", 5: "q", 8: "H"}
RANGES = {1: (0, 255), 2: (-128, 127), 3: (-32768, 32767), 4: (0, 2**31 - 1), 5: (0, 2**40),
          8: (0, 65535)}


def lcg(seed):
    state = (seed * 6364136223846793005 + 1442695040888963407) % 2**64
    while True:
        state = (state * 6364136223846793005 + 1442695040888963407) % 2**64
        yield state >> 33


def write(prefix, seed, code, num_docs):
    fmt = FORMATS[code]
    size = struct.calcsize(fmt)
    lo, hi = RANGES[code]
    rnd = lcg(seed)
    sequences, document_indices = [], [0]
    for _ in range(num_docs):
        # Some documents hold several sequences (Megatron's sentence-split layout), some are empty.
        for _ in range(1 + next(rnd) % 3):
            n = next(rnd) % 40
            sequences.append([lo + next(rnd) % (hi - lo + 1) for _ in range(n)])
        document_indices.append(len(sequences))
    with open(prefix + ".bin", "wb") as f:
        for s in sequences:
            f.write(struct.pack("<%d%s" % (len(s), fmt), *s))
    pointers, p = [], 0
    for s in sequences:
        pointers.append(p)
        p += len(s) * size
    with open(prefix + ".idx", "wb") as f:
        f.write(HEADER)
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", code))
        f.write(struct.pack("<Q", len(sequences)))
        f.write(struct.pack("<Q", len(document_indices)))
        f.write(struct.pack("<%di" % len(sequences), *[len(s) for s in sequences]))
        f.write(struct.pack("<%dq" % len(sequences), *pointers))
        f.write(struct.pack("<%dq" % len(document_indices), *document_indices))
    return {"dtype": code, "sequences": sequences, "document_indices": document_indices}


def read(prefix):
    with open(prefix + ".idx", "rb") as f:
        idx = f.read()
    assert idx[:9] == HEADER, "bad header"
    (version,) = struct.unpack_from("<Q", idx, 9)
    assert version == 1, "bad version"
    (code,) = struct.unpack_from("<B", idx, 17)
    seq_count, doc_count = struct.unpack_from("<QQ", idx, 18)
    off = 34
    lengths = list(struct.unpack_from("<%di" % seq_count, idx, off))
    off += 4 * seq_count
    pointers = list(struct.unpack_from("<%dq" % seq_count, idx, off))
    off += 8 * seq_count
    document_indices = list(struct.unpack_from("<%dq" % doc_count, idx, off))
    off += 8 * doc_count
    assert off == len(idx), "trailing bytes in index"
    with open(prefix + ".bin", "rb") as f:
        data = f.read()
    fmt = FORMATS[code]
    sequences = [list(struct.unpack_from("<%d%s" % (n, fmt), data, p))
                 for n, p in zip(lengths, pointers)]
    return {"dtype": code, "sequence_lengths": lengths, "sequence_pointers": pointers,
            "document_indices": document_indices, "sequences": sequences}


def blend(weights, size):
    # megatron/core/datasets/helpers.cpp: build_blending_indices
    total = sum(weights)
    weights = [w / total for w in weights]
    current = [0] * len(weights)
    out = []
    for sample_idx in range(size):
        x = max(float(sample_idx), 1.0)
        best, best_err = 0, weights[0] * x - current[0]
        for i in range(1, len(weights)):
            err = weights[i] * x - current[i]
            if err > best_err:
                best, best_err = i, err
        out.append(best)
        current[best] += 1
    return out


def main(argv):
    # Several datasets per call: python start-up dominates these tests' run time.
    if argv[1] == "write":
        json.dump({c: write("%s_%s" % (argv[2], c), int(argv[3]) + int(c), int(c), int(argv[5]))
                   for c in argv[4].split(",")}, sys.stdout)
    elif argv[1] == "read":
        json.dump([read(p) for p in argv[2:]], sys.stdout)
    elif argv[1] == "blend":
        json.dump([blend([float(w) for w in spec.split(",")], int(argv[3]))
                   for spec in argv[2].split(";")], sys.stdout)
    else:
        raise SystemExit("unknown command " + argv[1])


if __name__ == "__main__":
    main(sys.argv)
