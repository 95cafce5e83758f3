// dsinfer bench model: prefill and decode throughput on the CPU backend with the bandwidth
// roofline beside each figure (weight bytes a decode step must read / measured bandwidth).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "args.h"
#include "backend/cpu/cpu_model.h"
#include "backend/cpu/peak.h"
#include "backend/op_profile.h"
#include "commands.h"
#include "core/membw.h"
#include "model/draft_vocabulary.h"
#include "model/weights.h"

namespace dsinfer::cli {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Peak resident set of this process (VmHWM), 0 where /proc is not available.
int64_t PeakResidentBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmHWM:", 0) == 0) {
      std::istringstream in(line.substr(6));
      int64_t kib = 0;
      in >> kib;
      return kib * 1024;
    }
  return 0;
}

int64_t PhysicalMemoryBytes() {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? int64_t{pages} * page : 0;
}

// Resets the kernel's peak-RSS mark to the current RSS (Linux: "5" to clear_refs).
void ResetPeakResident() {
  if (std::FILE* f = std::fopen("/proc/self/clear_refs", "w")) {
    std::fputs("5", f);
    std::fclose(f);
  }
}

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One line of the report (and of the CSV).
struct BenchRow {
  const char* workload = "";  // prefill | decode | mixed
  int batch = 0;
  int64_t context = 0;
  int64_t tokens_per_step = 0;
  double tok_s = 0;
  double step_bytes = 0;  // distinct bytes the median step had to read
  double roofline_tok_s = 0;
  double share = -1;     // measured / roofline, median of per-step ratios; < 0: tok_s / roofline
  double read_gbps = 0;  // bandwidth the roofline uses: median of per-step probes; 0: the run's
  double step_macs = 0;  // multiply-adds of the median step (StepStats::macs)
};

// One workload's timed steps, each set against the bandwidth probed right before it.
struct StepSamples {
  std::vector<double> seconds, bytes, macs, shares, probes;  // [steps] each
  void Add(double step_s, double step_bytes, double step_macs, double gbps) {
    seconds.push_back(step_s);
    bytes.push_back(step_bytes);
    macs.push_back(step_macs);
    shares.push_back(step_bytes / (gbps * 1e9) / step_s);
    probes.push_back(gbps);
  }
};

class ModelBench {
 public:
  ModelBench(const model::ModelWeights& weights, backend::cpu::CpuModel& cpu, ThreadPool& pool,
             double read_gbps, double peak_gmacs, int repeats, int decode_steps, std::FILE* csv,
             int threads, backend::OpProfile* profile)
      : cpu_(cpu),
        profile_(profile),
        pool_(pool),
        read_gbps_(read_gbps),
        peak_gmacs_(peak_gmacs),
        repeats_(repeats),
        decode_steps_(decode_steps),
        csv_(csv),
        threads_(threads),
        dense_(model::DenseDecodeBytes(weights)),
        rng_(1),
        token_(2, weights.config().vocab_size - 1) {}

  // Extends `state` from its length to `context` in one prefill step (median of `repeats` runs,
  // each from a copy of the starting state); reports the chunk's rate.
  bool Prefill(std::unique_ptr<backend::cpu::SequenceState>& state, int64_t context) {
    std::vector<int32_t> chunk(context - state->n_tokens());  // [n] token ids
    for (auto& t : chunk) t = token_(rng_);
    std::vector<double> step_s;
    std::unique_ptr<backend::cpu::SequenceState> extended;
    ClearProfile();
    for (int r = 0; r < repeats_; ++r) {
      extended = state->Copy();
      backend::cpu::ForwardOutput out;
      backend::cpu::SequenceChunk c{extended.get(), chunk, {}, &out};
      auto t0 = std::chrono::steady_clock::now();
      if (!cpu_.ForwardBatch(std::span(&c, 1)).ok()) return false;
      step_s.push_back(Seconds(t0));
    }
    state = std::move(extended);
    const auto n = static_cast<int64_t>(chunk.size());
    Report({"prefill", 1, context, n, n / Median(step_s), StepBytes(), 0, -1, 0, StepMacs()});
    PrintProfile(repeats_);
    return true;
  }

