#!/usr/bin/env python3
"""Runs `dsinfer doctor --json` and checks the report's values, not only its keys: the CPU
self-check results and their budgets, the GEMM probe against a peak recomputed from its stated
inputs, the stage timings against the wall clock, and that a spent --time-budget skips stages
with a reason. Must pass with or without a GPU (no GPU: exit 0 and a no_gpu_reason)."""
import json
import math
import os
import subprocess
import sys
import time

DSINFER = sys.argv[1]
VERDICTS = ("supported", "degraded", "unsupported", "unchecked")
EXPECTED_CHECKS = {"gemv/fp8-e8m0", "gemm/fp8-e8m0", "gemv/fp4-e8m0", "gemm/fp4-e8m0", "gemv/bf16",
                   "gemm/bf16", "gemm/fp8-e8m0/act-fp8", "gemm/fp4-e8m0/act-fp8",
                   "gemm/bf16/act-fp8", "gemv/fp8-e8m0/act-fp8", "gemv/fp4-e8m0/act-fp8",
                   "gemv/bf16/act-fp8",
                   "rmsnorm/f32", "rmsnorm/bf16-out", "rope/forward", "rope/inverse"}


def doctor(*extra):
    t0 = time.monotonic()
    out = subprocess.run([DSINFER, "doctor", "--json", *extra], capture_output=True, text=True,
                         timeout=170)
    wall = time.monotonic() - t0
    assert out.returncode == 0, f"doctor exited {out.returncode}: {out.stderr}"
    return json.loads(out.stdout), wall


def check_stages(report, wall):
    stages = report["stages"]
    names = [s["name"] for s in stages]
    for required in ("memory_bandwidth", "cpu_selfcheck", "cpu_gemm_probe", "gpu"):
        assert required in names, f"stage {required} missing: {names}"
    total = 0.0
    for s in stages:
        assert s["status"] in ("ran", "skipped"), s
        assert s["wall_s"] >= 0, s
        if s["status"] == "skipped":
            assert s["wall_s"] == 0 and "time budget" in s["reason"], s
        total += s["wall_s"]
    # Stages run one after another inside the process: their sum cannot exceed its wall time.
    assert total <= report["elapsed_s"] + 1e-6 <= wall + 1e-3, (total, report["elapsed_s"], wall)


# 1. Full run with the default budget.
report, wall = doctor()
cpu, gpu = report["cpu"], report["gpu"]
for key in ("model", "features", "threads", "ram_bytes", "memory_read_gbps", "verdict", "why",
            "selfcheck", "gemm_probe"):
    assert key in cpu, f"cpu.{key} missing"
for feat in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni",
             "avx_vnni"):
    assert isinstance(cpu["features"].get(feat), bool), f"cpu.features.{feat} missing"
assert cpu["memory_read_gbps"] > 0
# The CPUs this process may use and their NUMA nodes (--numa): the nodes' CPUs are exactly the
# allowed ones, each on one node, and the allowed set is this process's affinity mask.
def cpu_list(text):
    ids = []
    for item in filter(None, text.split(",")):
        lo, _, hi = item.partition("-")
        ids += range(int(lo), int(hi or lo) + 1)
    return ids
allowed = cpu_list(cpu["allowed_cpus"])
assert sorted(allowed) == sorted(os.sched_getaffinity(0)), (cpu["allowed_cpus"], os.sched_getaffinity(0))
on_nodes = [c for node in cpu["numa_nodes"] for c in cpu_list(node["cpus"])]
assert sorted(on_nodes) == sorted(allowed), cpu["numa_nodes"]
assert len({node["id"] for node in cpu["numa_nodes"]}) == len(cpu["numa_nodes"]) >= 1
assert all(node["memory_bytes"] == -1 or node["memory_bytes"] > 0 for node in cpu["numa_nodes"])
assert cpu["numa_distribute"].startswith(f"numa distribute: {len(allowed)} threads pinned"), cpu
assert report["time_budget_s"] == 60
check_stages(report, wall)
assert all(s["status"] == "ran" for s in report["stages"]), "a stage was skipped within 60 s"

checks = cpu["selfcheck"]["checks"]
assert {c["op"] for c in checks} == EXPECTED_CHECKS, [c["op"] for c in checks]
for c in checks:
    err, budget = c["max_rel_err"], c["budget"]
    assert math.isfinite(err) and err >= 0, c
    assert 0 < budget < 0.01, c  # every budget is a small relative error, never a free pass
    assert c["pass"] == (err <= budget), c
    assert c["pass"], f"CPU self-check failed: {c}"
    assert c["relative_to"], c
