"""Engram n-gram hashing for DeepSeek-V4.1 (spec §14.5), written from the spec.

  token map   build_token_map(tokenizer): every id decoded alone, normalised
              NFKC -> NFD -> StripAccents -> Lowercase -> [ \\t\\r\\n]+ to " " -> Strip (a token that is
              exactly one space stays " "), keyed by the raw token string when the decode holds
              U+FFFD; classes numbered in first-seen id order.
  layout      primes: distinct primes scanning upward from engram_vocab_size - 1, in
              (layer, n-gram, head) order; offsets: exclusive prefix sum per layer.
  multipliers M[l][s] = 2 * default_rng(10007 * layer_id).integers(0, ((2^63-1) // C) // 2, 4) + 1,
              C = compressed vocab size.
  hash ids    per position p: tok_s = c[p - s] for s = 0..N-1 unless blocked (p < s, or a DEAD token at
              or after p - s), then the pad class; rolling = tok_0 * M0; for n = 1..N-1:
              rolling ^= tok_n * M_n; id[(n-1)*H + h] = rolling mod P[n-1][h] + offset.

Self-test (`python engram.py`) reproduces the third-party constants of §14.5.
"""

import json
import sys

import numpy as np

try:
    from .common import isprime
except ImportError:  # run as a script
    from common import isprime

DEAD = -1
SENTINEL = "\ue000"


def v41_tokenizer_json(v4_tokenizer_json_path: str, overlay_path: str) -> str:
    """The V4.1 tokenizer: the V4 tokenizer.json with the overlay's added-token renames applied."""
    with open(v4_tokenizer_json_path) as f:
        tok = json.load(f)
    with open(overlay_path) as f:
        overlay = json.load(f)
    renames = {int(k): v for k, v in overlay["added_token_content"].items()}
    seen = set()
    for a in tok["added_tokens"]:
        if a["id"] in renames:
            a["content"] = renames[a["id"]]
            seen.add(a["id"])
    if seen != set(renames):
        raise ValueError(f"overlay ids not among the added tokens: {sorted(set(renames) - seen)}")
    return json.dumps(tok, ensure_ascii=False)


def normalizer():
    from tokenizers import Regex, normalizers

    return normalizers.Sequence(
        [
            normalizers.NFKC(),
            normalizers.NFD(),
            normalizers.StripAccents(),
            normalizers.Lowercase(),
            normalizers.Replace(Regex(r"[ \t\r\n]+"), " "),
            normalizers.Replace(Regex(r"^ $"), SENTINEL),  # keep a lone space through Strip
            normalizers.Strip(),
            normalizers.Replace(SENTINEL, " "),
        ]
    )


def build_token_map(tokenizer) -> tuple[np.ndarray, int, dict]:
    """tokenizer: a `tokenizers.Tokenizer`. Returns (map int32 [n_ids], n_classes, stats)."""
    norm = normalizer()
    n = tokenizer.get_vocab_size(with_added_tokens=True)
    key_to_class: dict[str, int] = {}
    out = np.empty(n, dtype=np.int32)
    raw_keyed = 0
    for i in range(n):
        text = tokenizer.decode([i], skip_special_tokens=False)
        if "\ufffd" in text:
            key = tokenizer.id_to_token(i)
            raw_keyed += 1
        else:
            normed = norm.normalize_str(text)
            key = normed if normed else text
        out[i] = key_to_class.setdefault(key, len(key_to_class))
    return out, len(key_to_class), {"ids": n, "keyed_by_raw_token": raw_keyed}


def find_primes(layer_ids, max_ngram: int, n_heads: int, vocab: int) -> list:
    """primes[l][n-1][h] for n = 1..max_ngram-1: each the smallest unused prime above the start
    value, which restarts at vocab - 1 for every (layer, n-gram) pair."""
    used, primes = set(), []
    for _ in layer_ids:
        per_n = []
        for _ in range(max_ngram - 1):
            cur, heads = vocab - 1, []
            for _ in range(n_heads):
                cur += 1
                while not isprime(cur) or cur in used:
                    cur += 1
                used.add(cur)
                heads.append(cur)
            per_n.append(heads)
        primes.append(per_n)
    return primes


