#include "measure/compare.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "core/status.h"

namespace dsinfer::measure {
namespace {

double MinValue(const std::map<std::string, double>& m) {
  double v = std::numeric_limits<double>::infinity();
  for (const auto& [_, lp] : m) v = std::min(v, lp);
  return v;
}

// log-sum-exp of `values`.
double LogSumExp(const std::vector<double>& values) {
  double hi = -std::numeric_limits<double>::infinity();
  for (double v : values) hi = std::max(hi, v);
  double s = 0;
  for (double v : values) s += std::exp(v - hi);
  return hi + std::log(s);
}

std::string Fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.4g", v);
  return buf;
}

}  // namespace

double TopKKlEstimate(const std::map<std::string, double>& a,
                      const std::map<std::string, double>& b) {
  if (a.empty() || b.empty()) return 0;
  std::set<std::string> keys;
  for (const auto& [t, _] : a) keys.insert(t);
  for (const auto& [t, _] : b) keys.insert(t);
  const double floor_a = MinValue(a), floor_b = MinValue(b);
  std::vector<double> la, lb;
  for (const auto& t : keys) {
    auto ia = a.find(t), ib = b.find(t);
    la.push_back(ia == a.end() ? floor_a : ia->second);
    lb.push_back(ib == b.end() ? floor_b : ib->second);
  }
  const double za = LogSumExp(la), zb = LogSumExp(lb);
  double kl = 0;
  for (size_t i = 0; i < la.size(); ++i) {
    const double pa = la[i] - za, pb = lb[i] - zb;
    kl += std::exp(pa) * (pa - pb);
  }
  return std::max(kl, 0.0);
}

SequenceComparison CompareSequences(std::span<const TokenStep> a, std::span<const TokenStep> b,
                                    const CompareThresholds& th) {
  SequenceComparison r;
  const size_t n = std::min(a.size(), b.size());
  double delta_sum = 0, kl_sum = 0;
  int64_t delta_n = 0;
  for (size_t i = 0; i < n; ++i) {
    if (a[i].token != b[i].token) {
      r.divergence = static_cast<int64_t>(i);
      r.token_a = a[i].token;
      r.token_b = b[i].token;
      auto ia = a[i].top.find(b[i].token);
      r.b_in_a_top = ia != a[i].top.end();
      r.a_in_b_top = b[i].top.count(a[i].token) > 0;
      r.near_tie = r.b_in_a_top && r.a_in_b_top && a[i].logprob - ia->second < th.tie_margin;
      break;
    }
    ++r.compared;
    auto add_delta = [&](double d) {
      delta_sum += d;
      ++delta_n;
      if (d > r.max_abs_delta) {
        r.max_abs_delta = d;
        r.max_delta_position = static_cast<int64_t>(i);
      }
    };
    for (const auto& [t, lp] : a[i].top) {
      auto it = b[i].top.find(t);
      if (it != b[i].top.end()) add_delta(std::fabs(lp - it->second));
    }
    // The chosen token's own logprob is compared even when a side's top-k leaves it out (or is
    // empty): otherwise a side that returns no alternatives would pass on no evidence.
    if (a[i].top.count(a[i].token) == 0 || b[i].top.count(b[i].token) == 0)
      add_delta(std::fabs(a[i].logprob - b[i].logprob));
    const double kl = TopKKlEstimate(a[i].top, b[i].top);
    kl_sum += kl;
    if (kl > r.max_kl) {
      r.max_kl = kl;
      r.max_kl_position = static_cast<int64_t>(i);
    }
  }
  if (delta_n > 0) r.mean_abs_delta = delta_sum / static_cast<double>(delta_n);
  if (r.compared > 0) r.mean_kl = kl_sum / static_cast<double>(r.compared);
  if (r.divergence < 0 && a.size() != b.size()) {
    r.divergence = static_cast<int64_t>(n);  // one side stopped early
    r.token_a = n < a.size() ? a[n].token : "<end>";
    r.token_b = n < b.size() ? b[n].token : "<end>";
  }
  if (r.divergence >= 0 && !r.near_tie) {
    r.pass = false;
    r.reason = "greedy divergence at position " + std::to_string(r.divergence) + ": A chose '" +
               r.token_a + "', B chose '" + r.token_b + "'" +
               (r.b_in_a_top ? "" : " (B's token not in A's top-k)") +
               (r.a_in_b_top ? "" : " (A's token not in B's top-k)");
  } else if (r.max_abs_delta > th.max_abs_logprob_delta) {
    r.pass = false;
    r.reason = "max |delta logprob| " + Fmt(r.max_abs_delta) + " > " +
               Fmt(th.max_abs_logprob_delta) + " at position " +
               std::to_string(r.max_delta_position);
  } else if (r.max_kl > th.max_kl) {
    r.pass = false;
    r.reason = "KL estimate " + Fmt(r.max_kl) + " > " + Fmt(th.max_kl) + " at position " +
               std::to_string(r.max_kl_position);
  }
  return r;
}

LogitsComparison CompareLogits(std::span<const float> a, std::span<const float> b, int64_t vocab) {
  DSINFER_CHECK(vocab > 0 && a.size() == b.size() && a.size() % static_cast<size_t>(vocab) == 0);
  LogitsComparison r;
  r.rows = static_cast<int64_t>(a.size()) / vocab;
  double err = 0, ref = 0;
  for (int64_t row = 0; row < r.rows; ++row) {
    const float* pa = a.data() + row * vocab;  // [vocab]
    const float* pb = b.data() + row * vocab;  // [vocab]
    std::vector<double> la(pa, pa + vocab), lb(pb, pb + vocab);
    for (int64_t j = 0; j < vocab; ++j) {
      const double d = la[j] - lb[j];
      err += d * d;
      ref += lb[j] * lb[j];
      r.max_abs = std::max(r.max_abs, std::fabs(d));
    }
    const auto arg_a = std::max_element(la.begin(), la.end()) - la.begin();
    const auto arg_b = std::max_element(lb.begin(), lb.end()) - lb.begin();
    if (arg_a == arg_b) {
      ++r.argmax_agree;
    } else if (r.first_argmax_mismatch < 0) {
      r.first_argmax_mismatch = row;
    }
    const double za = LogSumExp(la), zb = LogSumExp(lb);
    double kl = 0;
    for (int64_t j = 0; j < vocab; ++j) kl += std::exp(lb[j] - zb) * ((lb[j] - zb) - (la[j] - za));
    if (kl > r.max_kl || r.max_kl_row < 0) {
      r.max_kl = std::max(kl, 0.0);
      r.max_kl_row = row;
    }
  }
  r.nmse = ref > 0 ? err / ref : err;
  return r;
}

}  // namespace dsinfer::measure
