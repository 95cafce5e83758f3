// The endpoints routers call on a worker (worker_endpoints.cc), the drain the routers see
// (/health), served-model aliases and the endpoint picker's metric names, in process.
#include <gtest/gtest.h>

#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "server/engine_port.h"
#include "server/service.h"
#include "service_harness.h"
#include "text/tokenizer.h"

namespace dsinfer::server {
namespace {

using Json = nlohmann::json;

const text::Tokenizer& Tok() {
  static const text::Tokenizer* tok = [] {
    auto t = text::Tokenizer::FromFile(testing::InProcessService::TokenizerPath());
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return new text::Tokenizer(std::move(t).value());
  }();
  return *tok;
}

// Generates one token per request and remembers the prompt it was given; its load figures and
// flush answer are set by the test.
class RecordingEngine final : public EnginePort {
 public:
  runtime::EngineStats stats;
  Status flush_answer = Status::Ok();
  int flushes = 0;
  bool refuse = false;

  Result<std::shared_ptr<runtime::RequestStream>> Submit(runtime::RequestParams params) override {
    if (refuse) return ResourceExhausted("request queue is full");
    {
      std::lock_guard lock(mu_);
      last_prompt_ = params.prompt;
    }
    auto stream = std::make_shared<runtime::RequestStream>("r");
    runtime::StreamEvent token;
    token.tokens = {Tok().Encode("ok", false)->front()};
    token.usage.prompt_tokens = static_cast<int64_t>(params.prompt.size());
    token.usage.completion_tokens = 1;
    stream->Push(token);
    runtime::StreamEvent done = token;
    done.tokens.clear();
    done.finished = true;
    done.finish_reason = runtime::FinishReason::kLength;
    stream->Push(done);
    return stream;
  }
  runtime::EngineStats Stats() const override { return stats; }
  bool ready() const override { return true; }
  void Shutdown(std::chrono::steady_clock::time_point) override {}
  Status FlushPrefixCache() override {
    ++flushes;
    return flush_answer;
  }
  std::vector<int32_t> last_prompt() const {
    std::lock_guard lock(mu_);
    return last_prompt_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<int32_t> last_prompt_;
};

struct Reply {
  int status = 0;
  std::string body;
  HeaderList headers;
  Json json() const { return Json::parse(body, nullptr, /*allow_exceptions=*/false); }
};

class RecordingSink final : public ResponseSink {
 public:
  explicit RecordingSink(Reply& reply) : reply_(reply) {}
  void Send(int status, std::string_view, std::string_view body,
            const HeaderList& headers) override {
    reply_.status = status;
    reply_.body = std::string(body);
    reply_.headers = headers;
  }
  bool BeginStream(int status, std::string_view, const HeaderList& headers) override {
    reply_.status = status;
    reply_.headers = headers;
    return true;
  }
  bool WriteChunk(std::string_view data) override {
    reply_.body += data;
    return true;
  }
  void EndStream() override {}
  bool ClientGone() override { return false; }

 private:
  Reply& reply_;
};

class WorkerEndpointsTest : public ::testing::Test {
 protected:
  void Start(ServiceOptions options = {}) {
    if (options.served_model_name == ServiceOptions{}.served_model_name)
      options.served_model_name = "primary";
    service_ = std::make_unique<Service>(options);
    ModelInfo info;
    info.max_model_len = 4096;
    info.model_path = "/models/demo";
    info.tokenizer_path = "/models/demo/tokenizer.json";
    info.device = "cpu";
    info.kv_cache_bytes = 1 << 30;
    info.max_num_seqs = 8;
    info.max_num_batched_tokens = 512;
    info.max_queue = 32;
    service_->Attach(&engine_, &Tok(), info);
  }
  Reply Call(const std::string& method, const std::string& path, const std::string& body = "",
             const std::string& key = "") {
    HttpRequest request;
    request.method = method;
    request.path = path;
    request.body = body;
    request.headers = {{"content-type", "application/json"}};
    if (!key.empty()) request.headers.push_back({"authorization", "Bearer " + key});
    Reply reply;
    RecordingSink sink(reply);
    service_->Handle(request, sink);
    return reply;
  }