  // Decode at batch B: B copies of `prefilled`, each fed its own random token per step, so
  // routing differs per sequence as in real traffic.
  bool Decode(const backend::cpu::SequenceState& prefilled, int batch) {
    std::vector<std::unique_ptr<backend::cpu::SequenceState>> states;
    for (int i = 0; i < batch; ++i)
      states.push_back(prefilled.Copy());
    StepSamples steps;
    std::vector<int32_t> toks(batch);  // [B] one new token per sequence
    std::vector<backend::cpu::ForwardOutput> outs(batch);
    std::vector<backend::cpu::SequenceChunk> chunks(batch);
    ClearProfile();
    for (int step = 0; step < decode_steps_; ++step) {
      for (int i = 0; i < batch; ++i) {
        toks[i] = token_(rng_);
        chunks[i] = {states[i].get(), std::span<const int32_t>(&toks[i], 1), {}, &outs[i]};
      }
      const double gbps = ProbeBandwidth();
      auto t0 = std::chrono::steady_clock::now();
      if (!cpu_.ForwardBatch(chunks).ok()) return false;
      steps.Add(Seconds(t0), StepBytes(), StepMacs(), gbps);
    }
    Report("decode", batch, prefilled.n_tokens(), batch, steps);
    PrintProfile(decode_steps_);
    return true;
  }

  // Continuous batching's typical step: B running decodes plus one new request's prefill chunk
  // of `chunk_len` tokens in the same forward. Throughput counts every token of the step.
  bool Mixed(const backend::cpu::SequenceState& prefilled, int batch, int chunk_len) {
    StepSamples steps;
    ClearProfile();
    for (int r = 0; r < repeats_; ++r) {
      std::vector<std::unique_ptr<backend::cpu::SequenceState>> states;
      for (int i = 0; i < batch; ++i)
        states.push_back(prefilled.Copy());
      auto fresh = cpu_.NewSequence();
      std::vector<int32_t> toks(batch + chunk_len);  // [B decode tokens | prefill chunk]
      for (auto& t : toks) t = token_(rng_);
      std::vector<backend::cpu::ForwardOutput> outs(batch + 1);
      std::vector<backend::cpu::SequenceChunk> chunks(batch + 1);
      for (int i = 0; i < batch; ++i)
        chunks[i] = {states[i].get(), std::span<const int32_t>(&toks[i], 1), {}, &outs[i]};
      backend::cpu::ForwardOptions mid_prompt;
      mid_prompt.want_logits = false;  // a chunk that ends mid-prompt needs no head
      chunks[batch] = {fresh.get(), std::span<const int32_t>(toks.data() + batch, chunk_len),
                       mid_prompt, &outs[batch]};
      const double gbps = ProbeBandwidth();
      auto t0 = std::chrono::steady_clock::now();
      if (!cpu_.ForwardBatch(chunks).ok()) return false;
      steps.Add(Seconds(t0), StepBytes(), StepMacs(), gbps);
    }
    Report("mixed", batch, prefilled.n_tokens(), batch + chunk_len, steps);
    PrintProfile(repeats_);
    return true;
  }

