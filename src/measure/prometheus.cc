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

namespace {

struct Sample {
  std::string name, labels;
  double value = 0;
};

// Each sample line of the exposition text, comments and blank lines skipped; a malformed line is
// an error naming it.
Result<std::vector<Sample>> ParseSamples(const std::string& text) {
  std::vector<Sample> samples;
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
    Sample s;
    s.name = line.substr(0, std::min(brace, line.find(' ')));
    if (brace != std::string::npos && brace < space) {
      const size_t close = line.find('}', brace);
      if (close == std::string::npos)
        return InvalidArgument("metrics line " + std::to_string(line_no) + ": unclosed '{'");
      s.labels = line.substr(brace + 1, close - brace - 1);
    }
    if (!ParseNumber(line.substr(space + 1), &s.value))
      return InvalidArgument("metrics line " + std::to_string(line_no) + ": bad value");
    if (EndsWith(s.name, "_bucket")) {
      const std::string key = "le=\"";
      const size_t at = s.labels.find(key);
      if (at == std::string::npos || s.labels.find(',') != std::string::npos) continue;
      const size_t end = s.labels.find('"', at + key.size());
      double le = 0;
      if (end == std::string::npos ||
          !ParseNumber(s.labels.substr(at + key.size(), end - at - key.size()), &le))
        return InvalidArgument("metrics line " + std::to_string(line_no) + ": bad le label");
    }
    samples.push_back(std::move(s));
  }
  return samples;
}

double LeOf(const std::string& labels) {
  const size_t at = labels.find("le=\"") + 4;
  double le = 0;
  ParseNumber(labels.substr(at, labels.find('"', at) - at), &le);
  return le;
}

}  // namespace

Result<std::map<std::string, PromHistogram>> ParsePrometheusHistograms(const std::string& text) {
  DSINFER_ASSIGN_OR_RETURN(std::vector<Sample> samples, ParseSamples(text));
  std::map<std::string, PromHistogram> out;
  for (const Sample& s : samples) {
    if (EndsWith(s.name, "_bucket")) {
      if (s.labels.find("le=\"") == std::string::npos || s.labels.find(',') != std::string::npos)
        continue;
      out[s.name.substr(0, s.name.size() - 7)].buckets.emplace_back(LeOf(s.labels), s.value);
    } else if (EndsWith(s.name, "_sum") && s.labels.empty()) {
      out[s.name.substr(0, s.name.size() - 4)].sum = s.value;
    } else if (EndsWith(s.name, "_count") && s.labels.empty()) {
      out[s.name.substr(0, s.name.size() - 6)].count = s.value;
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

Result<PromSnapshot> ParsePrometheusSnapshot(const std::string& text) {
  PromSnapshot snap;
  DSINFER_ASSIGN_OR_RETURN(snap.histograms, ParsePrometheusHistograms(text));
  DSINFER_ASSIGN_OR_RETURN(std::vector<Sample> samples, ParseSamples(text));
  for (const Sample& s : samples)
    if (EndsWith(s.name, "_total")) snap.counters[s.name] += s.value;
  return snap;
}

PromSnapshot SnapshotDelta(const PromSnapshot& before, const PromSnapshot& after) {
  PromSnapshot delta;
  for (const auto& [name, value] : after.counters) {
    auto it = before.counters.find(name);
    delta.counters[name] = value - (it == before.counters.end() ? 0.0 : it->second);
  }
  for (const auto& [name, h] : after.histograms) {
    PromHistogram d = h;
    auto it = before.histograms.find(name);
    if (it != before.histograms.end()) {
      d.sum -= it->second.sum;
      d.count -= it->second.count;
      for (auto& [le, count] : d.buckets)
        for (const auto& [before_le, before_count] : it->second.buckets)
          if (before_le == le) count -= before_count;
    }
    delta.histograms[name] = std::move(d);
  }
  return delta;
}

}  // namespace dsinfer::measure
