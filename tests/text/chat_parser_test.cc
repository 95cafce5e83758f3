// Output parsing against deepseek-recipe 0.2.0 fixtures (tests/fixtures/chat/parse_cases.jsonl):
// every case is fed whole, split at every byte boundary, byte by byte, and in random chunks; the
// result and the concatenated deltas must equal the oracle's parse of the whole output. A fuzz
// test feeds mutated and random bytes and checks the invariants.
#include "text/chat_parser.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "text/utf8.h"

namespace dsinfer::text {
namespace {

using ordered_json = nlohmann::ordered_json;

struct Case {
  std::string id;
  std::string output;
  OutputParserOptions options;
  BackendFinish finish = BackendFinish::kStop;
  ParseResult expect;
};

std::vector<Case> LoadCases() {
  std::ifstream in(std::string(DSINFER_SOURCE_DIR) + "/tests/fixtures/chat/parse_cases.jsonl");
  std::vector<Case> cases;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    ordered_json j = ordered_json::parse(line);
    Case c;
    c.id = j["id"];
    c.output = j["output"];
    const auto& o = j["options"];
    const auto& stage = o["thinking_stage"];
    c.options.thinking = stage.is_null()        ? ThinkingStage::kOff
                         : stage == "start"     ? ThinkingStage::kReasoningStart
                         : stage == "reasoning" ? ThinkingStage::kReasoningContinuation
                                                : ThinkingStage::kContentContinuation;
    c.options.parse_tool_calls = o["parse_tool_calls"];
    c.options.parse_json_output = o["parse_json"];
    c.options.starts_in_tool_calls = o["starts_in_tool_calls"];
    for (const auto& s : o["stop"]) c.options.stop_sequences.push_back(s);
    c.finish = o["backend_finish"] == "length"           ? BackendFinish::kLength
               : o["backend_finish"] == "content_filter" ? BackendFinish::kContentFilter
                                                         : BackendFinish::kStop;
    const auto& e = j["expect"];
    c.expect.content = e["content"];
    c.expect.reasoning = e["reasoning"];
    for (const auto& t : e["tool_calls"])
      c.expect.tool_calls.push_back({t["name"], t["arguments"]});
    const std::string reason = e["finish_reason"];
    c.expect.finish_reason = reason == "length"           ? FinishReason::kLength
                             : reason == "tool_calls"     ? FinishReason::kToolCalls
                             : reason == "content_filter" ? FinishReason::kContentFilter
                                                          : FinishReason::kStop;
    cases.push_back(std::move(c));
  }
  return cases;
}

// Feeds `chunks` and rebuilds the message from the events alone.
struct Replay {
  ParseResult from_events;
  ParseResult result;
  bool events_valid_utf8 = true;
  bool indices_ok = true;
};

Replay RunParser(const OutputParserOptions& options, const std::vector<std::string>& chunks,
                 BackendFinish finish) {
  OutputParser parser(options);
  Replay r;
  auto absorb = [&](const std::vector<ParserEvent>& events) {
    for (const auto& e : events) {
      if (!IsValidUtf8(e.text)) r.events_valid_utf8 = false;
      switch (e.kind) {
        case ParserEvent::Kind::kReasoning:
          r.from_events.reasoning += e.text;
          break;
        case ParserEvent::Kind::kContent:
          r.from_events.content += e.text;
          break;
        case ParserEvent::Kind::kToolCallBegin:
          if (e.tool_index != static_cast<int>(r.from_events.tool_calls.size()))
            r.indices_ok = false;
          r.from_events.tool_calls.push_back({e.text, ""});
          break;
        case ParserEvent::Kind::kToolCallArguments:
          if (e.tool_index < 0 ||
              e.tool_index + 1 != static_cast<int>(r.from_events.tool_calls.size())) {
            r.indices_ok = false;
            break;
          }
          r.from_events.tool_calls.back().arguments += e.text;
          break;
        case ParserEvent::Kind::kStopSequence:
          r.from_events.stop_sequence = e.text;
          break;
      }
    }
  };
  for (const auto& c : chunks) absorb(parser.Feed(c));
  absorb(parser.Finish(finish));
  r.result = parser.result();
  return r;
}

std::string Describe(const ParseResult& r) {
  ordered_json j;
  j["content"] = r.content;
  j["reasoning"] = r.reasoning;
  j["tool_calls"] = ordered_json::array();
  for (const auto& t : r.tool_calls) j["tool_calls"].push_back({t.name, t.arguments});
  j["finish"] = FinishReasonName(r.finish_reason);
  return j.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

bool SameMessage(const ParseResult& a, const ParseResult& b) {
  if (a.content != b.content || a.reasoning != b.reasoning ||
      a.tool_calls.size() != b.tool_calls.size())
    return false;
  for (size_t i = 0; i < a.tool_calls.size(); ++i)
    if (a.tool_calls[i].name != b.tool_calls[i].name ||
        a.tool_calls[i].arguments != b.tool_calls[i].arguments)
      return false;
  return true;
}

// Checks one chunking; returns false (after reporting) on mismatch.
bool Check(const Case& c, const std::vector<std::string>& chunks, const std::string& how) {
  Replay r = RunParser(c.options, chunks, c.finish);
  bool ok = SameMessage(r.result, c.expect) && r.result.finish_reason == c.expect.finish_reason &&
            SameMessage(r.from_events, r.result) && r.events_valid_utf8 && r.indices_ok;
  if (!ok)
    ADD_FAILURE() << c.id << " (" << how << ")\noutput:   "
                  << ordered_json(c.output).dump(-1, ' ', false,
                                                 ordered_json::error_handler_t::replace)
                  << "\nexpected: " << Describe(c.expect) << "\nresult:   " << Describe(r.result)
                  << "\nevents:   " << Describe(r.from_events);
  return ok;
}

TEST(ChatParserFixtures, MatchesOracleUnderEveryChunking) {
  std::vector<Case> cases = LoadCases();
  ASSERT_GE(cases.size(), 200u);
  std::mt19937 rng(1234);
  size_t failures = 0, with_tools = 0, with_reasoning = 0, with_stop = 0;
  for (const auto& c : cases) {
    with_tools += !c.expect.tool_calls.empty();
    with_reasoning += !c.expect.reasoning.empty();
    with_stop += !c.options.stop_sequences.empty();
    if (!Check(c, {c.output}, "whole")) {
      if (++failures > 5) break;
      continue;
    }
    bool ok = true;
    for (size_t split = 1; ok && split < c.output.size(); ++split)
      ok = Check(c, {c.output.substr(0, split), c.output.substr(split)},
                 "split at byte " + std::to_string(split));
    std::vector<std::string> bytes;
    for (char ch : c.output) bytes.push_back(std::string(1, ch));
    ok = ok && Check(c, bytes, "byte by byte");
    for (int trial = 0; ok && trial < 4; ++trial) {
      std::vector<std::string> chunks;
      size_t pos = 0;
      while (pos < c.output.size()) {
        size_t len = std::uniform_int_distribution<size_t>(0, 12)(rng);
        chunks.push_back(c.output.substr(pos, len));
        pos += len;
      }
      ok = Check(c, chunks, "random chunks");
    }
    if (!ok && ++failures > 5) break;
  }
  EXPECT_EQ(failures, 0u);
  // The fixture set must exercise the interesting paths.
  EXPECT_GE(with_tools, 50u);
  EXPECT_GE(with_reasoning, 50u);
  EXPECT_GE(with_stop, 20u);
}

std::vector<std::string> Chunk(const std::string& text, std::mt19937* rng) {
  std::vector<std::string> chunks;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t len = std::uniform_int_distribution<size_t>(1, 9)(*rng);
    chunks.push_back(text.substr(pos, len));
    pos += len;
  }
  return chunks;
}

TEST(ChatParserFuzz, MutatedAndRandomBytesKeepInvariants) {
  std::vector<Case> cases = LoadCases();
  ASSERT_FALSE(cases.empty());
  std::mt19937 rng(99);
  const std::vector<std::string> inserts = {"<｜DSML｜",
                                            "</｜DSML｜",
                                            "\"",
                                            " ",
                                            "\n",
                                            "</think>",
                                            "invoke name=\"",
                                            "parameter name=\"",
                                            "true\">",
                                            "false\">",
                                            "```json\n",
                                            "{",
                                            "\xff",
                                            "\xe6\x97",
                                            "｜",
                                            "</｜DSML｜tool_calls>"};
  for (int iter = 0; iter < 3000; ++iter) {
    const Case& base = cases[rng() % cases.size()];
    std::string text = base.output;
    if (iter % 5 == 0) {
      text.clear();
      size_t n = rng() % 200;
      for (size_t i = 0; i < n; ++i) text.push_back(static_cast<char>(rng() & 0xff));
    }
    for (int m = 0, count = static_cast<int>(rng() % 6); m < count; ++m) {
      size_t pos = text.empty() ? 0 : rng() % (text.size() + 1);
      switch (rng() % 4) {
        case 0:
          text.insert(pos, inserts[rng() % inserts.size()]);
          break;
        case 1:
          if (!text.empty()) text.erase(pos, rng() % 8);
          break;
        case 2:
          text.resize(pos);
          break;
        default:
          if (pos < text.size()) text[pos] = static_cast<char>(rng() & 0xff);
      }
    }
    OutputParserOptions options = base.options;
    Replay whole = RunParser(options, {text}, base.finish);
    Replay chunked = RunParser(options, Chunk(text, &rng), base.finish);
    ASSERT_TRUE(whole.events_valid_utf8 && chunked.events_valid_utf8) << iter;
    ASSERT_TRUE(whole.indices_ok && chunked.indices_ok) << iter;
    ASSERT_TRUE(SameMessage(whole.from_events, whole.result)) << iter;
    ASSERT_TRUE(SameMessage(chunked.result, whole.result)) << iter << "\n"
                                                           << Describe(whole.result) << "\n"
                                                           << Describe(chunked.result);
    ASSERT_EQ(chunked.result.finish_reason, whole.result.finish_reason) << iter;
    // Parsing never invents text: answer and reasoning are assembled from the input (plus the
    // JSON-mode spaces and U+FFFD replacements), so they cannot be longer than it allows.
    ASSERT_LE(whole.result.content.size() + whole.result.reasoning.size(), 3 * text.size() + 1);
  }
}

TEST(ChatParser, StreamsToolCallArgumentsAsJson) {
  OutputParserOptions options;
  options.thinking = ThinkingStage::kReasoningStart;
  OutputParser parser(options);
  std::vector<ParserEvent> events = parser.Feed(
      "\nLet me check.</think>\n\nSure.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke "
      "name=\"get_weather\">\n"
      "<｜DSML｜parameter name=\"city\" string=\"true\">Pa\"ris\n</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
      "</｜DSML｜tool_calls>ignored");
  std::vector<ParserEvent> tail = parser.Finish(BackendFinish::kStop);
  events.insert(events.end(), tail.begin(), tail.end());
  const ParseResult& r = parser.result();
  EXPECT_EQ(r.reasoning, "Let me check.");
  EXPECT_EQ(r.content, "Sure.");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.tool_calls[0].arguments, "{\"city\": \"Pa\\\"ris\\n\", \"days\": 3}");
  EXPECT_EQ(r.finish_reason, FinishReason::kToolCalls);
  bool saw_begin = false;
  for (const auto& e : events)
    if (e.kind == ParserEvent::Kind::kToolCallBegin) {
      saw_begin = true;
      EXPECT_EQ(e.tool_index, 0);
      EXPECT_EQ(e.text, "get_weather");
    }
  EXPECT_TRUE(saw_begin);
}