  // Speculative decoding's verify step at batch B: each sequence runs its pending token and k
  // drafts (k + 1 rows, every row's logits and final streams, as the engine asks), then rolls
  // back to where it was, for k = 0 (the plain decode step) .. max_k. Prints each step's cost
  // relative to the 1-row step, and the decode rate the measured costs give at draft acceptance
  // rates 0.5 / 0.7 / 0.9: with per-token acceptance a, a step emits (1 - a^(k+1)) / (1 - a)
  // tokens per sequence on average. With an MTP block (V4's mtp.0) the drafting is timed too,
  // as the engine runs it (Engine::AdvanceDrafts): one batched MTP call over the step's verified
  // rows with the head on the last (at most the k + 1 rows, all drafts accepted), then k - 1
  // chained one-row calls; the rate with drafts counts both.
  bool Verify(const backend::cpu::SequenceState& prefilled, int batch, int max_k) {
    std::vector<std::unique_ptr<backend::cpu::SequenceState>> states;
    for (int i = 0; i < batch; ++i) states.push_back(prefilled.Copy());
    std::vector<double> step_s(static_cast<size_t>(max_k) + 1);   // [k] median seconds
    std::vector<double> step_mb(static_cast<size_t>(max_k) + 1);  // [k] median MB read
    std::vector<double> draft_s(static_cast<size_t>(max_k) + 1);  // [k] median drafting seconds
    const bool mtp = cpu_.CheckMtpBlock().ok();    // a V4 MTP block (none: not Ok)
    const bool dspark = cpu_.CheckDspark().ok();   // V4.1's dSpark stages
    const bool drafts = mtp || dspark;
    // dSpark's rings hold every position before a draft: fed once (their values do not change
    // the cost), then each step feeds its verified rows as the engine does.
    if (dspark && !SeedRings(states)) return false;
    for (int k = 0; k <= max_k; ++k) {
      std::vector<double> samples, megabytes, draft_samples;
      std::vector<int32_t> toks(static_cast<size_t>(batch) * (k + 1));  // [B, k + 1]
      std::vector<backend::cpu::ForwardOutput> outs(batch);
      std::vector<backend::cpu::SequenceChunk> chunks(batch);
      const backend::cpu::ForwardOptions rows{.all_logits = k > 0, .want_hidden = k > 0};
      ClearProfile();
      for (int step = 0; step < decode_steps_; ++step) {
        for (auto& t : toks) t = token_(rng_);
        for (int i = 0; i < batch; ++i)
          chunks[i] = {states[i].get(),
                       std::span<const int32_t>(toks.data() + static_cast<int64_t>(i) * (k + 1),
                                                static_cast<size_t>(k) + 1),
                       rows, &outs[i]};
        auto t0 = std::chrono::steady_clock::now();
        if (!cpu_.ForwardBatch(chunks).ok()) return false;
        samples.push_back(Seconds(t0));
        megabytes.push_back(StepBytes() / 1e6);
        if (drafts && k > 0) {
          const double s_draft =
              dspark ? DraftDspark(states, outs, k) : Draft(states, toks, outs, k);
          if (s_draft < 0) return false;
          draft_samples.push_back(s_draft);
        }
        for (auto& st : states)
          if (!cpu_.Truncate(*st, prefilled.n_tokens()).ok()) return false;
      }
      step_s[k] = Median(samples);
      step_mb[k] = Median(megabytes);
      draft_s[k] = Median(draft_samples);
      if (profile_) std::printf("verify batch %d, k %d:\n", batch, k);
      PrintProfile(decode_steps_);
    }
    for (int k = 0; k <= max_k; ++k) {
      std::printf(
          "verify  batch %3d context %6lld: k %d (%d rows/seq): step %8.1f ms = %.3fx the "
          "1-row step, reads %7.1f MB",
          batch, static_cast<long long>(prefilled.n_tokens()), k, k + 1, step_s[k] * 1e3,
          step_s[k] / step_s[0], step_mb[k]);
      for (double a : {0.5, 0.7, 0.9}) {
        const double per_step = (1 - std::pow(a, k + 1)) / (1 - a);
        std::printf("  a=%.1f: %.2f tok/s (%.2fx)", a, batch * per_step / step_s[k],
                    per_step * step_s[0] / step_s[k]);
      }
      std::printf("\n");
      if (drafts && k > 0) {
        const double total = step_s[k] + draft_s[k];
        const std::string how = dspark ? "1 dSpark block + " + std::to_string(k) + " Markov rows"
                                       : std::to_string(k) + " MTP calls";
        std::printf("verify  batch %3d context %6lld: k %d with drafting (%s): %8.1f ms "
                    "+ %.1f ms = %.3fx the 1-row step",
                    batch, static_cast<long long>(prefilled.n_tokens()), k, how.c_str(),
                    step_s[k] * 1e3, draft_s[k] * 1e3, total / step_s[0]);
        for (double a : {0.5, 0.7, 0.9}) {
          const double per_step = (1 - std::pow(a, k + 1)) / (1 - a);
          std::printf("  a=%.1f: %.2f tok/s (%.2fx)", a, batch * per_step / total,
                      per_step * step_s[0] / total);
        }
        std::printf("\n");
      }
    }
    return true;
  }

