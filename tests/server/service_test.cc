// The HTTP service over real sockets, with a scripted engine: it "generates" the tokens of a
// fixed text, so reasoning, tool calls, stop sequences, usage and cancellation can be checked
// exactly (the random-weight demo model cannot be steered that way).
#include "server/service.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "server/engine_port.h"
#include "server/http_server.h"
#include "text/tokenizer.h"

namespace dsinfer::server {
namespace {

using Json = nlohmann::json;
using namespace std::chrono_literals;

const text::Tokenizer& Tok() {
  static const text::Tokenizer* tok = [] {
    auto t = text::Tokenizer::FromFile(std::string(DSINFER_SOURCE_DIR) +
                                       "/tests/fixtures/tokenizer/deepseek-v4/tokenizer.json");
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return new text::Tokenizer(std::move(t).value());
  }();
  return *tok;
}

// Emits the tokens of `script` one per event, every `step`, honouring Cancel.
class ScriptedEngine final : public EnginePort {
 public:
  std::string script;
  std::chrono::milliseconds step{2};
  bool queue_full = false;
  int cached_tokens = 3;
  std::atomic<int> submitted{0};
  std::atomic<int> cancelled_seen{0};
  std::atomic<int64_t> last_cancel_latency_ms{-1};
  runtime::RequestParams last_params;

  ~ScriptedEngine() override {
    for (auto& t : threads_) t.join();
  }
  Result<std::shared_ptr<runtime::RequestStream>> Submit(runtime::RequestParams params) override {
    if (queue_full) return ResourceExhausted("request queue is full");
    ++submitted;
    last_params = params;
    auto stream =
        std::make_shared<runtime::RequestStream>("req-" + std::to_string(submitted.load()));
    auto ids = Tok().Encode(script, true);
    std::vector<int32_t> tokens = ids.ok() ? *ids : std::vector<int32_t>{};
    threads_.emplace_back([this, stream, tokens, params] {
      runtime::Usage usage;
      usage.prompt_tokens = static_cast<int64_t>(params.prompt.size());
      usage.cached_prompt_tokens = cached_tokens;
      for (int n = 0; n < params.n; ++n) {
        for (size_t i = 0; i <= tokens.size(); ++i) {
          std::this_thread::sleep_for(step);
          if (stream->cancelled()) {
            ++cancelled_seen;
            runtime::StreamEvent ev;
            ev.index = n;
            ev.finished = true;
            ev.finish_reason = runtime::FinishReason::kCancelled;
            stream->Push(ev);
            return;
          }
          runtime::StreamEvent ev;
          ev.index = n;
          bool at_limit = static_cast<int>(i) >= params.max_tokens;
          if (i < tokens.size() && !at_limit) {
            ev.tokens = {tokens[i]};
            if (params.top_logprobs >= 0) ev.logprobs = {{tokens[i], -0.5f, {{tokens[i], -0.5f}}}};
            ++usage.completion_tokens;
          }
          ev.usage = usage;
          if (i == tokens.size() || at_limit) {
            ev.finished = true;
            ev.finish_reason =
                at_limit ? runtime::FinishReason::kLength : runtime::FinishReason::kStop;
          }
          stream->Push(ev);
          if (ev.finished) break;
        }
      }
    });
    return stream;
  }
  runtime::EngineStats Stats() const override {
    runtime::EngineStats s;
    s.prefix_cache_queries = 10;
    s.prefix_cache_hits = 4;
    return s;
  }
  bool ready() const override { return true; }
  void Shutdown(std::chrono::steady_clock::time_point) override {}
  Status FlushPrefixCache() override { return Status::Ok(); }

