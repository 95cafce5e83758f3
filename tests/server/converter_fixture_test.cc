// Prompt fidelity of the live service against deepseek-recipe's own request converters
// (tests/fixtures/chat/converter_cases.jsonl, reference/chat/gen_converter_fixtures.py): every
// Chat Completions, Messages and Responses request is posted to the service, for the V4 and the
// V4.1 encoding, and the prompt the engine receives (its token ids, decoded) must be the one the
// official converter + encoding render, with control tokens exactly where the template writes
// them. A request the converter refuses must be refused (4xx); one with an image, which the
// converter renders as a placeholder, is refused with 422 (docs/SERVER.md "Prompt fidelity").
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "service_harness.h"
#include "text/chat_render.h"

namespace dsinfer::server::testing {
namespace {

using Json = nlohmann::ordered_json;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The V4 test tokenizer, plus V4.1's <｜System｜> control token for the V4.1 service. (Unordered
// JSON: an ordered object of 129k vocabulary entries takes quadratic time to build.)
nlohmann::json TokenizerJson(bool v41) {
  nlohmann::json j = nlohmann::json::parse(ReadFile(InProcessService::TokenizerPath()));
  if (v41) {
    int64_t next = 0;
    for (const auto& t : j["added_tokens"])
      next = std::max<int64_t>(next, t["id"].get<int64_t>() + 1);
    j["added_tokens"].push_back({{"id", next},
                                 {"content", text::kSystemToken},
                                 {"single_word", false},
                                 {"lstrip", false},
                                 {"rstrip", false},
                                 {"normalized", false},
                                 {"special", true}});
  }
  return j;
}

struct Fixture {
  explicit Fixture(bool v41) {
    const nlohmann::json j = TokenizerJson(v41);
    for (const auto& t : j["added_tokens"]) control_ids.insert(t["id"].get<int32_t>());
    auto tokenizer = text::Tokenizer::FromJson(j.dump());
    EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
    ModelInfo info;
    info.version = v41 ? text::ModelVersion::kV41 : text::ModelVersion::kV4;
    info.max_model_len = 1 << 20;
    service = std::make_unique<InProcessService>(std::move(tokenizer).value(), info);
  }
  std::set<int32_t> control_ids;
  std::unique_ptr<InProcessService> service;
};

// Byte ranges of the control tokens among `ids`, and their decoded text.
std::string DecodeWithControlRanges(const text::Tokenizer& tok, const std::set<int32_t>& control,
                                    const std::vector<int32_t>& ids, Json* ranges) {
  std::string text;
  *ranges = Json::array();
  for (int32_t id : ids) {
    const std::string* bytes = tok.TokenBytes(id);
    if (!bytes) return "<unknown id " + std::to_string(id) + ">";
    if (control.count(id)) ranges->push_back({text.size(), text.size() + bytes->size()});
    text += *bytes;
  }
  return text;
}

// A JSON string of a snippet that may end inside a UTF-8 character.
std::string Quote(const std::string& s) {
  return Json(s).dump(-1, ' ', false, Json::error_handler_t::replace);
}

const char* Path(const std::string& api) {
  if (api == "chat") return "/v1/chat/completions";
  if (api == "messages") return "/v1/messages";
  return "/v1/responses";
}

// Whether a request carries an image (an image_url / image / input_image part or block): the
// converter renders a placeholder for it; the server refuses it with 422, because a prompt
// without the image would silently answer another question (docs/SERVER.md "Prompt fidelity").
bool HasImage(const Json& value) {
  if (value.is_object()) {
    auto type = value.find("type");
    if (type != value.end() && type->is_string() &&
        (*type == "image_url" || *type == "image" || *type == "input_image"))
      return true;
    for (const auto& [key, v] : value.items())
      if (HasImage(v)) return true;
  } else if (value.is_array()) {
    for (const auto& v : value)
      if (HasImage(v)) return true;
  }
  return false;
}

TEST(ConverterFixtures, LivePromptsMatchTheOfficialConverters) {
  Fixture v4(false), v41(true);
  std::ifstream in(std::string(DSINFER_SOURCE_DIR) + "/tests/fixtures/chat/converter_cases.jsonl");
  ASSERT_TRUE(in) << "converter_cases.jsonl missing";
  int cases = 0, rendered = 0, refused = 0, images = 0;
  std::map<std::string, int> per_version;
  std::vector<std::string> failures;
  for (std::string line; std::getline(in, line);) {
    const Json c = Json::parse(line);
    const std::string id = c["id"];
    const std::string api = c["api"];
    Fixture& f = c["version"] == "v4.1" ? v41 : v4;
    ++cases;
    ++per_version[c["version"]];
    const Reply reply = f.service->Post(Path(api), c["request"].dump());
    if (!reply.violation.empty()) failures.push_back(id + ": " + reply.violation);
    if (c.contains("error")) {
      ++refused;
      const std::string error = c["error"];
      if (reply.status == 200)
        failures.push_back(id + ": accepted what the converter refuses (" + error + ")");
      continue;
    }
    ++rendered;
    if (HasImage(c["request"])) {
      ++images;
      if (reply.status != 422) failures.push_back(id + ": an image is not refused with 422");
      continue;
    }
    if (reply.status != 200) {
      failures.push_back(id + ": refused (" + std::to_string(reply.status) + " " +
                         reply.body.substr(0, 300) + ")");
      continue;
    }
    Json ranges;
    const std::string prompt = DecodeWithControlRanges(f.service->tokenizer(), f.control_ids,
                                                       f.service->last_params().prompt, &ranges);
    const std::string want = c["prompt"];
    if (prompt != want) {
      size_t at = 0;
      while (at < prompt.size() && at < want.size() && prompt[at] == want[at]) ++at;
      const size_t from = at < 80 ? 0 : at - 80;
      failures.push_back(id + ": prompt differs at byte " + std::to_string(at) +
                         "\n  want: " + Quote(want.substr(from, 200)) +
                         "\n  got:  " + Quote(prompt.substr(from, 200)));
    } else if (ranges != c["special"]) {
      failures.push_back(id + ": control tokens at " + ranges.dump() + ", want " +
                         c["special"].dump());
    }
  }
  EXPECT_GE(per_version["v4"], 300);
  EXPECT_GE(per_version["v4.1"], 300);
  EXPECT_GT(rendered, 2 * refused);
  EXPECT_GT(images, 0);
  std::string report;
  for (size_t i = 0; i < failures.size() && i < 30; ++i) report += failures[i] + "\n";
  if (const char* dump = std::getenv("DSINFER_CONVERTER_FAILURES")) {
    std::ofstream out(dump);
    for (const auto& f : failures) out << f << "\n";
  }
  EXPECT_TRUE(failures.empty()) << failures.size() << " of " << cases << " cases differ:\n"
                                << report;
}

}  // namespace
}  // namespace dsinfer::server::testing