def multipliers(layer_ids, max_ngram: int, compressed_vocab: int) -> np.ndarray:
    bound = max(1, ((2**63 - 1) // compressed_vocab) // 2)
    rows = [np.random.default_rng(10007 * lid).integers(0, bound, size=(max_ngram,), dtype=np.int64) * 2 + 1 for lid in layer_ids]
    return np.stack(rows)


class EngramHasher:
    def __init__(self, cfg: dict, token_map: np.ndarray, n_classes: int):
        if n_classes != cfg["engram_compressed_vocab_size"]:
            raise ValueError(
                f"token map has {n_classes} classes but engram_compressed_vocab_size is "
                f"{cfg['engram_compressed_vocab_size']}: every multiplier derives from it"
            )
        self.layer_ids = list(cfg["engram_layer_ids"])
        self.N = cfg["engram_max_ngram_size"]
        self.H = cfg["engram_n_heads"]
        self.token_map = token_map.astype(np.int64)
        self.pad = int(self.token_map[cfg["engram_pad_id"]])
        self.primes = find_primes(self.layer_ids, self.N, self.H, cfg["engram_vocab_size"])
        flat = [[p for per_n in layer for p in per_n] for layer in self.primes]
        self.flat_primes = np.array(flat, dtype=np.int64)  # [n_layers, (N-1)*H]
        self.offsets = np.array([np.concatenate([[0], np.cumsum(f)[:-1]]) for f in flat], dtype=np.int64)
        self.rows = [int(sum(f)) for f in flat]
        if self.rows != list(cfg["engram_num_embeddings"]):
            raise ValueError(f"table rows from the primes {self.rows} != engram_num_embeddings {cfg['engram_num_embeddings']}")
        self.mult = multipliers(self.layer_ids, self.N, n_classes)  # [n_layers, N] int64

    def compressed(self, ids, dead=None) -> np.ndarray:
        c = self.token_map[np.asarray(ids, dtype=np.int64)]
        if dead is not None:
            c = np.where(np.asarray(dead, dtype=bool), DEAD, c)
        return c

    def hash_ids(self, ids, dead=None) -> np.ndarray:
        """[L, n_layers, (N-1)*H] int64 row ids for every position of the sequence `ids`."""
        c = self.compressed(ids, dead)
        L = len(c)
        pos = np.arange(L)
        toks, blocked = [], np.zeros(L, dtype=bool)
        for s in range(self.N):
            src = c[np.clip(pos - s, 0, None)]
            blocked = blocked | (pos < s) | (src == DEAD)
            toks.append(np.where(blocked, self.pad, src))
        toks = np.stack(toks, -1)  # [L, N]
        out = np.empty((L, len(self.layer_ids), (self.N - 1) * self.H), dtype=np.int64)
        for li in range(len(self.layer_ids)):
            prod = toks * self.mult[li]  # no overflow: tok < C and M < 2^63 / C
            rolling = prod[:, 0].copy()
            for n in range(1, self.N):
                rolling ^= prod[:, n]
                p = self.flat_primes[li, (n - 1) * self.H : n * self.H]
                out[:, li, (n - 1) * self.H : n * self.H] = rolling[:, None] % p[None, :] + self.offsets[li, (n - 1) * self.H : n * self.H]
        return out


# Third-party values quoted in spec §14.5 (real config: layers [1, 14], 4-grams, 8 heads,
# engram_vocab_size 16e6, compressed vocab 99092; num_embeddings from the released config).
REAL = {
    "engram_layer_ids": [1, 14],
    "engram_max_ngram_size": 4,
    "engram_n_heads": 8,
    "engram_vocab_size": 16000000,
    "engram_compressed_vocab_size": 99092,
    "engram_num_embeddings": [384006168, 384016682],
    "engram_pad_id": 2,
}
REAL_FIRST_PRIMES = [16000057, 16000079, 16000081]
REAL_LAST_PRIMES = [16000877, 16000879, 16000889]
REAL_MULTIPLIERS = {
    1: [76632096046245, 4839876093313, 35959672319349, 73987337458391],
    14: [67716810739261, 51510806800915, 30921347202721, 82619226485591],
}


def self_test() -> dict:
    r = REAL
    primes = find_primes(r["engram_layer_ids"], r["engram_max_ngram_size"], r["engram_n_heads"], r["engram_vocab_size"])
    flat = [p for layer in primes for per_n in layer for p in per_n]
    assert flat[:3] == REAL_FIRST_PRIMES, flat[:3]
    assert flat[-3:] == REAL_LAST_PRIMES, flat[-3:]
    assert len(set(flat)) == len(flat) == 48
    rows = [sum(p for per_n in layer for p in per_n) for layer in primes]
    assert rows == r["engram_num_embeddings"], rows
    m = multipliers(r["engram_layer_ids"], 4, r["engram_compressed_vocab_size"])
    for li, lid in enumerate(r["engram_layer_ids"]):
        assert m[li].tolist() == REAL_MULTIPLIERS[lid], (lid, m[li].tolist())
        assert all(v % 2 == 1 for v in m[li].tolist())
    try:
        import sympy

        assert all(sympy.isprime(p) for p in flat)
        assert not any(sympy.isprime(q) for q in range(16000000, 16000057))
    except ImportError:
        pass
    return {"first_primes": flat[:3], "last_primes": flat[-3:], "rows": rows, "multipliers": m.tolist()}


if __name__ == "__main__":
    print(json.dumps(self_test()))
    print("engram self-test ok", file=sys.stderr)