 private:
  // The drafting after a verify step with k drafts per sequence, as Engine::AdvanceDrafts runs
  // it: each sequence's MTP stream catches up on the step's k + 1 rows (their final streams,
  // random next tokens) with the head on the last row, then k - 1 chained one-row calls on the
  // block's own last streams. The MTP streams start from position 0 (a fresh stream: at this
  // bench's contexts its window holds every row either way) and are rolled back after.
  // Returns the seconds of the MTP calls, or -1 when one fails.
  double Draft(std::vector<std::unique_ptr<backend::cpu::SequenceState>>& states,
               const std::vector<int32_t>& toks, const std::vector<backend::cpu::ForwardOutput>& outs,
               int k) {
    const size_t batch = states.size();
    std::vector<std::vector<float>> logits(batch), streams(batch), inputs(batch);
    std::vector<int32_t> prev(batch);  // [B] each chained call's input token
    std::vector<backend::cpu::MtpChunk> runs(batch);
    for (size_t i = 0; i < batch; ++i)
      runs[i] = {states[i].get(), outs[i].hidden,
                 std::span<const int32_t>(toks.data() + i * (k + 1), static_cast<size_t>(k) + 1),
                 &logits[i], k > 1 ? &streams[i] : nullptr};
    double seconds = 0;
    auto t0 = std::chrono::steady_clock::now();
    if (!cpu_.ForwardMtpBatch(runs).ok()) return -1;
    seconds += Seconds(t0);
    for (int j = 1; j < k; ++j) {
      for (size_t i = 0; i < batch; ++i) {
        prev[i] = token_(rng_);
        inputs[i] = streams[i];
        runs[i] = {states[i].get(), inputs[i], std::span<const int32_t>(&prev[i], 1), &logits[i],
                   j + 1 < k ? &streams[i] : nullptr};
      }
      t0 = std::chrono::steady_clock::now();
      if (!cpu_.ForwardMtpBatch(runs).ok()) return -1;
      seconds += Seconds(t0);
    }
    for (auto& st : states)
      if (!cpu_.TruncateMtp(*st, 0).ok()) return -1;
    return seconds;
  }

  // Feeds every state's dSpark rings up to its backbone length (zero hidden rows: the values do
  // not change what a draft costs). False when a call fails.
  bool SeedRings(std::vector<std::unique_ptr<backend::cpu::SequenceState>>& states) {
    const int64_t K = cpu_.HiddenWidth();
    for (auto& st : states) {
      const int64_t missing = st->n_tokens() - st->mtp_n_tokens();  // positions
      const std::vector<float> zeros(static_cast<size_t>(missing * K));  // [missing, K]
      if (zeros.empty()) continue;
      backend::cpu::SequenceState* one[] = {st.get()};
      const std::span<const float> rows[] = {zeros};
      if (!cpu_.DsparkSeedBatch(one, rows).ok()) return false;
    }
    return true;
  }

