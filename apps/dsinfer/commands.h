// Subcommands of the dsinfer binary. Each lives in its own cmd_*.cc and returns a process
// exit code (0 ok, 1 runtime failure, 2 usage error). argv[0] is the subcommand name.
#pragma once

namespace dsinfer::cli {

int RunCreateDemoModel(int argc, char** argv);
int RunGenerate(int argc, char** argv);
int RunLogits(int argc, char** argv);
int RunBench(int argc, char** argv);
int RunBenchServe(int argc, char** argv);  // cmd_bench_serve.cc, via `bench serve`
int RunInspect(int argc, char** argv);
int RunTokenize(int argc, char** argv);
int RunDetokenize(int argc, char** argv);
int RunRender(int argc, char** argv);
int RunServe(int argc, char** argv);
int RunDoctor(int argc, char** argv);
int RunCompare(int argc, char** argv);  // cmd_compare.cc: `compare logits|endpoints`
int RunDraftVocabulary(int argc, char** argv);

}  // namespace dsinfer::cli