 private:
  std::vector<std::thread> threads_;
};

struct HttpReply {
  int status = 0;
  std::string headers;  // raw, lower-cased
  std::string body;     // de-chunked
};

std::string Dechunk(const std::string& raw) {
  std::string out;
  size_t at = 0;
  while (at < raw.size()) {
    size_t eol = raw.find("\r\n", at);
    if (eol == std::string::npos) break;
    size_t len = std::stoul(raw.substr(at, eol - at), nullptr, 16);
    if (len == 0) break;
    out += raw.substr(eol + 2, len);
    at = eol + 2 + len + 2;
  }
  return out;
}

int Connect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

HttpReply Request(int port, const std::string& method, const std::string& path,
                  const std::string& body,
                  const std::string& extra_headers = "Authorization: Bearer sk-test\r\n") {
  int fd = Connect(port);
  std::string req =
      method + " " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + extra_headers +
      "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\n\r\n" + body;
  ::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  std::string raw;
  char buf[8192];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) raw.append(buf, n);
  ::close(fd);
  HttpReply reply;
  size_t head_end = raw.find("\r\n\r\n");
  if (head_end == std::string::npos) return reply;
  reply.status = std::stoi(raw.substr(9, 3));
  reply.headers = raw.substr(0, head_end);
  for (char& c : reply.headers) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  reply.body = raw.substr(head_end + 4);
  if (reply.headers.find("transfer-encoding: chunked") != std::string::npos)
    reply.body = Dechunk(reply.body);
  return reply;
}

// "data: {...}" payloads of an SSE body, [DONE] included as a string.
std::vector<std::string> SseData(const std::string& body) {
  std::vector<std::string> out;
  size_t at = 0;
  while ((at = body.find("data: ", at)) != std::string::npos) {
    size_t end = body.find("\n", at);
    out.push_back(body.substr(at + 6, end - at - 6));
    at = end;
  }
  return out;
}

std::vector<std::string> SseEvents(const std::string& body) {
  std::vector<std::string> out;
  size_t at = 0;
  while ((at = body.find("event: ", at)) != std::string::npos) {
    size_t end = body.find("\n", at);
    out.push_back(body.substr(at + 7, end - at - 7));
    at = end;
  }
  return out;
}

const char* kToolScript =
    "Need weather.</think>Checking.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke "
    "name=\"get_weather\">\n"
    "<｜DSML｜parameter name=\"city\" "
    "string=\"true\">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls><｜end▁of▁sentence｜>";

const char* kTools =
    R"("tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",)"
    R"("properties":{"city":{"type":"string"}}}}}])";

class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServiceOptions options;
    options.served_model_name = "test-model";
    options.api_keys = {"sk-test"};
    options.access_log = [this](const std::string& line) {
      std::lock_guard lock(log_mu_);
      access_log_.push_back(line);
    };
    service_ = std::make_unique<Service>(options);
    ModelInfo info;
    info.max_model_len = 4096;
    service_->Attach(&engine_, &Tok(), info);
    HttpServerOptions http;
    http.port = 0;
    http.max_body_bytes = 64 * 1024;
    http.header_timeout = 2000ms;
    auto server = HttpServer::Listen(
        http, [this](const HttpRequest& r, ResponseSink& s) { service_->Handle(r, s); });
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value();
    server_->Start();
    port_ = server_->port();
  }
  void TearDown() override { server_.reset(); }

  std::vector<std::string> AccessLog() {
    std::lock_guard lock(log_mu_);
    return access_log_;
  }

  std::mutex log_mu_;
  std::vector<std::string> access_log_;
  ScriptedEngine engine_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<HttpServer> server_;
  int port_ = 0;
};