  // The drafting after a verify step with k drafts per sequence, as Engine::AdvanceDsparkDrafts
  // runs it for V4.1: the step's verified rows into every stage's ring (all k + 1, as if every
  // draft was accepted; a row more where the rollback took one back), one batched draft block,
  // then k batched Markov-bias-and-confidence calls (one per draft row). Rolled back after.
  // Returns the seconds of those calls, or -1 when one fails.
  double DraftDspark(std::vector<std::unique_ptr<backend::cpu::SequenceState>>& states,
                     const std::vector<backend::cpu::ForwardOutput>& outs, int k) {
    const size_t batch = states.size();
    const int64_t K = cpu_.HiddenWidth(), D = cpu_.config().hidden;
    std::vector<std::vector<float>> rows(batch);  // [B][n - mtp, K]
    std::vector<backend::cpu::SequenceState*> seqs(batch);
    std::vector<std::span<const float>> hidden(batch);
    for (size_t i = 0; i < batch; ++i) {
      auto& st = *states[i];
      const int64_t missing = st.n_tokens() - st.mtp_n_tokens() - (k + 1);
      rows[i].assign(static_cast<size_t>(std::max<int64_t>(missing, 0) * K), 0.0f);
      rows[i].insert(rows[i].end(), outs[i].hidden.begin(), outs[i].hidden.end());
      seqs[i] = &st;
      hidden[i] = rows[i];
    }
    std::vector<int32_t> tokens(batch);
    for (auto& t : tokens) t = token_(rng_);
    std::vector<std::vector<float>> logits(batch), x(batch);
    std::vector<std::vector<float>*> lo(batch), xo(batch);
    for (size_t i = 0; i < batch; ++i) lo[i] = &logits[i], xo[i] = &x[i];
    auto t0 = std::chrono::steady_clock::now();
    if (!cpu_.DsparkSeedBatch(seqs, hidden).ok()) return -1;
    const std::vector<int> n_logits(batch, k);  // the engine's head rows: the drafts wanted
    if (!cpu_.DsparkDraftBatch(seqs, tokens, lo, xo, n_logits).ok()) return -1;
    std::vector<float> bias, conf, xr;  // [B, vocab], [B], [B, hidden]
    for (int j = 0; j < k; ++j) {
      xr.clear();
      for (size_t i = 0; i < batch; ++i)
        xr.insert(xr.end(), x[i].begin() + j * D, x[i].begin() + (j + 1) * D);
      if (!cpu_.DsparkMarkov(tokens, xr, &bias, &conf).ok()) return -1;
      for (auto& t : tokens) t = token_(rng_);  // the drafts just sampled
    }
    const double seconds = Seconds(t0);
    const int64_t back = states[0]->n_tokens() - (k + 1);
    for (auto& st : states)
      if (!cpu_.TruncateMtp(*st, back).ok()) return -1;
    return seconds;
  }

  // --profile: each workload's timed steps are profiled op by op (backend/op_profile.h); the
  // table follows its row (the verify sweep: one table per k, before its rows).
  void ClearProfile() {
    if (profile_) profile_->Clear();
  }
  void PrintProfile(int steps) {
    if (profile_) std::printf("%s\n", profile_->Table(steps).c_str());
  }

  // A short read-bandwidth probe right before a step: on a shared machine the bandwidth drifts
  // by 2x within a minute, so each step is set against the bandwidth of its own moment and the
  // reported share is the median of those per-step ratios. The probe's 256 MiB buffer (twice
  // the last-level cache of the machines seen) is freed again; the peak-RSS mark is carried
  // over the probe so the reported peak stays the model's own.
  double ProbeBandwidth() {
    peak_rss_ = std::max(peak_rss_, PeakResidentBytes());
    const double gbps = MeasureMemoryBandwidth(pool_, int64_t{256} << 20, 1, false).read_gbps;
    ResetPeakResident();
    return gbps > 0 ? gbps : read_gbps_;
  }

  int64_t PeakRss() const { return std::max(peak_rss_, PeakResidentBytes()); }

  // The last step's distinct bytes: dense weights once, each routed expert that got a token
  // once, and the sequence state attention read.
  double StepBytes() const {
    const auto& st = cpu_.last_step_stats();
    return static_cast<double>(dense_ + st.routed_expert_bytes + st.kv_bytes);
  }

  double StepMacs() const { return static_cast<double>(cpu_.last_step_stats().macs); }