# An op that computes in fp32 cannot be exact against fp64 on random data of these sizes: an
# error of exactly 0 on every check would mean the reference is the code under test.
assert any(c["max_rel_err"] > 0 for c in checks)
assert cpu["selfcheck"]["failed"] == 0 and cpu["verdict"] == "supported", cpu["why"]
# The quantized-input checks say which kernel ran; AMX only where the CPU reports AMX-BF16.
assert cpu["matmul_kernel"] in ("amx-bf16", "avx512-bf16", "fp32"), cpu["matmul_kernel"]
if cpu["matmul_kernel"] == "amx-bf16":
    assert cpu["features"]["amx_bf16"] and cpu["features"]["avx512_bf16"], cpu["features"]
if cpu["matmul_kernel"] == "avx512-bf16":
    assert cpu["features"]["avx512_bf16"], cpu["features"]
# One token of FP8/FP4 goes to the tile-exact AVX-512 kernels where doctor says they are in use.
assert isinstance(cpu["vector_kernels"], bool)
if cpu["vector_kernels"]:
    assert cpu["matmul_kernel"] == "amx-bf16", cpu
for c in checks:
    if c["op"].endswith("/act-fp8"):
        # The vector kernels take FP8/FP4 weights only: one token of bf16 weights stays on tiles.
        one_token = c["shape"].startswith("m=1 ") and c["op"].split("/")[1] != "bf16"
        kernel = "avx512-vector" if one_token and cpu["vector_kernels"] else cpu["matmul_kernel"]
        # The AVX-512 BF16 kernels take whole 128-column blocks only.
        cols = int(c["shape"].split("cols=")[1].split()[0])
        if kernel == "avx512-bf16" and cols % 128 != 0:
            kernel = "fp32"
        assert "kernel=" + kernel in c["shape"], c

g = cpu["gemm_probe"]
inputs = g["peak_inputs"]
assert inputs["cores"] >= 1 and inputs["ghz"] > 0 and inputs["fma_units"] >= 1
assert inputs["fp32_lanes"] in (4, 8, 16)
assert inputs["fp32_lanes"] == (16 if cpu["features"]["avx512f"] else
                                8 if cpu["features"]["avx2"] and cpu["features"]["fma"] else 4)
peak = inputs["cores"] * inputs["ghz"] * inputs["fp32_lanes"] * 2 * inputs["fma_units"]
assert math.isclose(g["peak_gflops"], peak, rel_tol=1e-9), (g["peak_gflops"], peak)
assert g["gflops"] > 0 and g["repeats"] >= 3 and g["seconds_median"] > 0
assert math.isclose(g["peak_share"], g["gflops"] / g["peak_gflops"], rel_tol=1e-9)
# Achieved above the stated peak means the peak (or the timing) is wrong.
assert 0 < g["peak_share"] <= 1.0, g
assert "GFLOP/s" in g["peak_derivation"] and str(inputs["fp32_lanes"]) in g["peak_derivation"]

assert isinstance(gpu["built_with_cuda"], bool)
if not gpu["devices"]:
    assert gpu["no_gpu_reason"], "no devices and no reason"
for d in gpu["devices"]:
    for key in ("name", "sm", "memory_bytes", "driver", "runtime", "paths", "verdict", "why"):
        assert key in d, f"device.{key} missing"
    assert d["verdict"] in VERDICTS

# 2. A spent budget: every budgeted stage is skipped with the reason, GPU enumeration still runs,
#    and the verdicts say nothing was checked.
report, wall = doctor("--time-budget", "0")
check_stages(report, wall)
by_name = {s["name"]: s for s in report["stages"]}
for name in ("memory_bandwidth", "cpu_selfcheck", "cpu_gemm_probe"):
    assert by_name[name]["status"] == "skipped", by_name[name]
assert by_name["gpu"]["status"] == "ran"
assert report["cpu"]["verdict"] == "unchecked" and "time budget" in report["cpu"]["why"]
assert "selfcheck" not in report["cpu"] and "gemm_probe" not in report["cpu"]
for d in report["gpu"]["devices"]:
    assert d["verdict"] in ("unchecked", "unsupported"), d  # unsupported: no code for the arch

# 3. Bad budgets are usage errors.
for bad in ("-1", "abc", "nan"):
    out = subprocess.run([DSINFER, "doctor", "--time-budget", bad], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 2 and "time-budget" in out.stderr, (bad, out.returncode, out.stderr)

print("doctor report ok:", "GPUs:", len(gpu["devices"]), gpu.get("no_gpu_reason", ""),
      f"GEMM {g['gflops']:.1f} GFLOP/s = {100 * g['peak_share']:.1f}% of {g['peak_gflops']:.0f}")
