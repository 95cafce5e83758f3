// What a structured output costs per drawn token on the engine: the grammar's mask for the next
// token (xgrammar's matcher), applying it to a V4-size logits row, and taking the drawn token,
// walked along a typical output of each grammar with the real V4 tokenizer. Median and p99 over
// the walk's tokens, each repeated. Beside a decode step of tens of milliseconds on the CPU (and
// a few on a GPU) this is the whole per-token price of a constraint (docs/PERF.md).
//   build/bench/grammar_mask_bench [--tokenizer tests/fixtures/tokenizer/deepseek-v4/tokenizer.json]
//                                  [--repeats 20]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "grammar/grammar.h"
#include "text/tokenizer.h"

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer_path = std::string(DSINFER_BENCH_SOURCE_DIR) +
                               "/tests/fixtures/tokenizer/deepseek-v4/tokenizer.json";
  int repeats = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tokenizer")) tokenizer_path = argv[i + 1];
    if (!std::strcmp(argv[i], "--repeats")) repeats = std::max(1, std::atoi(argv[i + 1]));
  }
  auto tok = dsinfer::text::Tokenizer::FromFile(tokenizer_path);
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", tok.status().ToString().c_str());
    return 2;
  }
  constexpr int32_t kVocab = 129280;  // the model's logits row (V4)
  // As the server builds it (server/structured_output.cc): added tokens are never text.
  dsinfer::grammar::Vocabulary vocabulary;
  vocabulary.vocab_size = kVocab;
  vocabulary.token_bytes.resize(std::min(tok->vocab_size(), kVocab));
  for (int32_t id = 0; id < static_cast<int32_t>(vocabulary.token_bytes.size()); ++id)
    if (const std::string* bytes = tok->TokenBytes(id); bytes && !tok->IsAddedToken(id))
      vocabulary.token_bytes[id] = *bytes;
  if (tok->eos_id()) vocabulary.stop_token_ids = {*tok->eos_id()};
  auto compiler = dsinfer::grammar::Compiler::Create(vocabulary);
  if (!compiler.ok()) return 2;

  using dsinfer::grammar::GrammarKind;
  struct Case {
    const char* name;
    dsinfer::grammar::GrammarSpec spec;
    std::string output;  // a typical output the walk takes, token by token
  };
  const std::vector<Case> cases = {
      {"json schema, strings",
       {.kind = GrammarKind::kJsonSchema,
        .text = R"j({"type":"object","properties":{"notes":{"type":"array","items":)j"
                R"j({"type":"string"}}},"required":["notes"]})j"},
       R"j({"notes": ["hello world, this is", "a test of the grammar", "more words here"]})j"},
      {"json schema, numbers+enums",
       {.kind = GrammarKind::kJsonSchema,
        .text = R"j({"type":"object","properties":{"id":{"type":"integer","minimum":0},)j"
                R"j("kind":{"enum":["alpha","beta"]},"score":{"type":"number"},)j"
                R"j("ok":{"type":"boolean"}},"required":["id","kind","score","ok"]})j"},
       R"j({"id": 12345, "kind": "beta", "score": 3.25, "ok": true})j"},
      {"regex", {.kind = GrammarKind::kRegex, .text = "[A-Z][a-z]+( [a-z]+){3,8}\\."},
       "Structured outputs cost little per token."},
  };
  std::printf("| grammar | tokens | fill median | fill p99 | apply median | apply p99 | accept "
              "median |\n|---|---|---|---|---|---|---|\n");
  std::vector<float> logits(kVocab);  // [vocab] f32
  std::vector<uint32_t> bitmask(dsinfer::grammar::BitmaskWords(kVocab));
  for (const Case& c : cases) {
    auto compiled = (*compiler)->Compile(c.spec);
    auto ids = tok->Encode(c.output, /*allow_special=*/false);
    if (!compiled.ok() || !ids.ok()) {
      std::fprintf(stderr, "%s: %s\n", c.name,
                   compiled.ok() ? "encode" : compiled.status().ToString().c_str());
      return 2;
    }
    std::vector<double> fill, apply, accept;
    for (int r = 0; r < repeats; ++r) {
      auto matcher = dsinfer::grammar::Matcher::Create(*compiled);
      if (!matcher.ok()) return 2;
      for (int32_t id : *ids) {
        std::fill(logits.begin(), logits.end(), 0.5f);
        const double t0 = Now();
        if (!(*matcher)->FillNextTokenBitmask(bitmask).ok()) return 2;
        const double t1 = Now();
        dsinfer::grammar::ApplyBitmask(logits, bitmask);
        const double t2 = Now();
        if (!(*matcher)->AcceptToken(id)) {
          std::fprintf(stderr, "%s: the walk left the grammar\n", c.name);
          return 2;
        }
        const double t3 = Now();
        fill.push_back((t1 - t0) * 1e6);
        apply.push_back((t2 - t1) * 1e6);
        accept.push_back((t3 - t2) * 1e6);
      }
    }
    std::printf("| %s | %zu | %.1f us | %.1f us | %.1f us | %.1f us | %.1f us |\n", c.name,
                ids->size(), Quantile(fill, 0.5), Quantile(fill, 0.99), Quantile(apply, 0.5),
                Quantile(apply, 0.99), Quantile(accept, 0.5));
  }
  return 0;
}