TEST(ChatParser, StopSequenceWithholdsTextAndEndsOutput) {
  OutputParserOptions options;
  options.thinking = ThinkingStage::kOff;
  options.stop_sequences = {"END"};
  OutputParser parser(options);
  std::string content;
  for (const char* chunk : {"hello E", "N", "D world", "more"})
    for (const auto& e : parser.Feed(chunk))
      if (e.kind == ParserEvent::Kind::kContent) content += e.text;
  EXPECT_TRUE(parser.done());
  EXPECT_EQ(content, "hello ");
  EXPECT_EQ(parser.result().stop_sequence, "END");
  (void)parser.Finish(BackendFinish::kLength);
  EXPECT_EQ(parser.result().finish_reason, FinishReason::kStop);
}

TEST(ChatParser, HoldsBackPartialMarkersAndSplitCharacters) {
  OutputParserOptions options;
  options.thinking = ThinkingStage::kOff;
  OutputParser parser(options);
  // "日" is E6 97 A5; "<｜DS" could start a DSML block. Neither may leak early.
  std::vector<ParserEvent> first = parser.Feed("ok \xe6\x97");
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].text, "ok ");
  std::vector<ParserEvent> second = parser.Feed("\xa5<｜DS");
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].text, "日");
  std::vector<ParserEvent> rest = parser.Finish(BackendFinish::kStop);
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_EQ(rest[0].text, "<｜DS");  // an unfinished marker is plain text after all
  EXPECT_EQ(parser.result().content, "ok 日<｜DS");
}

