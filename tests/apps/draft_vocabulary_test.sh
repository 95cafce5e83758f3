#!/usr/bin/env bash
# `dsinfer draft-vocabulary` end to end: the N most frequent ids of a corpus (ties to the lower
# id), written as the JSON array `--speculative-token-map` reads, with the share of the corpus they
# cover; a corpus with fewer distinct tokens gives all of them; bad input is refused. Then the
# map through `generate` and `bench model --verify` (drafts from the map, the same tokens).
# Usage: tests/apps/draft_vocabulary_test.sh BUILD_DIR
set -euo pipefail
build="$(cd "$1" && pwd)"
root="$(cd "$(dirname "$0")/../.." && pwd)"
dsinfer="$build/apps/dsinfer"
tokenizer="$root/tests/fixtures/tokenizer/deepseek-v4/tokenizer.json"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# "the" x 5, "cat" x 3, "sat" x 1 (words with their leading space: one token each).
printf 'the the the cat\nthe the cat cat sat' >"$work/corpus.txt"
"$dsinfer" draft-vocabulary --tokenizer "$tokenizer" --size 2 --out "$work/map.json" \
  "$work/corpus.txt" 2>"$work/err.txt"
cat "$work/err.txt"
python3 - "$dsinfer" "$tokenizer" "$work" <<'PY'
import json, subprocess, sys
dsinfer, tokenizer, work = sys.argv[1:]
ids = json.load(open(work + "/map.json"))
enc = subprocess.run([dsinfer, "tokenize", "--tokenizer", tokenizer], input='"the the the cat\\nthe the cat cat sat"\n',
                     capture_output=True, text=True, check=True).stdout
tokens = json.loads(enc)
counts = {t: tokens.count(t) for t in set(tokens)}
top = sorted(counts, key=lambda t: (-counts[t], t))[:2]
assert ids == sorted(top), (ids, counts)
covered = sum(counts[t] for t in top) / len(tokens)
err = open(work + "/err.txt").read()
assert "2 ids of" in err and "%.2f %%" % (100 * covered) in err and "%d tokens" % len(tokens) in err, err
print("draft-vocabulary ok:", ids, "cover", covered)
PY
# More ids than distinct tokens: all of them, said on stderr.
"$dsinfer" draft-vocabulary --tokenizer "$tokenizer" --size 1000 "$work/corpus.txt" \
  >"$work/all.json" 2>"$work/err.txt"
grep -q "the corpus has only .* distinct tokens: all of them are written" "$work/err.txt"
python3 -c "import json,sys; ids=json.load(open(sys.argv[1])); assert ids==sorted(set(ids)) and len(ids)<10, ids" "$work/all.json"
# Refusals: no corpus, a missing file, --size 0.
! "$dsinfer" draft-vocabulary --tokenizer "$tokenizer" --size 2 2>/dev/null
! "$dsinfer" draft-vocabulary --tokenizer "$tokenizer" --size 2 "$work/missing.txt" 2>/dev/null
! "$dsinfer" draft-vocabulary --tokenizer "$tokenizer" --size 0 "$work/corpus.txt" 2>/dev/null
# The map in use: generate gives the same tokens with and without it; bench times its drafting.
"$dsinfer" create-demo-model "$work/model" --preset tiny-a --seed 3 >/dev/null
python3 -c "import json; json.dump(list(range(0, 1024, 2)), open('$work/even.json', 'w'))"
plain="$("$dsinfer" generate --model "$work/model" --prompt-ids 5,17,300,9 --max-tokens 12 --threads 2)"
mapped="$("$dsinfer" generate --model "$work/model" --prompt-ids 5,17,300,9 --max-tokens 12 --threads 2 \
  --speculative-tokens 2 --speculative-token-map "$work/even.json" 2>"$work/gen.txt")"
[[ "$(head -1 <<<"$plain")" == "$(head -1 <<<"$mapped")" ]] || { echo "generate differs: $plain / $mapped"; exit 1; }
grep -q "speculative decoding: .* draft tokens accepted" "$work/gen.txt"
! "$dsinfer" generate --model "$work/model" --prompt-ids 5 --speculative-token-map "$work/even.json" 2>/dev/null
echo '[1, 1024]' >"$work/bad.json"
! "$dsinfer" generate --model "$work/model" --prompt-ids 5 --speculative-tokens 2 \
  --speculative-token-map "$work/bad.json" 2>"$work/err.txt"
grep -q "entry 1 (1024)" "$work/err.txt"
"$dsinfer" bench model --model "$work/model" --context 16 --batch 1 --decode 2 --repeats 1 \
  --mixed-chunk 0 --verify 1 --threads 2 --profile --speculative-token-map "$work/even.json" >"$work/bench.txt"
grep -q "^verify  batch   1 context     16: k 1 with drafting (1 MTP calls): " "$work/bench.txt"
grep -q "^| linear head (draft vocabulary) | " "$work/bench.txt"
echo "draft-vocabulary CLI ok"
