// Minimal command-line flag parsing shared by the subcommands: --name value, --name=value,
// boolean --flag, and positional arguments. Unknown flags are reported as usage errors.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/cpu_topology.h"
#include "model/weights.h"

namespace dsinfer::cli {

class Args {
 public:
  // value_flags take a value; bool_flags do not. Returns false (and sets error()) on bad usage.
  bool Parse(int argc, char** argv, const std::set<std::string>& value_flags,
             const std::set<std::string>& bool_flags);
  const std::string& error() const { return error_; }
  std::optional<std::string> Get(const std::string& name) const;
  std::string GetOr(const std::string& name, const std::string& fallback) const;
  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  const std::vector<std::string>& positional() const { return positional_; }

  // Typed getters: return false with error() set when present but malformed.
  bool GetInt(const std::string& name, long long* out) const;
  bool GetDouble(const std::string& name, double* out) const;

 private:
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
  mutable std::string error_;
};

// --weights auto|map|copy (model::WeightResidency; auto when absent); nullopt when malformed,
// which the commands report with kWeightResidencyFlagError.
std::optional<model::WeightResidency> WeightResidencyFlag(const Args& args);
inline constexpr const char* kWeightResidencyFlagError = "--weights takes auto, map or copy";
// Loads --model-style `dir` with the --weights choice (reserve_bytes: ResolveWeightResidency)
// and says on stderr how the weights are held and how long the load took. `placement`: where a
// copy's pages go (CpuPlacement::weights); mapped weights cannot follow it, which is said.
// Errors are printed with `command`; nullptr then.
std::unique_ptr<model::ModelWeights> LoadWeightsOrPrint(const std::string& dir,
                                                        model::WeightResidency residency,
                                                        const char* command,
                                                        uint64_t reserve_bytes = 0,
                                                        const MemoryPlacement& placement = {});

// --numa off|distribute|isolate|numactl (off when absent) with `threads` (--threads, 0: one per
// CPU the policy uses): where this machine's CPU threads and weights go (PlanCpuPlacementHere).
// The plan's summary goes to stderr unless the policy is off on a one-node machine. `device`:
// --device's ordinal (ParseDevice); a GPU (>= 0) has no CPU threads to place, so --numa is
// refused there and the placement is the default one. Errors are printed with `command`;
// nullopt then.
std::optional<CpuPlacement> CpuPlacementOrPrint(const Args& args, int device, int threads,
                                                const char* command);

// "a,b,c" -> {"a","b","c"} (empty items kept, so callers can refuse them).
std::vector<std::string> SplitCommas(const std::string& text);
// "k1=v1,k2=v2" -> {{"k1","v1"},{"k2","v2"}}; false when an item has no '='.
bool ParseKeyValues(const std::string& text, std::vector<std::pair<std::string, std::string>>* out);

// "0,5,7" -> {0,5,7}; false on malformed input.
bool ParseIdList(const std::string& text, std::vector<int32_t>* out);

// The tokenizer for a model directory: `flag` when given, else DIR/tokenizer.json, else (demo
// models written without one) the repository's DeepSeek-V4 tokenizer found relative to this
// binary, else DIR/tokenizer.json (whose absence the caller reports).
std::string FindTokenizer(const std::string& model_dir, const std::string& flag);

}  // namespace dsinfer::cli
