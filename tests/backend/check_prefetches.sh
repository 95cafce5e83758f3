#!/usr/bin/env bash
# The CPU kernels' software prefetches must reach the objects. GCC deletes a call to a function
# whose only work is prefetching when it deduces it "looping const" (core/prefetch.h); that once
# removed every prefetch of the AMX tile and vector kernels and of the AVX2 panels without a
# warning or a changed result, only a slower one. This counts the prefetch instructions of each
# kernel object in the backend library: each hint level its source uses must be there.
# Usage: tests/backend/check_prefetches.sh LIBDSINFER_BACKEND.a   (exit 77: cannot check here)
set -euo pipefail
lib="$1"
[[ "$(uname -m)" == x86_64 ]] || { echo "not x86-64: nothing to check"; exit 77; }
command -v objdump >/dev/null || { echo "objdump not found: cannot check"; exit 77; }
listing="$(mktemp)"
trap 'rm -f "$listing"' EXIT
objdump -d --no-show-raw-insn "$lib" >"$listing"

# count OBJECT MNEMONIC: how many times MNEMONIC appears in OBJECT's disassembly.
count() {
  awk -v obj="$1" -v insn="$2" '
    /file format/ { inside = index($1, obj ":") == 1 }
    inside && $0 ~ ("\t" insn " ") { n++ }
    END { print n + 0 }' "$listing"
}
# uses OBJECT MNEMONIC: whether OBJECT holds MNEMONIC at all (an instruction-set probe).
uses() { [[ "$(count "$1" "$2")" -gt 0 ]]; }

failed=0
expect() {  # expect OBJECT HINT...
  local obj="$1"
  shift
  for hint in "$@"; do
    local n
    n="$(count "$obj" "$hint")"
    if [[ "$n" -eq 0 ]]; then
      echo "FAIL: $obj holds no $hint (its source asks for some)"
      failed=1
    else
      echo "ok: $obj: $n x $hint"
    fi
  done
}

# The AMX and AVX-512 BF16 kernels are compiled on every x86-64 Linux build (target attributes).
expect linear_amx.cc.o prefetcht0
expect linear_amx_vector.cc.o prefetcht0
expect linear_bf16dot.cc.o prefetcht0 prefetcht1
# The AVX2 panels only when the build targets AVX2 (-march=native on such a CPU).
if uses linear_panel.cc.o vfmadd231ps; then
  expect linear_panel.cc.o prefetcht0
else
  echo "skip: linear_panel.cc.o has no AVX2 kernels in this build"
fi
exit "$failed"
