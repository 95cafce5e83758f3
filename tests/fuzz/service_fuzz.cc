// libFuzzer target for the HTTP API behind the sockets: server::Service::Handle with the real V4
// tokenizer and an engine that "generates" text taken from the input (tests/server/
// service_harness.h has the input layout and the rules every reply is checked against). A
// broken rule aborts with the rule printed. DSINFER_FUZZ_VERBOSE=1 prints every status and
// non-200 body, to see which corpus entries get past validation.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "service_harness.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using dsinfer::server::testing::InProcessService;
  static InProcessService* service = [] {
    auto tokenizer = dsinfer::text::Tokenizer::FromFile(InProcessService::TokenizerPath());
    if (!tokenizer.ok()) std::abort();
    return new InProcessService(std::move(tokenizer).value());
  }();
  const auto reply =
      service->PostFuzzInput(std::string_view(reinterpret_cast<const char*>(data), size));
  if (std::getenv("DSINFER_FUZZ_VERBOSE") != nullptr)
    std::fprintf(stderr, "status %d %s\n", reply.status,
                 reply.status == 200 ? "" : reply.body.c_str());
  if (!reply.violation.empty()) {
    std::fprintf(stderr, "broken rule: %s\n", reply.violation.c_str());
    std::abort();
  }
  return 0;
}