  RecordingEngine engine_;
  std::unique_ptr<Service> service_;
};

TEST_F(WorkerEndpointsTest, GetLoadIsSGLangsArrayForm) {
  Start();
  engine_.stats.n_running = 2;
  engine_.stats.n_waiting = 3;
  engine_.stats.n_tokens_running = 777;
  Reply r = Call("GET", "/get_load");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json(), Json::parse(R"([{"dp_rank":0,"num_reqs":5,"num_waiting_reqs":3,)"
                                  R"("num_tokens":777}])"));
  EXPECT_EQ(Call("POST", "/get_load").status, 405);
}

TEST_F(WorkerEndpointsTest, FlushCacheAsksTheEngineAndSaysWhenRefused) {
  Start();
  for (const char* path : {"/flush_cache", "/reset_prefix_cache"}) {
    engine_.flush_answer = Status::Ok();
    Reply ok = Call("POST", path);
    EXPECT_EQ(ok.status, 200) << path << ": " << ok.body;
    engine_.flush_answer = FailedPrecondition("2 requests are queued or running");
    Reply refused = Call("POST", path);
    EXPECT_EQ(refused.status, 400) << path;
    EXPECT_NE(refused.body.find("2 requests are queued or running"), std::string::npos);
  }
  EXPECT_EQ(engine_.flushes, 4);
  EXPECT_EQ(Call("GET", "/flush_cache").status, 405);
}

TEST_F(WorkerEndpointsTest, ServerAndModelInfoUnderEveryRoutersName) {
  ServiceOptions options;
  options.served_model_name = "primary";
  options.served_model_aliases = {"alias-b"};
  Start(options);
  for (const char* path : {"/server_info", "/get_server_info"}) {
    Reply r = Call("GET", path);
    ASSERT_EQ(r.status, 200) << path;
    Json j = r.json();
    EXPECT_EQ(j["model_path"], "/models/demo");
    EXPECT_EQ(j["context_length"], 4096);
    EXPECT_EQ(j["max_running_requests"], 8);
    EXPECT_EQ(j["max_num_batched_tokens"], 512);
    EXPECT_EQ(j["kv_cache_bytes"], 1 << 30);
    EXPECT_FALSE(j["version"].get<std::string>().empty());
    EXPECT_EQ(j["served_model_names"], Json::parse(R"(["primary","alias-b"])"));
    EXPECT_TRUE(j["kv_events"].is_null());
  }
  for (const char* path : {"/model_info", "/get_model_info"}) {
    Reply r = Call("GET", path);
    ASSERT_EQ(r.status, 200) << path;
    EXPECT_EQ(r.json()["model_path"], "/models/demo");
    EXPECT_EQ(r.json()["is_generation"], true);
  }
  EXPECT_EQ(Call("GET", "/kv_event_sources").json(), Json::array());
}

TEST_F(WorkerEndpointsTest, KvEventSourcesSaysWhereThePublisherListens) {
  ServiceOptions options;
  options.kv_events.endpoint = "tcp://127.0.0.1:5557";
  options.kv_events.block_size = 16;
  Start(options);
  Json sources = Call("GET", "/kv_event_sources").json();
  ASSERT_EQ(sources.size(), 1u);
  EXPECT_EQ(sources[0]["endpoint"], "tcp://127.0.0.1:5557");
  EXPECT_EQ(sources[0]["data_parallel_rank"], 0);
  EXPECT_EQ(Call("GET", "/server_info").json()["kv_events"]["block_size"], 16);
}

// Each render endpoint answers the ids the generation endpoint would give the engine.
TEST_F(WorkerEndpointsTest, RenderGivesTheIdsTheGenerationEndpointSubmits) {
  Start();
  const std::string chat =
      R"({"model":"primary","messages":[{"role":"system","content":"You are terse."},)"
      R"({"role":"user","content":"Say hi"}],"chat_template_kwargs":{"thinking":false},)"
      R"("max_tokens":1,"no_stop_trim":false,"skip_special_tokens":true})";
  const std::string completion = R"({"model":"primary","prompt":"Once upon","max_tokens":1})";
  const std::string responses =
      R"({"model":"primary","instructions":"Be brief.","input":"Say hi","max_output_tokens":1})";
  struct Case {
    const char* generate;
    const char* render;
    const std::string& body;
  };
  for (const Case& c : {Case{"/v1/chat/completions", "/v1/chat/completions/render", chat},
                        Case{"/v1/completions", "/v1/completions/render", completion},
                        Case{"/v1/responses", "/v1/responses/render", responses}}) {
    Reply generated = Call("POST", c.generate, c.body);
    ASSERT_EQ(generated.status, 200) << c.generate << ": " << generated.body;
    Reply rendered = Call("POST", c.render, c.body);
    ASSERT_EQ(rendered.status, 200) << c.render << ": " << rendered.body;
    Json j = rendered.json();
    EXPECT_EQ(j["token_ids"].get<std::vector<int32_t>>(), engine_.last_prompt()) << c.render;
    EXPECT_EQ(j["count"], engine_.last_prompt().size());
    EXPECT_EQ(j["prompt"], *Tok().Decode(engine_.last_prompt()));
    EXPECT_EQ(j["model"], "primary");
  }
  // The thinking switch changes the rendered prompt, as it changes the generated one.
  std::string thinking = chat;
  thinking.replace(thinking.find("false"), 5, "true");
  EXPECT_NE(Call("POST", "/v1/chat/completions/render", thinking).json()["token_ids"],
            Call("POST", "/v1/chat/completions/render", chat).json()["token_ids"]);
  EXPECT_EQ(
      Call("POST", "/v1/chat/completions/render", R"({"model":"other","messages":[]})").status,
      404);
  EXPECT_EQ(Call("POST", "/v1/chat/completions/render", "{not json").status, 400);
  EXPECT_EQ(Call("GET", "/v1/responses/render").status, 405);
}

TEST_F(WorkerEndpointsTest, DrainTurnsHealthAndReadyTo503AndRefusesNewWork) {
  Start();
  EXPECT_EQ(Call("GET", "/health").status, 200);
  EXPECT_EQ(Call("GET", "/ready").status, 200);
  service_->BeginDrain();
  Reply health = Call("GET", "/health");
  EXPECT_EQ(health.status, 503);
  EXPECT_NE(health.body.find("draining"), std::string::npos);
  EXPECT_EQ(Call("GET", "/ready").status, 503);
  EXPECT_EQ(Call("POST", "/v1/chat/completions",
                 R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":1})")
                .status,
            503);
  EXPECT_EQ(Call("GET", "/health_generate").status, 503);
  // Load and info stay readable, so a router can watch the drain.
  EXPECT_EQ(Call("GET", "/get_load").status, 200);
}

TEST_F(WorkerEndpointsTest, HealthGenerateRunsOneTokenThroughTheEngine) {
  Start();
  Reply ok = Call("GET", "/health_generate");
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(engine_.last_prompt().size(), 1u);
  engine_.refuse = true;
  EXPECT_EQ(Call("GET", "/health_generate").status, 503);
}

TEST_F(WorkerEndpointsTest, ProfileAndSleepSayWhyTheyAreNotImplemented) {
  Start();
  for (const char* path : {"/start_profile", "/stop_profile", "/sleep", "/wake_up"}) {
    Reply r = Call("POST", path);
    EXPECT_EQ(r.status, 501) << path;
    EXPECT_FALSE(r.json()["error"]["message"].get<std::string>().empty()) << path;
  }
  EXPECT_EQ(Call("GET", "/is_sleeping").json()["is_sleeping"], false);
}

TEST_F(WorkerEndpointsTest, WorkerEndpointsNeedTheKeyWhenOneIsSet) {
  ServiceOptions options;
  options.api_keys = {"sk-router"};
  Start(options);
  EXPECT_EQ(Call("GET", "/get_load").status, 401);
  EXPECT_EQ(Call("GET", "/get_load", "", "sk-router").status, 200);
  EXPECT_EQ(Call("POST", "/flush_cache").status, 401);
  EXPECT_EQ(Call("GET", "/health").status, 200);  // health stays open
}

TEST_F(WorkerEndpointsTest, AliasesAreAcceptedAndListed) {
  ServiceOptions options;
  options.served_model_name = "primary";
  options.served_model_aliases = {"alias-b", "alias-c"};
  Start(options);
  Json models = Call("GET", "/v1/models").json();
  ASSERT_EQ(models["data"].size(), 3u);
  EXPECT_EQ(models["data"][2]["id"], "alias-c");
  Reply chat = Call("POST", "/v1/chat/completions",
                    R"({"model":"alias-c","messages":[{"role":"user","content":"hi"}],)"
                    R"("max_tokens":1})");
  ASSERT_EQ(chat.status, 200) << chat.body;
  EXPECT_EQ(chat.json()["model"], "primary");  // vLLM reports the first served name too
  EXPECT_EQ(Call("POST", "/v1/chat/completions",
                 R"({"model":"nope","messages":[{"role":"user","content":"hi"}]})")
                .status,
            404);
  EXPECT_EQ(Call("POST", "/tokenize", R"({"model":"alias-b","prompt":"hi"})").status, 200);
  EXPECT_EQ(Call("POST", "/tokenize", R"({"model":"nope","prompt":"hi"})").status, 404);
}

TEST_F(WorkerEndpointsTest, TokenizeReturnsTokenStringsWhenAsked) {
  Start();
  Json j = Call("POST", "/tokenize",
                R"({"prompt":"hello world","add_special_tokens":false,)"
                R"("return_token_strs":true})")
               .json();
  ASSERT_EQ(j["tokens"].size(), j["token_strs"].size());
  std::string joined;
  for (const auto& s : j["token_strs"]) joined += s.get<std::string>();
  EXPECT_EQ(joined, "hello world");
  EXPECT_TRUE(Call("POST", "/tokenize", R"({"prompt":"hi"})").json()["token_strs"].is_null());
  Json back =
      Call("POST", "/detokenize", R"({"model":"primary","tokens":)" + j["tokens"].dump() + "}")
          .json();
  EXPECT_EQ(back["prompt"], "hello world");
}

TEST_F(WorkerEndpointsTest, MetricsRepeatTheSchedulerGaugesUnderThePickersNames) {
  Start();
  engine_.stats.n_waiting = 4;
  engine_.stats.n_running = 2;
  engine_.stats.kv_usage = 0.25;
  std::string text = Call("GET", "/metrics").body;
  EXPECT_NE(text.find("\nvllm:num_requests_waiting 4\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\nvllm:num_requests_running 2\n"), std::string::npos);
  EXPECT_NE(text.find("\nvllm:kv_cache_usage_perc 0.25\n"), std::string::npos);
  EXPECT_NE(text.find("\ndsinfer:num_requests_waiting 4\n"), std::string::npos);

  ServiceOptions renamed;
  renamed.scheduler_metrics = {"queue_depth", "", "kv_fraction"};
  Start(renamed);
  text = Call("GET", "/metrics").body;
  EXPECT_NE(text.find("\nqueue_depth 4\n"), std::string::npos);
  EXPECT_NE(text.find("\nkv_fraction 0.25\n"), std::string::npos);
  EXPECT_EQ(text.find("vllm:"), std::string::npos);
}

}  // namespace
}  // namespace dsinfer::server
