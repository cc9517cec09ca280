#!/usr/bin/env python3
"""Checks the include layering of src/: a folder may include its own headers and those of folders on
lower levels only; folders on one level do not include each other. Every quoted include names its
folder ("core/tensor.h"). Prints each violation as file:line and exits 1 when there is any.

usage: check_layers.py [SRC_DIR]   (default: the src/ next to this script's tools/)
"""
import pathlib
import re
import sys

# The levels, lowest first (docs/ARCHITECTURE.md explains them).
LEVELS = [
    ["core"],
    ["backend"],
    ["io", "data", "dist"],
    ["model", "optim"],
    ["ckpt", "sizing"],
    ["engine"],
    ["train", "bench"],
    ["ft"],
    ["cli"],
]
LEVEL = {folder: i for i, folders in enumerate(LEVELS) for folder in folders}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SUFFIXES = {".h", ".hpp", ".cpp", ".cu", ".cuh"}


def check(src: pathlib.Path) -> list[str]:
    problems = []
    for path in sorted(p for p in src.rglob("*") if p.suffix in SUFFIXES and p.is_file()):
        rel = path.relative_to(src)
        folder = rel.parts[0] if len(rel.parts) > 1 else ""
        if folder not in LEVEL:
            problems.append(f"{src / rel}: the folder '{folder}' has no level in tools/check_layers.py")
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            target = m.group(1).split("/")[0]
            where = f"{src / rel}:{n}: #include \"{m.group(1)}\""
            if target not in LEVEL:
                problems.append(f"{where}: quoted includes name a folder of src/ (one of {', '.join(LEVEL)})")
            elif target != folder and LEVEL[target] >= LEVEL[folder]:
                rel_word = "the same level as" if LEVEL[target] == LEVEL[folder] else "a level above"
                problems.append(f"{where}: {target}/ is on {rel_word} {folder}/")
    return problems


def main() -> int:
    src = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[1] / "src"
    if not src.is_dir():
        print(f"check_layers: {src} is not a directory", file=sys.stderr)
        return 2
    problems = check(src)
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} include(s) break the layering", file=sys.stderr)
        return 1
    print(f"check_layers: {src} follows the layering")
    return 0


if __name__ == "__main__":
    sys.exit(main())