  // A row from the medians of probed steps.
  void Report(const char* workload, int batch, int64_t context, int64_t tokens_per_step,
              const StepSamples& steps) {
    Report({workload, batch, context, tokens_per_step, tokens_per_step / Median(steps.seconds),
            Median(steps.bytes), 0, Median(steps.shares), Median(steps.probes),
            Median(steps.macs)});
  }

  // The bandwidth roofline: a step cannot finish before its distinct bytes have been read once,
  // so it runs at most tokens_per_step / (bytes / bandwidth) tokens per second. Beside it, the
  // compute roof: nor can it finish before its multiply-adds have run at the cores' measured
  // peak. The share is against the bandwidth roofline; where the compute roof is the lower one,
  // no kernel can reach 100 % of the bandwidth roofline on this machine.
  void Report(BenchRow row) {
    if (row.read_gbps <= 0) row.read_gbps = read_gbps_;
    double floor_s = row.step_bytes / (row.read_gbps * 1e9);
    row.roofline_tok_s = floor_s > 0 ? row.tokens_per_step / floor_s : 0;
    const double compute_s = peak_gmacs_ > 0 ? row.step_macs / (peak_gmacs_ * 1e9) : 0;
    const double compute_roof = compute_s > 0 ? row.tokens_per_step / compute_s : 0;
    std::printf("%-7s batch %3d context %6lld: %9.3f tok/s  step reads %8.1f MB  ", row.workload,
                row.batch, static_cast<long long>(row.context), row.tok_s, row.step_bytes / 1e6);
    const double share = row.share >= 0           ? row.share
                         : row.roofline_tok_s > 0 ? row.tok_s / row.roofline_tok_s
                                                  : 0.0;
    std::printf("roofline %9.3f tok/s  %5.1f%%  compute roof %9.3f tok/s  peak RSS %.2f GB\n",
                row.roofline_tok_s, 100.0 * share, compute_roof, PeakRss() / 1e9);
    if (csv_)
      std::fprintf(csv_, "%s,%d,%lld,%d,%.3f,%.4f,%.0f,%.4f,%.4f,%lld,%.0f,%.3f,%.4f\n",
                   row.workload, row.batch, static_cast<long long>(row.context), threads_,
                   row.read_gbps, row.tok_s, row.step_bytes, row.roofline_tok_s, share,
                   static_cast<long long>(PeakRss()), row.step_macs, peak_gmacs_, compute_roof);
  }

  backend::cpu::CpuModel& cpu_;
  backend::OpProfile* profile_;  // --profile; null: none
  ThreadPool& pool_;
  int64_t peak_rss_ = 0;  // the peak-RSS mark before the last bandwidth probe reset it
  double read_gbps_;
  double peak_gmacs_;  // the cores' measured multiply-add peak (backend/cpu/peak.h); 0: none
  int repeats_, decode_steps_;
  std::FILE* csv_;
  int threads_;
  int64_t dense_;
  std::mt19937 rng_;
  std::uniform_int_distribution<int> token_;
};

}  // namespace

