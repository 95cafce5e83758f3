// libFuzzer target for a hostile config.json beside valid weights: the input is a JSON merge
// patch (RFC 7386) applied to tiny-a's config. Whatever config comes out must either be refused
// (ModelConfig::FromJson, or ModelWeights::Bind against tiny-a's tensors) or run: a 9-token
// prefill in two chunks and two decode steps through the CPU forward pass, on the official
// numerics, giving logits of the config's vocabulary (finite or not: an extreme but valid value,
// such as a huge rope factor, may overflow, which is not this target's concern). Under ASan this
// catches a config field the validation lets through that the forward pass then trusts (window,
// top-k, compress ratios, routing, ...). The patch's values change no tensor shapes unless Bind
// refuses them.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/cpu/cpu_model.h"
#include "core/thread_pool.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/demo_model.h"
#include "model/weights.h"

namespace {

struct Fixture {
  std::string dir;
  nlohmann::json base;
  dsinfer::ThreadPool pool{1};
};

Fixture& TheFixture() {
  static Fixture* fixture = [] {
    auto* f = new Fixture;
    f->dir = (std::filesystem::temp_directory_path() /
              ("dsinfer_fuzz_config_" + std::to_string(::getpid())))
                 .string();
    auto config = dsinfer::model::PresetConfig("tiny-a");
    if (!config.ok()) std::abort();
    if (!dsinfer::model::WriteDemoModel(*config, f->dir, {}, f->pool).ok()) std::abort();
    f->base = config->ToJson();
    std::atexit([] { std::filesystem::remove_all(TheFixture().dir); });
    return f;
  }();
  return *fixture;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dsinfer;
  Fixture& f = TheFixture();
  const nlohmann::json patch = nlohmann::json::parse(data, data + size, nullptr, false);
  if (patch.is_discarded() || !patch.is_object()) return 0;
  nlohmann::json patched = f.base;
  patched.merge_patch(patch);
  auto config = model::ModelConfig::FromJson(patched);
  if (!config.ok()) return 0;
  auto checkpoint = io::Checkpoint::Open(f.dir);
  if (!checkpoint.ok()) std::abort();  // the fixture itself
  auto weights = model::ModelWeights::Bind(*config, std::move(*checkpoint));
  if (!weights.ok()) return 0;
  auto cpu = backend::cpu::CpuModel::Create(**weights, backend::Numerics::Official(), f.pool);
  if (!cpu.ok()) return 0;
  // Big state (a window of a million rows is a valid config) is admission control's concern,
  // not this target's, and would only slow the search down.
  if ((*cpu)->StateBytesAt(16) > (int64_t{64} << 20)) return 0;
  const int vocab = (*weights)->config().vocab_size;
  std::vector<int32_t> ids;
  for (int i = 0; i < 11; ++i) ids.push_back(static_cast<int32_t>((i * 7919 + 3) % vocab));
  auto state = (*cpu)->NewSequence();
  const size_t chunks[] = {5, 4, 1, 1};
  size_t at = 0;
  for (size_t n : chunks) {
    backend::cpu::ForwardOutput out;
    const Status status = (*cpu)->Forward(*state, std::span<const int32_t>(ids.data() + at, n),
                                          {.all_logits = true}, &out);
    if (!status.ok()) return 0;  // refused cleanly
    if (out.logits.size() != n * static_cast<size_t>(vocab)) std::abort();
    at += n;
  }
  return 0;
}
