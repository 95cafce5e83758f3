// Numerics mode of a forward pass.
//
// kOfficial reproduces the current official reference (spec §2, §13): bf16 activations rounded
// where the reference rounds, FP8 activation quantization in front of every FP8/FP4 linear, the
// FP8 KV round trip, Hadamard + FP4 on the indexer.
// kFp32Reference reproduces Hugging Face transformers' DeepseekV4 in fp32 (our independent
// oracle, which simulates none of the quantization): dequantized weights, fp32 everywhere.
// docs/NUMERICS.md lists every difference and the measured errors.
#pragma once

#include <string>

namespace dsinfer::backend {

struct Numerics {
  bool round_bf16 = true;            // round activations to bf16 at the reference's points
  bool quantize_activations = true;  // act_quant(128) before FP8/FP4 linears
  bool kv_fp8_round_trip = true;     // FP8 QAT round trip on the nope dims of KV rows
  bool indexer_fp4 = true;           // Hadamard + FP4 round trip on indexer q and k

  static Numerics Official() { return {}; }
  static Numerics Fp32Reference() { return {false, false, false, false}; }
  std::string Name() const { return round_bf16 ? "official" : "fp32-reference"; }
};

}  // namespace dsinfer::backend
