// The service fuzz target's corpus (tests/fuzz/corpus_service) replayed in process under the
// same rules (service_harness.h), so CI, which builds no fuzzer, keeps every entry and every
// reproducer of a past finding passing; and the request fields whose wrong JSON type used to
// throw out of a handler (answered 500 "no response" by the connection thread's guard).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "service_harness.h"

namespace dsinfer::server::testing {
namespace {

TEST(ServiceCorpus, EveryEntryGetsADocumentedWellFormedReply) {
  const std::filesystem::path dir =
      std::filesystem::path(DSINFER_SOURCE_DIR) / "tests/fuzz/corpus_service";
  int entries = 0, accepted = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string input((std::istreambuf_iterator<char>(in)), {});
    const Reply reply = Service().PostFuzzInput(input);
    EXPECT_EQ(reply.violation, "")
        << entry.path() << ": status " << reply.status << " " << reply.body.substr(0, 300);
    ++entries;
    accepted += reply.status == 200;
  }
  EXPECT_GE(entries, 13);
  // The seeds are valid requests of every endpoint: most must get past validation, or the
  // fuzzer starts from error paths only.
  EXPECT_GE(accepted, 13);
}

// Each case: a field of the wrong JSON type, and the path the 400 must name.
struct WrongType {
  const char* endpoint;
  const char* body;
  const char* names;
};

TEST(ServiceCorpus, FieldsOfTheWrongTypeAreA400NamingThem) {
  const WrongType cases[] = {
      {"/v1/responses", R"({"input":[{"role":5,"content":"hi"}]})", "input[0].role"},
      {"/v1/responses", R"({"input":[{"type":["message"],"content":"hi"}]})", "input[0].type"},
      {"/v1/responses", R"({"input":[{"role":"user","content":[{"type":1,"text":"x"}]}]})",
       "input[0].content.type"},
      {"/v1/responses",
       R"({"input":[{"type":"function_call","name":"f","call_id":7},{"type":"function_call_output","call_id":7,"output":"o"}]})",
       "input[0].call_id"},
      {"/v1/responses", R"({"input":"hi","tools":[{"type":"function","name":{}}]})",
       "tools[0].name"},
      {"/v1/responses", R"({"input":"hi","text":{"format":{"type":3}}})", "text.format.type"},
      {"/v1/responses", R"({"input":"hi","store":"yes"})", "store"},
      {"/v1/responses", R"({"input":"hi","parallel_tool_calls":1})", "parallel_tool_calls"},
      {"/v1/messages", R"({"max_tokens":8,"messages":[{"role":1,"content":"hi"}]})",
       "messages[0].role"},
      {"/v1/messages", R"({"max_tokens":8,"messages":[{"role":"user","content":[{"type":2}]}]})",
       "messages[0].content[0].type"},
      {"/v1/messages",
       R"({"max_tokens":8,"messages":[{"role":"user","content":"q"},{"role":"assistant","content":[{"type":"tool_use","name":"f","id":9,"input":{}}]}]})",
       "messages[1].content[0].id"},
      {"/v1/messages",
       R"({"max_tokens":8,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":[1]}]}]})",
       "messages[0].content[0].tool_use_id"},
      {"/v1/messages",
       R"({"max_tokens":8,"messages":[{"role":"user","content":"q"}],"tools":[{"name":"f","type":false}]})",
       "tools[0].type"},
      {"/v1/messages",
       R"({"max_tokens":8,"messages":[{"role":"user","content":"q"}],"tool_choice":{"type":"tool","name":4}})",
       "tool_choice.name"},
      {"/v1/messages", R"({"max_tokens":8,"system":[{"type":null,"text":"s"}],"messages":[]})",
       "system"},
  };
  for (const auto& c : cases) {
    const Reply reply = Service().Post(c.endpoint, c.body, "ok");
    EXPECT_EQ(reply.violation, "") << c.body;
    EXPECT_EQ(reply.status, 400) << c.body << " -> " << reply.body;
    EXPECT_NE(reply.body.find(c.names), std::string::npos) << c.body << " -> " << reply.body;
  }
}

// Fields echoed into the response object take any shape the request legally has.
TEST(ServiceCorpus, ResponsesEchoReasoningOfAnyShape) {
  for (const char* body :
       {R"({"input":"hi","reasoning":"high"})", R"({"input":"hi","reasoning":{"effort":"high"}})",
        R"({"input":"hi","reasoning":null})"}) {
    const Reply reply = Service().Post("/v1/responses", body, "<think>r</think>ok");
    EXPECT_EQ(reply.violation, "") << body;
    EXPECT_EQ(reply.status, 200) << body << " -> " << reply.body;
  }
}

// An engine that refuses a request, or fails after two tokens, gets a well-formed answer on every
// protocol, streamed or not: a 429 for the refusal; for the failure a 500 with an error body, or,
// once a stream has begun, an error the stream itself carries.
TEST(ServiceCorpus, EngineFailuresGetWellFormedErrors) {
  struct Endpoint {
    const char* path;
    const char* body;  // without the closing brace, so that "stream" can be appended
  };
  const Endpoint endpoints[] = {
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}])"},
      {"/v1/completions", R"({"prompt":"hi")"},
      {"/v1/responses", R"({"input":"hi")"},
      {"/v1/messages", R"({"max_tokens":16,"messages":[{"role":"user","content":"hi"}])"},
  };
  for (const auto& e : endpoints) {
    for (bool stream : {false, true}) {
      const std::string body = std::string(e.body) + (stream ? R"(,"stream":true})" : "}");
      const std::string what = std::string(e.path) + " " + body;
      const Reply refused = Service().Post(e.path, body, "ok", EngineFailure::kRefuse);
      EXPECT_EQ(refused.violation, "") << what;
      EXPECT_EQ(refused.status, 429) << what << " -> " << refused.body;
      const Reply failed =
          Service().Post(e.path, body, "one two three four", EngineFailure::kMidStream);
      EXPECT_EQ(failed.violation, "") << what;
      EXPECT_EQ(failed.status, stream ? 200 : 500) << what << " -> " << failed.body;
      EXPECT_NE(failed.body.find("injected engine failure"), std::string::npos)
          << what << " -> " << failed.body;
    }
  }
}

}  // namespace
}  // namespace dsinfer::server::testing
