// The hostile-input table of docs/SERVER.md, row by row: each class of bad input, the status and
// error type it gets, on the API it concerns. (The HTTP-level rows, 401/404/405/408/413/431, are
// checked over sockets by service_test.cc and tests/server/test_hostile.py.)
#include <gtest/gtest.h>

#include <string>

#include "service_harness.h"

namespace dsinfer::server::testing {
namespace {

using Json = nlohmann::ordered_json;

struct Row {
  const char* what;  // the docs table's class
  const char* path;
  std::string body;
  int status;
  const char* type;  // error type in the API's shape
};

const std::string kUser = R"("messages":[{"role":"user","content":"x"}])";
const std::string kTool =
    R"("tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}])";

TEST(HostileInput, EveryClassGetsItsDocumentedStatusAndType) {
  const Row rows[] = {
      {"not JSON", "/v1/chat/completions", "{not json", 400, "invalid_request_error"},
      {"JSON that is not an object", "/v1/messages", "[1,2]", 400, "invalid_request_error"},
      {"nesting deeper than 64", "/v1/chat/completions",
       std::string(100, '[') + std::string(100, ']'), 400, "invalid_request_error"},
      {"ill-formed UTF-8", "/v1/chat/completions",
       R"({"messages":[{"role":"user","content":")" + std::string("\xff\xfe") + "\"}]}", 400,
       "invalid_request_error"},
      {"wrong field type", "/v1/chat/completions", "{" + kUser + R"(,"temperature":"hot"})", 400,
       "invalid_request_error"},
      {"value out of range", "/v1/chat/completions", "{" + kUser + R"(,"n":17})", 400,
       "invalid_request_error"},
      {"unknown role", "/v1/chat/completions", R"({"messages":[{"role":"bot","content":"x"}]})",
       400, "invalid_request_error"},
      {"empty messages", "/v1/chat/completions", R"({"messages":[]})", 400,
       "invalid_request_error"},
      {"empty messages (Anthropic)", "/v1/messages", R"({"max_tokens":4,"messages":[]})", 400,
       "invalid_request_error"},
      {"empty input (Responses)", "/v1/responses", R"({"input":[]})", 400, "invalid_request_error"},
      {"empty model name", "/v1/chat/completions", "{" + kUser + R"(,"model":""})", 404,
       "invalid_request_error"},
      {"unknown model", "/v1/chat/completions", "{" + kUser + R"(,"model":"gpt-4o"})", 404,
       "invalid_request_error"},
      {"logit_bias id outside the vocabulary", "/v1/chat/completions",
       "{" + kUser + R"(,"logit_bias":{"99999999":5}})", 400, "invalid_request_error"},
      {"thinking.budget_tokens of the wrong type", "/v1/messages",
       R"({"max_tokens":4,"messages":[{"role":"user","content":"x"}],"thinking":{"type":"enabled","budget_tokens":"lots"}})",
       400, "invalid_request_error"},
      {"image input (Chat)", "/v1/chat/completions",
       R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:,"}}]}]})",
       422, "invalid_request_error"},
      {"image input (Messages)", "/v1/messages",
       R"({"max_tokens":4,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AA=="}}]}]})",
       422, "invalid_request_error"},
      {"image input (Responses)", "/v1/responses",
       R"({"input":[{"role":"user","content":[{"type":"input_image","image_url":"data:,"}]}]})",
       422, "invalid_request_error"},
      {"FIM suffix", "/v1/completions", R"({"prompt":"x","suffix":"y"})", 422,
       "invalid_request_error"},
      {"previous_response_id", "/v1/responses", R"({"input":"x","previous_response_id":"r"})", 422,
       "invalid_request_error"},
      {"regex output constraint that does not compile", "/v1/chat/completions",
       "{" + kUser + R"(,"response_format":{"type":"regex","regex":"(a"}})", 400,
       "invalid_request_error"},
      {"two output constraints at once", "/v1/chat/completions",
       "{" + kUser + R"(,"guided_regex":"a","guided_choice":["b"]})", 400,
       "invalid_request_error"},
      {"forced tool choice in thinking mode", "/v1/chat/completions",
       "{" + kUser + "," + kTool + R"(,"tool_choice":"required"})", 400, "invalid_request_error"},
      {"tool name outside [a-zA-Z0-9_-]", "/v1/chat/completions",
       "{" + kUser + R"(,"tools":[{"type":"function","function":{"name":"a b"}}]})", 400,
       "invalid_request_error"},
      {"prefix message with tools", "/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"a","prefix":true}],)" +
           kTool + "}",
       400, "invalid_request_error"},
      {"tool result answering no call", "/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"x"},{"role":"tool","tool_call_id":"c","content":"r"}]})",
       400, "invalid_request_error"},
      {"json_object without the word json", "/v1/chat/completions",
       "{" + kUser + R"(,"response_format":{"type":"json_object"}})", 400, "invalid_request_error"},
      {"max_tokens over the server's limit", "/v1/chat/completions",
       "{" + kUser + R"(,"max_tokens":1000000})", 400, "invalid_request_error"},
      {"prompt + max_tokens over the context", "/v1/chat/completions",
       "{" + kUser + R"(,"max_tokens":4095})", 400, "invalid_request_error"},
      {"more than 16 stop sequences", "/v1/chat/completions",
       "{" + kUser +
           R"(,"stop":["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"]})",
       400, "invalid_request_error"},
      {"max_tokens 0 without echo", "/v1/completions", R"({"prompt":"x","max_tokens":0})", 400,
       "invalid_request_error"},
      {"stream_options without stream", "/v1/chat/completions",
       "{" + kUser + R"(,"stream_options":{"include_usage":true}})", 400, "invalid_request_error"},
      {"thinking field on Responses", "/v1/responses",
       R"({"input":"x","thinking":{"type":"disabled"}})", 400, "invalid_request_error"},
      {"empty stop sequence (Anthropic)", "/v1/messages",
       R"({"max_tokens":4,"messages":[{"role":"user","content":"x"}],"stop_sequences":[""]})", 400,
       "invalid_request_error"},
  };
  for (const Row& row : rows) {
    const Reply reply = Service().Post(row.path, row.body, "ok");
    EXPECT_EQ(reply.status, row.status) << row.what << ": " << reply.body;
    EXPECT_EQ(reply.violation, "") << row.what;
    const Json body = Json::parse(reply.body, nullptr, false);
    ASSERT_FALSE(body.is_discarded()) << row.what;
    const bool anthropic = std::string(row.path).rfind("/v1/messages", 0) == 0;
    if (anthropic) {
      EXPECT_EQ(body["type"], "error") << row.what;
      EXPECT_EQ(body["error"]["type"], row.type) << row.what;
    } else {
      EXPECT_EQ(body["error"]["type"], row.type) << row.what;
      EXPECT_FALSE(body["error"]["message"].get<std::string>().empty()) << row.what;
    }
  }
}

}  // namespace
}  // namespace dsinfer::server::testing