// Parses `text` in pieces of `chunk` bytes (0: whole) in serving mode; the concatenated content
// deltas must equal the result's content.
ParseResult ParseRecovering(const std::string& text, OutputParserOptions o, BackendFinish finish,
                            size_t chunk = 0) {
  o.recover_unparsed = true;
  OutputParser parser(o);
  std::string content;
  auto take = [&](const std::vector<ParserEvent>& events) {
    for (const auto& e : events)
      if (e.kind == ParserEvent::Kind::kContent) content += e.text;
  };
  for (size_t at = 0; at < text.size(); at += chunk ? chunk : text.size())
    take(parser.Feed(std::string_view(text).substr(at, chunk ? chunk : text.size())));
  take(parser.Finish(finish));
  EXPECT_EQ(content, parser.result().content);
  return parser.result();
}

// Serving mode: whatever the model writes reaches the client. Cut after every byte, a tool-call
// block gives either an announced call or its text as content, never nothing; the result does not
// depend on how the bytes arrive.
TEST(ChatParserRecovery, ToolBlockCutAtEveryByteIsNeverLost) {
  const std::string answer = "Checking.";
  const std::string block =
      "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter "
      "name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke "
      "name=\"get_time\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
  OutputParserOptions o;
  o.thinking = ThinkingStage::kOff;
  for (size_t cut = 0; cut <= block.size(); ++cut) {
    const std::string text = answer + block.substr(0, cut);
    const ParseResult whole = ParseRecovering(text, o, BackendFinish::kLength);
    const ParseResult bytes = ParseRecovering(text, o, BackendFinish::kLength, 1);
    EXPECT_EQ(whole.content, bytes.content) << cut;
    EXPECT_EQ(whole.tool_calls.size(), bytes.tool_calls.size()) << cut;
    const bool wrote_markup = block.substr(0, cut).find_first_not_of("\n") != std::string::npos;
    if (wrote_markup) {
      EXPECT_TRUE(!whole.tool_calls.empty() || whole.content.size() > answer.size())
          << "cut " << cut << ": " << text;
    }
    EXPECT_EQ(whole.content.rfind(answer, 0), 0u);
  }
  // The oracle's parse of a block cut inside the first call's name keeps only the answer.
  OutputParserOptions oracle = o;
  OutputParser strict(oracle);
  strict.Feed(answer + "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_wea");
  strict.Finish(BackendFinish::kLength);
  EXPECT_EQ(strict.result().content, answer);
  EXPECT_EQ(ParseRecovering(answer + "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_wea", o,
                            BackendFinish::kLength)
                .content,
            answer + "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_wea");
}

