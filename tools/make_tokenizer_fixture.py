#!/usr/bin/env python3
"""Encodes the texts of tests/fixtures/tokenizer/cases.json with Hugging Face `tokenizers` (the
reference implementation) and writes the expected ids and decodings next to them.
    python3 tools/make_tokenizer_fixture.py TOKENIZER_JSON tests/fixtures/tokenizer
"""
import json, sys, tokenizers

tok = tokenizers.Tokenizer.from_file(sys.argv[1])
d = sys.argv[2]
cases = json.load(open(f"{d}/cases.json"))
out = []
for text in cases:
    plain = tok.encode(text, add_special_tokens=False).ids
    withsp = tok.encode(text, add_special_tokens=True).ids
    out.append({"text": text, "ids": plain, "ids_with_special": withsp,
                "decoded": tok.decode(plain, skip_special_tokens=False)})
json.dump({"tokenizers_version": tokenizers.__version__, "cases": out},
          open(f"{d}/expected.json", "w"), ensure_ascii=False, indent=0)
print(len(out), "cases")
