"""Writes tests/io/fixtures/hf_written.safetensors with Hugging Face's own safetensors writer.

tests/io/hf_interop_test.cc reads it back with our parser and checks every value, so the two
implementations agree on the layout HF produces (dtype ordering, padding, metadata), not just on
files we wrote ourselves. Deterministic: no randomness, values are arithmetic patterns.

Regenerate:  /work/venvs/ref/bin/python reference/io/make_safetensors_fixture.py
(versions pinned in reference/io/requirements.txt).

With --check PATH it instead loads a file written by dsinfer (e.g. by the C++ round-trip tool)
and prints every tensor, to confirm HF can read our output.
"""
import argparse
import json
import pathlib

import safetensors
import torch
from safetensors.torch import load_file, save_file

OUT_DIR = pathlib.Path(__file__).resolve().parents[2] / "tests" / "io" / "fixtures"


def pattern(n):
    # i * 0.5 - 3: exact in every float dtype below, including e4m3 (|v| <= 448, 3 mantissa bits
    # suffice for halves up to 8) - keep n <= 16.
    return torch.arange(n, dtype=torch.float64) * 0.5 - 3.0


def tensors():
    t = {
        "f32": pattern(6).to(torch.float32).reshape(2, 3),
        "f64": pattern(4).reshape(4),
        "f16": pattern(6).to(torch.float16).reshape(3, 2),
        "bf16": pattern(8).to(torch.bfloat16).reshape(2, 2, 2),
        "f8_e4m3": pattern(16).to(torch.float8_e4m3fn).reshape(4, 4),
        # e8m0 codes 120..127 = 2^-7 .. 2^0
        "f8_e8m0": torch.tensor([120, 121, 122, 123, 124, 125, 126, 127], dtype=torch.uint8)
        .view(torch.float8_e8m0fnu),
        "i8": torch.arange(-4, 4, dtype=torch.int8),
        "u8": torch.arange(250, 256, dtype=torch.int32).to(torch.uint8),
        "i16": torch.arange(-3, 3, dtype=torch.int16) * 1000,
        "i32": torch.arange(-2, 2, dtype=torch.int32) * 100000,
        "i64": torch.tensor([-(2**40), -1, 0, 2**50], dtype=torch.int64),
        "bool": torch.tensor([True, False, False, True, True]),
        "scalar": torch.tensor(2.5, dtype=torch.float32),
        "empty": torch.zeros(0, 3, dtype=torch.bfloat16),
    }
    return t


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", help="load a dsinfer-written file and print it")
    args = parser.parse_args()
    if args.check:
        loaded = load_file(args.check)
        with safetensors.safe_open(args.check, framework="pt") as f:
            print("metadata:", f.metadata())
        for name in sorted(loaded):
            t = loaded[name]
            print(name, t.dtype, tuple(t.shape), t.reshape(-1)[:6].tolist() if t.numel() else [])
        return
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / "hf_written.safetensors"
    save_file(tensors(), str(path), metadata={"format": "pt", "made_by": "safetensors.torch"})
    manifest = {
        "file": path.name,
        "generator": "reference/io/make_safetensors_fixture.py",
        "torch": torch.__version__,
        "safetensors": safetensors.__version__,
        "seed": None,
        "bytes": path.stat().st_size,
    }
    (OUT_DIR / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print("wrote", path, manifest["bytes"], "bytes")


if __name__ == "__main__":
    main()