// tool_choice required opens the block in the prompt: text that never becomes a call is the answer.
TEST(ChatParserRecovery, ForcedToolBlockWithoutACallIsContent) {
  OutputParserOptions o;
  o.starts_in_tool_calls = true;
  for (BackendFinish finish : {BackendFinish::kStop, BackendFinish::kLength}) {
    const ParseResult r = ParseRecovering("I would rather answer: 42", o, finish, 3);
    EXPECT_EQ(r.content, "I would rather answer: 42");
    EXPECT_TRUE(r.tool_calls.empty());
  }
  // A complete call, then the block cut before the next one: the call, and the text after it.
  const ParseResult r =
      ParseRecovering("<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n<｜DSML｜invoke na", o,
                      BackendFinish::kLength);
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.content, "\n<｜DSML｜invoke na");
  // Whitespace alone after a complete call is nothing to report.
  EXPECT_EQ(
      ParseRecovering("<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n", o, BackendFinish::kLength)
          .content,
      "");
}

// json_object: surrounding text becomes one space, as the oracle does, but output with no JSON at
// all is returned as it is (the oracle returns " ").
TEST(ChatParserRecovery, JsonModeWithoutJsonKeepsTheText) {
  OutputParserOptions o;
  o.thinking = ThinkingStage::kOff;
  o.parse_json_output = true;
  EXPECT_EQ(ParseRecovering("no json here, sorry", o, BackendFinish::kStop, 2).content,
            "no json here, sorry");
  EXPECT_EQ(ParseRecovering("Here: {\"a\": 1}", o, BackendFinish::kStop, 1).content, " {\"a\": 1}");
  OutputParser strict(o);
  strict.Feed("no json here, sorry");
  strict.Finish(BackendFinish::kStop);
  EXPECT_EQ(strict.result().content, " ");
}

}  // namespace
}  // namespace dsinfer::text
