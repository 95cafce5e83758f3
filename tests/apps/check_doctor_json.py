#!/usr/bin/env python3
"""Runs `dsinfer doctor --json` and checks it is one valid JSON report with the required keys.
Must pass with or without a GPU (no GPU: exit 0 and a no_gpu_reason)."""
import json
import subprocess
import sys

out = subprocess.run([sys.argv[1], "doctor", "--json"], capture_output=True, text=True, timeout=170)
assert out.returncode == 0, f"doctor exited {out.returncode}: {out.stderr}"
report = json.loads(out.stdout)
cpu, gpu = report["cpu"], report["gpu"]
for key in ("model", "features", "threads", "ram_bytes", "memory_read_gbps", "verdict"):
    assert key in cpu, f"cpu.{key} missing"
for feat in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni", "avx_vnni"):
    assert isinstance(cpu["features"].get(feat), bool), f"cpu.features.{feat} missing"
assert cpu["memory_read_gbps"] > 0
assert isinstance(gpu["built_with_cuda"], bool)
if not gpu["devices"]:
    assert gpu["no_gpu_reason"], "no devices and no reason"
for d in gpu["devices"]:
    for key in ("name", "sm", "memory_bytes", "driver", "runtime", "paths", "verdict", "why"):
        assert key in d, f"device.{key} missing"
    assert d["verdict"] in ("supported", "degraded", "unsupported")
print("doctor report ok:", "GPUs:", len(gpu["devices"]), gpu.get("no_gpu_reason", ""))
