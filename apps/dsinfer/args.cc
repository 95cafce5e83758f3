#include "args.h"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>

namespace dsinfer::cli {

bool Args::Parse(int argc, char** argv, const std::set<std::string>& value_flags,
                 const std::set<std::string>& bool_flags) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0 || a == "--") {
      positional_.push_back(a);
      continue;
    }
    const std::string body = a.substr(2);
    const size_t eq = body.find('=');
    const bool has_value = eq != std::string::npos;
    const std::string name = has_value ? body.substr(0, eq) : body;
    std::string value = has_value ? body.substr(eq + 1) : std::string();
    if (bool_flags.count(name)) {
      if (has_value) {
        error_ = "--" + name + " takes no value";
        return false;
      }
      values_[name] = "1";
    } else if (value_flags.count(name)) {
      if (!has_value) {
        if (i + 1 >= argc) {
          error_ = "--" + name + " needs a value";
          return false;
        }
        value = argv[++i];
      }
      values_[name] = value;
    } else {
      error_ = "unknown flag --" + name;
      return false;
    }
  }
  return true;
}

std::optional<std::string> Args::Get(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::string Args::GetOr(const std::string& name, const std::string& fallback) const {
  auto v = Get(name);
  return v ? *v : fallback;
}

bool Args::GetInt(const std::string& name, long long* out) const {
  auto v = Get(name);
  if (!v) return true;
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(v->c_str(), &end, 10);
  if (errno != 0 || end == v->c_str() || *end != '\0') {
    error_ = "--" + name + ": not an integer: '" + *v + "'";
    return false;
  }
  *out = x;
  return true;
}

bool Args::GetDouble(const std::string& name, double* out) const {
  auto v = Get(name);
  if (!v) return true;
  errno = 0;
  char* end = nullptr;
  double x = std::strtod(v->c_str(), &end);
  if (errno != 0 || end == v->c_str() || *end != '\0') {
    error_ = "--" + name + ": not a number: '" + *v + "'";
    return false;
  }
  *out = x;
  return true;
}

std::vector<std::string> SplitCommas(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) parts.push_back(part);
  return parts;
}

bool ParseKeyValues(const std::string& text,
                    std::vector<std::pair<std::string, std::string>>* out) {
  for (const std::string& item : SplitCommas(text)) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos) return false;
    out->emplace_back(item.substr(0, eq), item.substr(eq + 1));
  }
  return true;
}

bool ParseIdList(const std::string& text, std::vector<int32_t>* out) {
  out->clear();
  size_t i = 0;
  while (i < text.size()) {
    size_t j = text.find(',', i);
    if (j == std::string::npos) j = text.size();
    std::string tok = text.substr(i, j - i);
    errno = 0;
    char* end = nullptr;
    long long v = std::strtoll(tok.c_str(), &end, 10);
    if (tok.empty() || errno != 0 || *end != '\0' || v < 0 || v > 0x7fffffff) return false;
    out->push_back(static_cast<int32_t>(v));
    i = j + 1;
    if (j == text.size() - 1) return false;  // trailing comma
  }
  return !out->empty();
}

std::optional<model::WeightResidency> WeightResidencyFlag(const Args& args) {
  return model::ParseWeightResidency(args.GetOr("weights", "auto"));
}

std::unique_ptr<model::ModelWeights> LoadWeightsOrPrint(const std::string& dir,
                                                        model::WeightResidency residency,
                                                        const char* command, uint64_t reserve_bytes,
                                                        const MemoryPlacement& placement) {
  const auto start = std::chrono::steady_clock::now();
  auto weights = model::ModelWeights::Load(dir, residency, reserve_bytes, placement);
  if (!weights.ok()) {
    std::fprintf(stderr, "dsinfer %s: %s\n", command, weights.status().ToString().c_str());
    return nullptr;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::string how = "mapped from the files";
  if ((*weights)->copied()) {
    const io::MappedFile::CopyStats stats = (*weights)->checkpoint().copy_stats();
    char text[128];
    std::snprintf(text, sizeof text,
                  "copied into memory (%.2f GB read past the page cache, %.2f GB through it)",
                  static_cast<double>(stats.direct_bytes) / 1e9,
                  static_cast<double>(stats.buffered_bytes) / 1e9);
    how = text;
  }
  std::fprintf(stderr, "weights: %.2f GB %s (--weights %s) in %.1f s\n",
               static_cast<double>((*weights)->checkpoint().TotalBytes()) / 1e9, how.c_str(),
               std::string(model::WeightResidencyName(residency)).c_str(), seconds);
  if (!(*weights)->copied() && placement.mode != MemoryPlacement::Mode::kDefault)
    std::fprintf(stderr,
                 "dsinfer %s: the weights are mapped, so their pages stay where the page cache "
                 "put them, whatever --numa says: --weights copy places them\n",
                 command);
  return std::move(*weights);
}

std::optional<CpuPlacement> CpuPlacementOrPrint(const Args& args, int device, int threads,
                                                const char* command) {
  if (device >= 0) {
    if (!args.Has("numa")) return CpuPlacement{};
    std::fprintf(stderr,
                 "dsinfer %s: --numa places the CPU backend's threads: it needs --device cpu\n",
                 command);
    return std::nullopt;
  }
  const std::string name = args.GetOr("numa", "off");
  const std::optional<NumaPolicy> policy = ParseNumaPolicy(name);
  if (!policy) {
    std::fprintf(stderr,
                 "dsinfer %s: --numa takes off, distribute, isolate or numactl, not \"%s\"\n",
                 command, name.c_str());
    return std::nullopt;
  }
  Result<CpuPlacement> plan = PlanCpuPlacementHere(*policy, threads);
  if (!plan.ok()) {
    std::fprintf(stderr, "dsinfer %s: --numa %s: %s\n", command, name.c_str(),
                 plan.status().ToString().c_str());
    return std::nullopt;
  }
  if (*policy != NumaPolicy::kOff || plan->numa_nodes > 1)
    std::fprintf(stderr, "%s\n", plan->summary.c_str());
  return std::move(plan).value();
}

std::string FindTokenizer(const std::string& model_dir, const std::string& flag) {
  namespace fs = std::filesystem;
  if (!flag.empty()) return flag;
  const fs::path in_model = fs::path(model_dir) / "tokenizer.json";
  std::error_code ec;
  if (fs::exists(in_model, ec)) return in_model.string();
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  for (fs::path dir = exe.parent_path(); !ec && !dir.empty() && dir != dir.root_path();
       dir = dir.parent_path()) {
    const fs::path candidate = dir / "tests/fixtures/tokenizer/deepseek-v4/tokenizer.json";
    if (fs::exists(candidate, ec)) return candidate.string();
  }
  return in_model.string();
}

}  // namespace dsinfer::cli
