// dsinfer: one binary, many subcommands. This file only dispatches.
#include <cstdio>
#include <cstring>
#include <string_view>

#include "commands.h"

namespace {

struct Command {
  const char* name;
  int (*run)(int, char**);
  const char* help;
};

constexpr Command kCommands[] = {
    {"create-demo-model", dsinfer::cli::RunCreateDemoModel,
     "write a random-weight checkpoint in the official layout"},
    {"generate", dsinfer::cli::RunGenerate, "generate tokens from a prompt"},
    {"logits", dsinfer::cli::RunLogits, "write per-position float32 logits as safetensors"},
    {"bench", dsinfer::cli::RunBench, "benchmarks (bench model ...)"},
    {"inspect", dsinfer::cli::RunInspect, "validate a checkpoint and print its configuration"},
    {"tokenize", dsinfer::cli::RunTokenize, "JSON-lines strings -> token id arrays"},
    {"detokenize", dsinfer::cli::RunDetokenize, "JSON-lines id arrays -> strings"},
    {"render", dsinfer::cli::RunRender, "render an OpenAI chat request to the prompt and ids"},
    {"serve", dsinfer::cli::RunServe, "OpenAI/Anthropic-compatible HTTP server (docs/SERVER.md)"},
    {"doctor", dsinfer::cli::RunDoctor, "CPU/GPU features, conformance, probes, verdicts [--json]"},
    {"draft-vocabulary", dsinfer::cli::RunDraftVocabulary,
     "the N most frequent token ids of a corpus (serve --speculative-token-map)"},
    {"compare", dsinfer::cli::RunCompare,
     "compare logits files / a golden, or two endpoints' greedy logprobs"},
};

void PrintUsage() {
  std::fprintf(stderr, "usage: dsinfer <command> [options]\n\ncommands:\n");
  for (const auto& c : kCommands) std::fprintf(stderr, "  %-18s %s\n", c.name, c.help);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    PrintUsage();
    return argc < 2 ? 2 : 0;
  }
  std::string_view name = argv[1];
  for (const auto& c : kCommands)
    if (name == c.name) return c.run(argc - 1, argv + 1);
  std::fprintf(stderr, "dsinfer: unknown command '%s'\n", argv[1]);
  PrintUsage();
  return 2;
}