TEST_F(ServiceTest, ChatStreamCarriesReasoningToolCallsAndUsage) {
  engine_.script = kToolScript;
  std::string body =
      std::string(
          R"({"model":"test-model","stream":true,"stream_options":{"include_usage":true},)") +
      R"("messages":[{"role":"user","content":"weather in Paris?"}],)" + kTools + "}";
  HttpReply r = Request(port_, "POST", "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.headers.find("content-type: text/event-stream"), std::string::npos);
  auto data = SseData(r.body);
  ASSERT_GE(data.size(), 4u);
  EXPECT_EQ(data.back(), "[DONE]");
  std::string reasoning, content, args, name, finish, id;
  Json usage;
  for (size_t i = 0; i + 1 < data.size(); ++i) {
    Json chunk = Json::parse(data[i]);
    EXPECT_EQ(chunk["object"], "chat.completion.chunk");
    if (id.empty()) id = chunk["id"];
    EXPECT_EQ(chunk["id"], id);  // one id for the whole stream
    ASSERT_TRUE(chunk.contains("usage"));
    if (!chunk["usage"].is_null()) {
      EXPECT_TRUE(chunk["choices"].empty());
      usage = chunk["usage"];
      continue;
    }
    for (const auto& c : chunk["choices"]) {
      const Json& d = c["delta"];
      if (d.contains("reasoning_content") && d["reasoning_content"].is_string())
        reasoning += d["reasoning_content"];
      if (d.contains("content") && d["content"].is_string()) content += d["content"];
      if (d.contains("tool_calls")) {
        const Json& tc = d["tool_calls"][0];
        EXPECT_EQ(tc["index"], 0);
        if (tc.contains("id")) name = tc["function"]["name"];
        args += tc["function"]["arguments"].get<std::string>();
      }
      if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
    }
  }
  EXPECT_EQ(reasoning, "Need weather.");
  EXPECT_EQ(content, "Checking.");
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(Json::parse(args), Json({{"city", "Paris"}}));
  EXPECT_EQ(finish, "tool_calls");
  ASSERT_TRUE(usage.is_object());
  EXPECT_EQ(usage["prompt_cache_hit_tokens"], 3);
  EXPECT_EQ(usage["prompt_tokens_details"]["cached_tokens"], 3);
  EXPECT_EQ(usage["prompt_cache_miss_tokens"].get<int>(), usage["prompt_tokens"].get<int>() - 3);
  EXPECT_EQ(usage["total_tokens"].get<int>(),
            usage["prompt_tokens"].get<int>() + usage["completion_tokens"].get<int>());
  EXPECT_GT(usage["completion_tokens_details"]["reasoning_tokens"].get<int>(), 0);
}

TEST_F(ServiceTest, ChatNonStreamingToolCallAndStopSequence) {
  engine_.script = kToolScript;
  std::string body =
      std::string(R"({"model":"test-model","messages":[{"role":"user","content":"hi"}],)") +
      kTools + "}";
  HttpReply r = Request(port_, "POST", "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  Json j = Json::parse(r.body);
  const Json& msg = j["choices"][0]["message"];
  EXPECT_EQ(msg["reasoning_content"], "Need weather.");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_TRUE(msg["tool_calls"][0]["function"]["arguments"].is_string());
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");

  engine_.script = "</think>one two three four";
  r = Request(
      port_, "POST", "/v1/chat/completions",
      R"({"model":"test-model","stop":[" three"],"messages":[{"role":"user","content":"count"}]})");
  ASSERT_EQ(r.status, 200) << r.body;
  j = Json::parse(r.body);
  EXPECT_EQ(j["choices"][0]["message"]["content"], "one two");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
}

TEST_F(ServiceTest, MessagesStreamEventOrder) {
  engine_.script = kToolScript;
  std::string body =
      R"({"model":"claude-sonnet-4","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}],)"
      R"("tools":[{"name":"get_weather","input_schema":{"type":"object"}}]})";
  HttpReply r = Request(port_, "POST", "/v1/messages", body, "x-api-key: sk-test\r\n");
  ASSERT_EQ(r.status, 200) << r.body;
  auto events = SseEvents(r.body);
  std::vector<std::string> expected_prefix = {"message_start", "content_block_start", "ping",
                                              "content_block_delta"};
  ASSERT_GE(events.size(), 10u);
  EXPECT_EQ(std::vector<std::string>(events.begin(), events.begin() + 4), expected_prefix);
  EXPECT_EQ(events[events.size() - 2], "message_delta");
  EXPECT_EQ(events.back(), "message_stop");
  EXPECT_NE(r.body.find("\"signature_delta\""), std::string::npos);
  EXPECT_NE(r.body.find("\"input_json_delta\""), std::string::npos);
  EXPECT_NE(r.body.find("\"stop_reason\":\"tool_use\""), std::string::npos);
  EXPECT_NE(r.body.find("\"cache_read_input_tokens\":3"), std::string::npos);
}