int RunBench(int argc, char** argv) {
  const char* usage =
      "dsinfer bench model --model DIR [--context 512,1024,2048,4096] [--batch 1,4,16,64] "
      "[--mixed-chunk N] [--verify K [--speculative-token-map FILE]] [--decode N] [--repeats N] "
      "[--threads N] [--numa off|distribute|isolate|numactl] [--memory BYTES] "
      "[--csv FILE] [--profile] "
      "[--numerics official|fp32-reference] [--weights auto|map|copy]";
  // bench serve: the load generator against an HTTP endpoint (cmd_bench_serve.cc).
  if (argc >= 2 && std::strcmp(argv[1], "serve") == 0) return RunBenchServe(argc - 1, argv + 1);
  if (argc < 2 || std::strcmp(argv[1], "model") != 0) {
    std::fprintf(stderr, "usage: %s\n", usage);
    return 2;
  }
  Args args;
  if (!args.Parse(
          argc - 1, argv + 1,
          {"model", "context", "prompt-len", "decode", "repeats", "threads", "csv", "numerics",
           "batch", "mixed-chunk", "memory", "weights", "verify", "speculative-token-map", "numa"},
          {"profile"}) ||
      !args.Has("model")) {
    std::fprintf(stderr, "dsinfer: %s\nusage: %s\n", args.error().c_str(), usage);
    return 2;
  }
  long long decode = 8, repeats = 3, threads = 0, mixed_chunk = 256, memory = 0, verify = 0;
  if (!args.GetInt("decode", &decode) || !args.GetInt("repeats", &repeats) ||
      !args.GetInt("threads", &threads) || !args.GetInt("mixed-chunk", &mixed_chunk) ||
      !args.GetInt("memory", &memory) || !args.GetInt("verify", &verify) || verify < 0 ||
      verify > 8 || decode < 1 || repeats < 1 || mixed_chunk < 0 || memory < 0 || threads < 0) {
    std::fprintf(stderr, "dsinfer: %s\nusage: %s\n", args.error().c_str(), usage);
    return 2;
  }
  // --prompt-len N is the older spelling of a single frontier.
  std::vector<int32_t> contexts, batches;
  if (!ParseIdList(args.GetOr("context", args.GetOr("prompt-len", "512,1024,2048,4096")),
                   &contexts) ||
      !ParseIdList(args.GetOr("batch", "1,4,16,64"), &batches) || contexts.empty() ||
      batches.empty()) {
    std::fprintf(stderr, "dsinfer: --context and --batch take lists like 512,1024 / 1,4,16\n");
    return 2;
  }
  std::sort(contexts.begin(), contexts.end());
  if (contexts.front() < 1 || *std::min_element(batches.begin(), batches.end()) < 1) {
    std::fprintf(stderr, "dsinfer: contexts and batch sizes must be >= 1\n");
    return 2;
  }
  backend::Numerics numerics = args.GetOr("numerics", "official") == "official"
                                   ? backend::Numerics::Official()
                                   : backend::Numerics::Fp32Reference();
  const auto residency = WeightResidencyFlag(args);
  if (!residency) {
    std::fprintf(stderr, "dsinfer: %s\nusage: %s\n", kWeightResidencyFlagError, usage);
    return 2;
  }
  const std::optional<CpuPlacement> placement =
      CpuPlacementOrPrint(args, /*device=*/-1, static_cast<int>(threads), "bench");
  if (!placement) return 2;
  auto weights = LoadWeightsOrPrint(*args.Get("model"), *residency, "bench", 0, placement->weights);
  if (weights == nullptr) return 1;
  const auto& c = weights->config();
  ThreadPool pool(placement->n_threads, placement->cpus);
  if (const Status pinned = pool.placement_status(); !pinned.ok()) {
    std::fprintf(stderr, "dsinfer bench: --numa: %s\n", pinned.ToString().c_str());
    return 1;
  }
  std::fprintf(stderr, "model: %s\nthreads: %d, numerics: %s\n", c.Summary().c_str(), pool.size(),
               numerics.Name().c_str());
  BandwidthResult bw = MeasureMemoryBandwidth(pool);
  std::fprintf(stderr, "memory bandwidth (read, median of 5): %.2f GB/s; copy %.2f GB/s\n",
               bw.read_gbps, bw.copy_gbps);
  // The probe's buffers are freed; reset the peak-RSS mark so the reported peak is the model's.
  ResetPeakResident();
  const backend::cpu::ComputePeak peak = backend::cpu::MeasureComputePeak(pool);
  std::fprintf(stderr, "compute peak (%s, %d threads): %.1f GFLOP/s\n",
               backend::cpu::PeakUnitName(peak.unit), pool.size(), 2 * peak.gmacs);
  auto cpu = backend::cpu::CpuModel::Create(*weights, numerics, pool);
  if (!cpu.ok()) {
    std::fprintf(stderr, "dsinfer: %s\n", cpu.status().ToString().c_str());
    return 1;
  }
  // --speculative-token-map: the drafting --verify times proposes from that draft vocabulary.
  if (auto map = args.Get("speculative-token-map")) {
    auto ids = model::ReadDraftVocabulary(*map, c.vocab_size);
    const Status st = ids.ok() ? (*cpu)->UseDraftVocabulary(std::move(ids).value()) : ids.status();
    if (!st.ok()) {
      std::fprintf(stderr, "dsinfer: --speculative-token-map: %s\n", st.ToString().c_str());
      return 1;
    }
  }
  // State memory: the largest batch's copies of the state at each frontier must fit in
  // --memory (default half the RAM); larger frontiers are skipped, saying why.
  const int64_t budget = memory > 0 ? memory : PhysicalMemoryBytes() / 2;
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  // The window ring is a fixed cost; compressed rows and indexer keys grow with the context, so
  // both the whole state and its marginal cost per token are shown.
  for (int32_t ctx : contexts) {
    int64_t at = (*cpu)->StateBytesAt(ctx), twice = (*cpu)->StateBytesAt(int64_t{2} * ctx);
    std::printf("sequence state at context %d: %.2f MB (%.1f KB/token; marginal %.0f B/token)\n",
                ctx, at / 1e6, at / 1e3 / ctx, static_cast<double>(twice - at) / ctx);
  }
  std::FILE* csv = nullptr;
  if (auto path = args.Get("csv")) {
    csv = std::fopen(path->c_str(), "w");
    if (!csv) {
      std::fprintf(stderr, "dsinfer: cannot write %s\n", path->c_str());
      return 1;
    }
    std::fprintf(csv,
                 "workload,batch,context,threads,bandwidth_gbps,tok_s,step_bytes,roofline_tok_s,"
                 "ratio,peak_rss_bytes,step_macs,peak_gmacs,compute_roof_tok_s\n");
  }
  // --profile times every op of the measured steps; the per-call clock reads (two per op, some
  // hundreds per step) cost microseconds against steps of tens of milliseconds and more.
  backend::OpProfile profile;
  backend::OpProfile* const op_profile = args.Has("profile") ? &profile : nullptr;
  (*cpu)->set_op_profile(op_profile);
  ModelBench bench(*weights, **cpu, pool, bw.read_gbps, peak.gmacs, static_cast<int>(repeats),
                   static_cast<int>(decode), csv, pool.size(), op_profile);
  // One sequence grows from frontier to frontier (each prefill step is the chunk between two
  // frontiers); decode and mixed steps run on copies of it at each frontier.
  auto state = (*cpu)->NewSequence();
  int status = 0;
  for (int32_t ctx : contexts) {
    int64_t need = (*cpu)->StateBytesAt(ctx) * (max_batch + 1);
    if (need > budget) {
      std::printf("context %d skipped: batch %d needs %.2f GB of state, over %.2f GB\n", ctx,
                  max_batch, need / 1e9, budget / 1e9);
      break;
    }
    if (ctx == state->n_tokens()) continue;  // duplicate frontier
    if (!bench.Prefill(state, ctx)) {
      status = 1;
      break;
    }
    for (int32_t b : batches)
      if (!bench.Decode(*state, b)) {
        status = 1;
        break;
      }
    if (verify > 0)
      for (int32_t b : batches)
        if (!bench.Verify(*state, b, static_cast<int>(verify))) {
          status = 1;
          break;
        }
    if (mixed_chunk > 0)
      for (int32_t b : batches)
        if (!bench.Mixed(*state, b, static_cast<int>(mixed_chunk))) {
          status = 1;
          break;
        }
    if (status) break;
  }
  if (csv) std::fclose(csv);
  std::printf(
      "peak resident memory: %.2f GB (%s)\n", PeakResidentBytes() / 1e9,
      weights->copied() ? "weights copied into memory" : "weights are mmapped: pages read count");
  if (status) std::fprintf(stderr, "dsinfer: a forward step failed\n");
  return status;
}

}  // namespace dsinfer::cli
