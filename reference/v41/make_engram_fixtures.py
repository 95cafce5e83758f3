#!/usr/bin/env python3
"""Engram fixtures for a C++ unit test (tests/fixtures/v41/engram/):

  token_map.safetensors  token_map I32 [129280]: compressed class of every id of the V4.1 tokenizer
                         (V4 tokenizer.json + tests/fixtures/v41/tokenizer_overlay.json), built as
                         spec §14.5 says; 99,092 classes.
  hashes.safetensors     the real hash geometry (layers [1, 14], 4-grams, 8 heads, engram_vocab_size
                         16e6, compressed vocab 99092, pad id 2) on N_SEQ seeded random sequences:
      ids        I32 [N_SEQ, SEQ_LEN]   token ids in [0, 129280)
      dead       U8  [N_SEQ, SEQ_LEN]   1 = DEAD (an image-span position), for 10% of the sequences
      last_ids   I32 [N_SEQ, 2, 24]     the 24 row ids of the LAST position, per Engram layer
      digest     I64 [N_SEQ]            FNV-1a-64 over the little-endian int64 row ids of every
                                        position of the sequence, in [position][layer][column] order
      primes     I64 [2, 24]            per layer, (n-gram, head) order
      offsets    I64 [2, 24]
      multipliers I64 [2, 4]
  manifest.json          provenance, constants, how to regenerate

Usage: make_engram_fixtures.py [--out tests/fixtures/v41/engram]
"""

import argparse
import datetime
import json
import os
import platform
import sys

import numpy as np
import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402
import engram as E  # noqa: E402
import write_tiny  # noqa: E402

N_SEQ = 10000
SEQ_LEN = 6
SEED = 20261206
FNV_OFFSET, FNV_PRIME, MASK = 0xCBF29CE484222325, 0x100000001B3, (1 << 64) - 1


def fnv1a64(data: bytes) -> int:
    h = FNV_OFFSET
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & MASK
    return h


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(write_tiny.REPO, "tests/fixtures/v41/engram"))
    args = ap.parse_args()
    from tokenizers import Tokenizer

    consts = E.self_test()
    tok_json = E.v41_tokenizer_json(write_tiny.V4_TOKENIZER, write_tiny.V41_OVERLAY)
    tm, n_classes, stats = E.build_token_map(Tokenizer.from_str(tok_json))
    # the class count does not hinge on the one renamed token: the V4 file alone gives the same
    tm_v4, n_v4, _ = E.build_token_map(Tokenizer.from_file(write_tiny.V4_TOKENIZER))
    hasher = E.EngramHasher(E.REAL, tm, n_classes)

    rng = np.random.default_rng(SEED)
    ids = rng.integers(0, tm.shape[0], size=(N_SEQ, SEQ_LEN), dtype=np.int64)
    # some sequences use the pad token and repeated ids, which the map must treat like any other
    ids[rng.random((N_SEQ, SEQ_LEN)) < 0.05] = 2
    dead = np.zeros((N_SEQ, SEQ_LEN), dtype=np.uint8)
    with_dead = rng.random(N_SEQ) < 0.10
    dead[with_dead, rng.integers(0, SEQ_LEN, size=int(with_dead.sum()))] = 1
    last = np.empty((N_SEQ, 2, 24), dtype=np.int64)
    digest = np.empty(N_SEQ, dtype=np.uint64)
    for s in range(N_SEQ):
        h = hasher.hash_ids(ids[s], dead[s])  # [SEQ_LEN, 2, 24]
        last[s] = h[-1]
        digest[s] = fnv1a64(h.astype("<i8").tobytes())
    assert last.max() < 2**31 and last.min() >= 0
    for li, rows in enumerate(hasher.rows):
        assert last[:, li].max() < rows

    os.makedirs(args.out, exist_ok=True)
    save_file({"token_map": torch.from_numpy(tm.astype(np.int32))}, os.path.join(args.out, "token_map.safetensors"))
    save_file(
        {
            "ids": torch.from_numpy(ids.astype(np.int32)),
            "dead": torch.from_numpy(dead),
            "last_ids": torch.from_numpy(last.astype(np.int32)),
            "digest": torch.from_numpy(digest.view(np.int64)),
            "primes": torch.from_numpy(hasher.flat_primes),
            "offsets": torch.from_numpy(hasher.offsets),
            "multipliers": torch.from_numpy(hasher.mult),
        },
        os.path.join(args.out, "hashes.safetensors"),
    )
    manifest = {
        "what": "DeepSeek-V4.1 Engram token map and n-gram hash ids from the independent oracle reference/v41/engram.py",
        "token_map": {
            "tokenizer": "tests/fixtures/tokenizer/deepseek-v4/tokenizer.json with tests/fixtures/v41/tokenizer_overlay.json applied "
            "(id 128799 -> <｜System｜>; pad <｜▁pad▁｜> is already id 2)",
            "v4_tokenizer_sha256": C.sha256_file(write_tiny.V4_TOKENIZER),
            "classes": n_classes,
            "classes_with_unmodified_v4_tokenizer": n_v4,
            "map_identical_with_unmodified_v4_tokenizer": bool(np.array_equal(tm, tm_v4)),
            "engram_compressed_vocab_size_released": 99092,
            **stats,
            "rule": "decode each id alone (skip_special_tokens=False); if the text holds U+FFFD the key is the raw token "
            "string, else NFKC -> NFD -> StripAccents -> Lowercase -> [ \\t\\r\\n]+ -> ' ' -> (a lone ' ' kept) Strip; an "
            "empty result keeps the decoded text; classes numbered in first-seen id order. No id maps to DEAD: DEAD (-1) "
            "only comes from an image-span mask at hash time.",
            "pad_class": int(tm[2]),
        },
        "hash": {
            "config": E.REAL,
            "third_party_constants_reproduced": consts,
            "sequences": N_SEQ,
            "sequence_length": SEQ_LEN,
            "seed": SEED,
            "generation": "numpy default_rng(seed): ids = integers(0, 129280, (N, 6)); 5% replaced by the pad id 2; "
            "10% of the sequences get one DEAD position",
            "semantics": "position p, shift s = 0..3: blocked_s = blocked_{s-1} or p < s or dead[p - s]; tok_s = pad class if "
            "blocked_s else map[ids[p - s]]; rolling = tok_0 * M[0]; n = 1..3: rolling ^= tok_n * M[n]; "
            "id[(n-1)*8 + h] = rolling mod primes[(n-1)*8 + h] + offsets[(n-1)*8 + h]",
            "digest": "FNV-1a-64 (offset 0xcbf29ce484222325, prime 0x100000001b3) over the row ids of all positions as "
            "little-endian int64, order [position][layer][column]; stored as the int64 with the same bits",
        },
        "regenerate": ".venv-ref/bin/python reference/v41/make_engram_fixtures.py (venv: reference/setup_venv.sh)",
        "versions": {"python": platform.python_version(), "numpy": np.__version__, "tokenizers": __import__("tokenizers").__version__, "torch": torch.__version__},
        "generated_at_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(json.dumps({"classes": n_classes, "classes_v4": n_v4, "out": args.out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
