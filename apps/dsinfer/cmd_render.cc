// Placeholder until the text layer lands; replaced by the tokenizer/chat work.
#include <cstdio>
#include "commands.h"
namespace dsinfer::cli {
int RunRender(int, char**) { std::fprintf(stderr, "not built yet\n"); return 1; }
}