TEST_F(ServiceTest, ResponsesStreamSequenceNumbersIncrease) {
  engine_.script = "Hmm.</think>Hello there";
  HttpReply r = Request(port_, "POST", "/v1/responses",
                        R"({"model":"test-model","input":"hi","stream":true})");
  ASSERT_EQ(r.status, 200) << r.body;
  auto data = SseData(r.body);
  ASSERT_GE(data.size(), 10u);
  int64_t expected = 0;
  std::string text;
  for (const auto& d : data) {
    Json e = Json::parse(d);
    EXPECT_EQ(e["sequence_number"], expected++);
    if (e["type"] == "response.output_text.delta") text += e["delta"];
  }
  EXPECT_EQ(Json::parse(data.front())["type"], "response.created");
  Json last = Json::parse(data.back());
  EXPECT_EQ(last["type"], "response.completed");
  EXPECT_EQ(text, "Hello there");
  EXPECT_EQ(last["response"]["output"][0]["type"], "reasoning");
  EXPECT_EQ(last["response"]["usage"]["input_tokens_details"]["cached_tokens"], 3);
  // The finished response is retrievable by id.
  std::string id = last["response"]["id"];
  HttpReply got = Request(port_, "GET", "/v1/responses/" + id, "");
  ASSERT_EQ(got.status, 200);
  EXPECT_EQ(Json::parse(got.body)["status"], "completed");
}

// A generation that stops at once (or only reasons) still answers with a message item, empty,
// in the response and in the stream's item events.
TEST_F(ServiceTest, ResponsesAnswerWithAnEmptyMessageWhenNothingIsGenerated) {
  for (const std::string script : {"", "Hmm.</think>"}) {
    engine_.script = script;
    HttpReply r = Request(port_, "POST", "/v1/responses", R"({"model":"test-model","input":"hi"})");
    ASSERT_EQ(r.status, 200) << r.body;
    Json out = Json::parse(r.body)["output"];
    ASSERT_EQ(out.size(), script.empty() ? 1u : 2u) << out.dump();
    EXPECT_EQ(out.back()["type"], "message");
    EXPECT_EQ(out.back()["status"], "completed");
    EXPECT_EQ(out.back()["content"][0]["text"], "");
    HttpReply st = Request(port_, "POST", "/v1/responses",
                           R"({"model":"test-model","input":"hi","stream":true})");
    ASSERT_EQ(st.status, 200) << st.body;
    std::vector<std::string> types;
    for (const auto& d : SseData(st.body)) types.push_back(Json::parse(d)["type"]);
    const std::vector<std::string> tail = {
        "response.output_item.added", "response.content_part.added", "response.output_text.done",
        "response.content_part.done", "response.output_item.done",   "response.completed"};
    ASSERT_GE(types.size(), tail.size() + 2);
    EXPECT_EQ(std::vector<std::string>(types.end() - static_cast<long>(tail.size()), types.end()),
              tail);
    EXPECT_EQ(Json::parse(SseData(st.body).back())["response"]["output"].back()["type"], "message");
  }
}

