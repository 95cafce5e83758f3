#include "measure/prometheus.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace dsinfer::measure {
namespace {

bool ParseNumber(const std::string& s, double* out) {
  if (s == "+Inf") {
    *out = INFINITY;
    return true;
  }
  char* end = nullptr;
  *out = std::strtod(s.c_str(), &end);
  return end != s.c_str() && *end == '\0';
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

int PromHistogram::QuantileBucket(double q) const {
  if (count <= 0) return -1;
  const double target = q * count;
  for (size_t i = 0; i < buckets.size(); ++i)
    if (buckets[i].second >= target) return static_cast<int>(i);
  return static_cast<int>(buckets.size()) - 1;
}

Result<std::map<std::string, PromHistogram>> ParsePrometheusHistograms(const std::string& text) {
  std::map<std::string, PromHistogram> out;
  std::istringstream in(text);
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty() || line[0] == '#') continue;
    const size_t brace = line.find('{');
    const size_t space = line.rfind(' ');
    if (space == std::string::npos)
      return InvalidArgument("metrics line " + std::to_string(line_no) + ": no value");
    std::string name = line.substr(0, std::min(brace, line.find(' ')));
    std::string labels;
    if (brace != std::string::npos && brace < space) {
      const size_t close = line.find('}', brace);
      if (close == std::string::npos)
        return InvalidArgument("metrics line " + std::to_string(line_no) + ": unclosed '{'");
      labels = line.substr(brace + 1, close - brace - 1);
    }
    double value = 0;
    if (!ParseNumber(line.substr(space + 1), &value))
      return InvalidArgument("metrics line " + std::to_string(line_no) + ": bad value");
    if (EndsWith(name, "_bucket")) {
      const std::string key = "le=\"";
      const size_t at = labels.find(key);
      if (at == std::string::npos || labels.find(',') != std::string::npos) continue;
      const size_t end = labels.find('"', at + key.size());
      double le = 0;
      if (end == std::string::npos ||
          !ParseNumber(labels.substr(at + key.size(), end - at - key.size()), &le))
        return InvalidArgument("metrics line " + std::to_string(line_no) + ": bad le label");
      out[name.substr(0, name.size() - 7)].buckets.emplace_back(le, value);
    } else if (EndsWith(name, "_sum") && labels.empty()) {
      out[name.substr(0, name.size() - 4)].sum = value;
    } else if (EndsWith(name, "_count") && labels.empty()) {
      out[name.substr(0, name.size() - 6)].count = value;
    }
  }
  // Only names that had buckets are histograms (a plain counter may end in _count).
  for (auto it = out.begin(); it != out.end();) {
    if (it->second.buckets.empty()) {
      it = out.erase(it);
    } else {
      std::sort(it->second.buckets.begin(), it->second.buckets.end());
      ++it;
    }
  }
  return out;
}

}  // namespace dsinfer::measure