TEST_F(ServiceTest, ClientDisconnectCancelsWithinOneStep) {
  engine_.script = std::string(400, 'a');
  engine_.step = 20ms;
  int fd = Connect(port_);
  std::string body =
      R"({"model":"test-model","stream":true,"messages":[{"role":"user","content":"x"}]})";
  std::string req =
      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-test\r\n"
      "Content-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body;
  ::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  char buf[4096];
  ASSERT_GT(::recv(fd, buf, sizeof(buf), 0), 0);  // the stream started
  ::close(fd);
  auto deadline = std::chrono::steady_clock::now() + 2s;
  while (engine_.cancelled_seen.load() == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(5ms);
  EXPECT_EQ(engine_.cancelled_seen.load(), 1);
}

TEST_F(ServiceTest, AuthAndOpenEndpoints) {
  EXPECT_EQ(Request(port_, "GET", "/health", "", "").status, 200);
  EXPECT_EQ(Request(port_, "GET", "/ready", "", "").status, 200);
  HttpReply denied = Request(port_, "GET", "/v1/models", "", "");
  EXPECT_EQ(denied.status, 401);
  EXPECT_EQ(Json::parse(denied.body)["error"]["code"], "invalid_api_key");
  EXPECT_EQ(Request(port_, "GET", "/v1/models", "", "Authorization: Bearer sk-tesT\r\n").status,
            401);
  EXPECT_EQ(
      Request(port_, "GET", "/v1/models", "", "Authorization: Bearer sk-test-longer\r\n").status,
      401);
  EXPECT_EQ(Request(port_, "GET", "/v1/models", "", "x-api-key: sk-test\r\n").status, 200);
  HttpReply anthropic = Request(port_, "POST", "/v1/messages", "{}", "");
  EXPECT_EQ(anthropic.status, 401);
  EXPECT_EQ(Json::parse(anthropic.body)["error"]["type"], "authentication_error");
}

// The chat page is not open either: a browser gets a Basic challenge and signs in with the key
// as password ("user:sk-test" is dXNlcjpzay10ZXN0); the same credentials work for the API.
TEST_F(ServiceTest, ChatPageNeedsTheKeyThroughBasicAuth) {
  HttpReply challenge = Request(port_, "GET", "/", "", "");
  EXPECT_EQ(challenge.status, 401);
  EXPECT_NE(challenge.headers.find("www-authenticate: basic realm=\"dsinfer\""), std::string::npos)
      << challenge.headers;
  EXPECT_EQ(challenge.body.find("<html"), std::string::npos);
  HttpReply page = Request(port_, "GET", "/", "", "Authorization: Basic dXNlcjpzay10ZXN0\r\n");
  EXPECT_EQ(page.status, 200);
  EXPECT_NE(page.body.find("<html"), std::string::npos);
  EXPECT_EQ(Request(port_, "GET", "/index.html", "", "Authorization: Bearer sk-test\r\n").status,
            200);
  EXPECT_EQ(
      Request(port_, "GET", "/v1/models", "", "authorization: basic dXNlcjpzay10ZXN0\r\n").status,
      200);
  // Wrong password ("user:sk-tesT"), no colon ("sk-test"), and malformed base64 are refused.
  for (const char* bad : {"Basic dXNlcjpzay10ZXNU", "Basic c2stdGVzdA==", "Basic !!!!", "Basic "})
    EXPECT_EQ(Request(port_, "GET", "/", "", std::string("Authorization: ") + bad + "\r\n").status,
              401)
        << bad;
}

TEST_F(ServiceTest, ErrorShapesAndCodes) {
  HttpReply bad = Request(port_, "POST", "/v1/chat/completions", "{not json");
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(Json::parse(bad.body)["error"]["type"], "invalid_request_error");
  HttpReply bad_anthropic = Request(port_, "POST", "/v1/messages", "[1,2]");
  EXPECT_EQ(bad_anthropic.status, 400);
  EXPECT_EQ(Json::parse(bad_anthropic.body)["type"], "error");
  EXPECT_EQ(Request(port_, "GET", "/nope", "").status, 404);
  HttpReply wrong_method = Request(port_, "GET", "/v1/chat/completions", "");
  EXPECT_EQ(wrong_method.status, 405);
  EXPECT_NE(wrong_method.headers.find("allow: post"), std::string::npos);
  EXPECT_EQ(Request(port_, "POST", "/v1/chat/completions", std::string(70 * 1024, ' ')).status,
            413);
  EXPECT_EQ(
      Request(port_, "POST", "/v1/chat/completions", std::string(100, '[') + std::string(100, ']'))
          .status,
      400);
  HttpReply unknown_model =
      Request(port_, "POST", "/v1/chat/completions",
              R"({"model":"gpt-4","messages":[{"role":"user","content":"x"}]})");
  EXPECT_EQ(unknown_model.status, 404);
  EXPECT_EQ(Json::parse(unknown_model.body)["error"]["code"], "model_not_found");
  EXPECT_EQ(Request(port_, "POST", "/v1/chat/completions",
                    R"({"messages":[{"role":"user","content":"x"}],"max_tokens":"many"})")
                .status,
            400);
  engine_.queue_full = true;
  HttpReply full = Request(port_, "POST", "/v1/chat/completions",
                           R"({"messages":[{"role":"user","content":"x"}]})");
  EXPECT_EQ(full.status, 429);
  EXPECT_NE(full.headers.find("retry-after: 1"), std::string::npos);
  engine_.queue_full = false;
  std::string huge_header =
      "Authorization: Bearer sk-test\r\nX-Big: " + std::string(20000, 'a') + "\r\n";
  EXPECT_EQ(Request(port_, "GET", "/v1/models", "", huge_header).status, 431);
}

TEST_F(ServiceTest, MetricsUseVllmNames) {
  engine_.script = "</think>ok";
  ASSERT_EQ(Request(port_, "POST", "/v1/chat/completions",
                    R"({"messages":[{"role":"user","content":"x"}]})")
                .status,
            200);
  HttpReply m = Request(port_, "GET", "/metrics", "");
  ASSERT_EQ(m.status, 200);
  for (const char* name :
       {"dsinfer:num_requests_running", "dsinfer:kv_cache_usage_perc",
        "dsinfer:prefix_cache_hits_total 4", "dsinfer:time_to_first_token_seconds_count 1",
        "dsinfer:e2e_request_latency_seconds_bucket",
        "dsinfer:request_success_total{finished_reason=\"stop\"} 1"})
    EXPECT_NE(m.body.find(name), std::string::npos) << name;
}

// HEAD gets a GET's status and headers, Content-Length included, and no body, so kept-alive
// clients (AIPerf's metrics collector) stay in step; /version, /v1/models/{id}.
TEST_F(ServiceTest, HeadRequestsVersionAndModelRetrieval) {
  for (const char* path : {"/metrics", "/health", "/v1/models", "/version", "/"}) {
    HttpReply get = Request(port_, "GET", path, "");
    HttpReply head = Request(port_, "HEAD", path, "");
    EXPECT_EQ(head.status, get.status) << path;
    EXPECT_EQ(head.body, "") << path;
    EXPECT_NE(head.headers.find("content-length: "), std::string::npos) << path;
  }
  HttpReply head405 = Request(port_, "HEAD", "/v1/chat/completions", "");
  EXPECT_EQ(head405.status, 405);
  EXPECT_EQ(head405.body, "");
  Json version = Json::parse(Request(port_, "GET", "/version", "", "").body);
  EXPECT_FALSE(version["version"].get<std::string>().empty());
  HttpReply model = Request(port_, "GET", "/v1/models/test-model", "");
  ASSERT_EQ(model.status, 200);
  EXPECT_EQ(Json::parse(model.body)["id"], "test-model");
  EXPECT_EQ(Json::parse(model.body)["max_model_len"], 4096);
  HttpReply other = Request(port_, "GET", "/v1/models/gpt-4", "");
  EXPECT_EQ(other.status, 404);
  EXPECT_EQ(Json::parse(other.body)["error"]["code"], "model_not_found");
  EXPECT_EQ(Request(port_, "POST", "/v1/models/test-model", "{}").status, 405);
}

// One access-log line per request: method, path, status, tokens, latency; no key, no body.
TEST_F(ServiceTest, AccessLogLinePerRequest) {
  engine_.script = "</think>four five";
  ASSERT_EQ(Request(port_, "POST", "/v1/chat/completions?x=secret-query",
                    R"({"messages":[{"role":"user","content":"secret-body"}]})")
                .status,
            200);
  ASSERT_EQ(Request(port_, "GET", "/nope", "").status, 404);
  std::vector<std::string> log;
  for (int i = 0; i < 100 && (log = AccessLog()).size() < 2; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(log.size(), 2u);
  EXPECT_EQ(log[0].rfind("access POST /v1/chat/completions 200 prompt_tokens=", 0), 0u) << log[0];
  EXPECT_NE(log[0].find("completion_tokens=3"), std::string::npos) << log[0];
  EXPECT_NE(log[0].find("latency_ms="), std::string::npos);
  EXPECT_EQ(log[1].rfind("access GET /nope 404 ", 0), 0u) << log[1];
  for (const auto& line : log)
    for (const char* secret : {"sk-test", "secret-body", "secret-query"})
      EXPECT_EQ(line.find(secret), std::string::npos) << line;
}

}  // namespace
}  // namespace dsinfer::server
