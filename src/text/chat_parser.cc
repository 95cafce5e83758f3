#include "text/chat_parser.h"

#include <algorithm>
#include <utility>

#include "text/chat_json_value.h"
#include "text/utf8.h"

namespace dsinfer::text {
namespace {

constexpr std::string_view kJsonFenceLabels[] = {"```json\n", "```\n"};
constexpr std::string_view kRawJsonLabels[] = {"{", "["};
constexpr std::string_view kJsonEnd = "\n```";
constexpr std::string_view kDsmlBegin = "<｜DSML｜";
constexpr std::string_view kDsmlEnd = "</｜DSML｜";
constexpr std::string_view kToolCallsEnd[] = {"</｜DSML｜tool_calls>", "</｜DSML｜ calls>"};
constexpr std::string_view kReasoningEnd = "</think>";
constexpr std::string_view kInvokeName = "invoke name=\"";
// The parameter name is everything from here to the next space, quotes included.
constexpr std::string_view kParameterName = "parameter name=";
// A parameter name runs to the first space and is copied with its quotes, so the labels around it
// are "{" / ", " and ": " (names may contain quotes, not spaces).
constexpr std::string_view kParameterNameEnd = " ";

enum class StageKind {
  kCommon,
  kJson,
  kMatchedJson,
  kToolCalls,
  kToolName,
  kToolCallArguments,
  kParamName,
  kParamType,
  kParamValue,
  kReasoning,
  kFinished,
};

struct Stage {
  StageKind kind = StageKind::kCommon;
  bool flag = false;  // Common/Reasoning/ToolCallArguments: leading; ParamValue: string value
};

// What happens to a run of bytes (matched pattern or unmatched text).
enum class ActionKind {
  kRaw,             // answer content
  kToSpace,         // JSON mode: surrounding text becomes one space
  kSkip,            // dropped (markup, stray text in tool blocks, extra "</think>")
  kStopSequence,    // output ends
  kToolCallBegin,   // "invoke name=\"": a call starts (exists once its name ends)
  kToolName,        // bytes of the tool name
  kToolNameEnd,     // the call is announced
  kArgumentsLabel,  // fixed JSON text (`label`) appended to the arguments
  kRawArguments,    // bytes copied into the arguments (JSON-escaped when `string`)
  kReasoning,       // reasoning content
  kContentLabel,    // fixed answer text (`label`): the "{" / "[" that starts bare JSON
};

struct Action {
  ActionKind kind = ActionKind::kSkip;
  std::string_view label;
  bool string = false;
};

// One pattern being matched incrementally.
class Matcher {
 public:
  enum class Type { kString, kNewlinesAndString, kLeadingNewline };

  Matcher(Type type, std::string_view pattern, Stage next, Action on_match)
      : type_(type), pattern_(pattern), next_(next), on_match_(on_match) {
    table_.assign(pattern_.size(), 0);
    size_t len = 0;
    for (size_t i = 1; i < pattern_.size();) {
      if (pattern_[i] == pattern_[len]) {
        table_[i++] = ++len;
      } else if (len != 0) {
        len = table_[len - 1];
      } else {
        table_[i++] = 0;
      }
    }
  }

  // Returns true when the pattern completes with this byte.
  bool Feed(unsigned char byte) {
    switch (type_) {
      case Type::kString:
        len_ = Next(len_, byte);
        return len_ == pattern_.size();
      case Type::kNewlinesAndString:
        if (len_ == 0 && byte == '\n') {
          ++newlines_;
        } else {
          size_t next = Next(len_, byte);
          if (next <= len_) newlines_ = 0;
          len_ = next;
        }
        return len_ == pattern_.size();
      case Type::kLeadingNewline:
        if (leading_) matched_ = byte == '\n';
        leading_ = false;
        return matched_;
    }
    return false;
  }

  size_t matching_len() const {
    switch (type_) {
      case Type::kString:
        return len_;
      case Type::kNewlinesAndString:
        return len_ + newlines_;
      case Type::kLeadingNewline:
        return matched_ ? 1 : 0;
    }
    return 0;
  }
  Stage next() const { return next_; }
  Action on_match() const { return on_match_; }

 private:
  size_t Next(size_t len, unsigned char byte) const {
    while (len > 0 && static_cast<unsigned char>(pattern_[len]) != byte) len = table_[len - 1];
    if (len < pattern_.size() && static_cast<unsigned char>(pattern_[len]) == byte) ++len;
    return len;
  }

  Type type_;
  std::string pattern_;
  std::vector<size_t> table_;  // [pattern size] KMP failure function
  size_t len_ = 0;
  size_t newlines_ = 0;
  bool leading_ = true;
  bool matched_ = false;
  Stage next_;
  Action on_match_;
};

// A run of input bytes with what to do with them.
struct Segment {
  Action action;
  std::string bytes;
};

}  // namespace

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kToolCalls:
      return "tool_calls";
    case FinishReason::kContentFilter:
      return "content_filter";
  }
  return "stop";
}

struct OutputParser::Impl {
  OutputParserOptions options;
  Stage stage;
  std::vector<Matcher> matchers;  // the current stage's patterns, in priority order
  Action on_unmatched;
  std::string stash;           // bytes not yet assigned to an action (a possible pattern prefix)
  bool space_emitted = false;  // JSON mode: this stage instance already produced its space
  bool last_was_to_space = false;  // the latest non-empty run was turned into a space
  bool stopped = false;
  bool finished = false;
  std::string utf8_pending;  // incomplete trailing UTF-8 sequence of the input

  // recover_unparsed: tool-block text since the last complete call (or the block's start), and
  // JSON-mode text held back until it is known whether any JSON follows.
  std::string unsettled;
  bool after_invoke = false;  // unsettled follows a call's closing "</｜DSML｜" ("invoke>" is due)
  std::string held_plain;

  // Tool call being named: it becomes visible when the name ends.
  bool naming_call = false;
  std::string pending_name;
  ParseResult result;
  std::vector<ParserEvent> events;

  explicit Impl(OutputParserOptions opts) : options(std::move(opts)) {
    std::vector<std::string> stops;
    for (auto& s : options.stop_sequences)
      if (!s.empty()) stops.push_back(s);
    options.stop_sequences = std::move(stops);
    if (options.starts_in_tool_calls) {
      EnterStage({StageKind::kToolCalls, false});
    } else {
      switch (options.thinking) {
        case ThinkingStage::kOff:
          EnterStage({StageKind::kCommon, true});
          break;
        case ThinkingStage::kReasoningStart:
          EnterStage({StageKind::kReasoning, true});
          break;
        case ThinkingStage::kReasoningContinuation:
          EnterStage({StageKind::kReasoning, false});
          break;
        case ThinkingStage::kContentContinuation:
          EnterStage({StageKind::kCommon, false});
          break;
      }
    }
  }

  void Add(Matcher::Type type, std::string_view pattern, Stage next, Action action) {
    matchers.emplace_back(type, pattern, next, action);
  }
  void AddString(std::string_view pattern, Stage next, Action action) {
    Add(Matcher::Type::kString, pattern, next, action);
  }
  void AddStops() {
    for (const auto& s : options.stop_sequences)
      AddString(s, {StageKind::kFinished, false}, {ActionKind::kStopSequence, {}, false});
  }
  void AddToolCallBegin() {
    if (options.parse_tool_calls)
      Add(Matcher::Type::kNewlinesAndString, kDsmlBegin, {StageKind::kToolCalls, false},
          {ActionKind::kSkip, {}, false});
  }

  // recover_unparsed: JSON follows the held text, which stands for one space before it, as the
  // oracle writes it.
  void FlushHeldAsSpace() {
    if (held_plain.empty()) return;
    held_plain.clear();
    result.content.push_back(' ');
    Emit(ParserEvent::Kind::kContent, " ");
  }

  static bool InToolBlock(StageKind kind) {
    return kind == StageKind::kToolCalls || kind == StageKind::kToolName;
  }

  void EnterStage(Stage next) {
    // A call announced, a call complete, or the block closed: nothing is unsettled any more.
    if (!InToolBlock(next.kind) || (next.kind == StageKind::kToolCalls && !InToolBlock(stage.kind)))
      unsettled.clear();
    if (next.kind == StageKind::kJson) FlushHeldAsSpace();
    after_invoke =
        next.kind == StageKind::kToolCalls && stage.kind == StageKind::kToolCallArguments;
    stage = next;
    matchers.clear();
    stash.clear();
    space_emitted = false;
    const Action skip{ActionKind::kSkip, {}, false};
    switch (next.kind) {
      case StageKind::kCommon:
        if (options.parse_json_output) {
          for (auto label : kJsonFenceLabels) AddString(label, {StageKind::kJson, false}, skip);
          for (auto label : kRawJsonLabels)
            AddString(label, {StageKind::kJson, false}, {ActionKind::kContentLabel, label, false});
        } else {
          AddStops();
        }
        AddToolCallBegin();
        if (next.flag) Add(Matcher::Type::kLeadingNewline, "", {StageKind::kCommon, true}, skip);
        AddString(kReasoningEnd, {StageKind::kCommon, false}, skip);  // stray "</think>"
        on_unmatched = {
            options.parse_json_output ? ActionKind::kToSpace : ActionKind::kRaw, {}, false};
        break;
      case StageKind::kJson:
        AddStops();
        AddString(kJsonEnd, {StageKind::kMatchedJson, false}, skip);
        on_unmatched = {ActionKind::kRaw, {}, false};
        break;
      case StageKind::kMatchedJson:
        AddToolCallBegin();
        on_unmatched = {ActionKind::kToSpace, {}, false};
        break;
      case StageKind::kToolCalls:
        AddString(kInvokeName, {StageKind::kToolName, false},
                  {ActionKind::kToolCallBegin, {}, false});
        for (auto end : kToolCallsEnd) AddString(end, {StageKind::kFinished, false}, skip);
        on_unmatched = skip;
        break;
      case StageKind::kToolName:
        AddString("\"", {StageKind::kToolCallArguments, true},
                  {ActionKind::kToolNameEnd, {}, false});
        on_unmatched = {ActionKind::kToolName, {}, false};
        break;
      case StageKind::kToolCallArguments:
        AddString(kParameterName, {StageKind::kParamName, false},
                  {ActionKind::kArgumentsLabel, next.flag ? "{" : ", ", false});
        AddString(kDsmlEnd, {StageKind::kToolCalls, false},
                  {ActionKind::kArgumentsLabel, next.flag ? "{}" : "}", false});
        on_unmatched = skip;
        break;
      case StageKind::kParamName:
        AddString(kParameterNameEnd, {StageKind::kParamType, false},
                  {ActionKind::kArgumentsLabel, ": ", false});
        on_unmatched = {ActionKind::kRawArguments, {}, false};
        break;
      case StageKind::kParamType:
        AddString("true\">", {StageKind::kParamValue, true},
                  {ActionKind::kArgumentsLabel, "\"", false});
        AddString("false\">", {StageKind::kParamValue, false}, skip);
        on_unmatched = skip;
        break;
      case StageKind::kParamValue:
        AddString(kDsmlEnd, {StageKind::kToolCallArguments, false},
                  next.flag ? Action{ActionKind::kArgumentsLabel, "\"", false} : skip);
        on_unmatched = {ActionKind::kRawArguments, {}, next.flag};
        break;
      case StageKind::kReasoning:
        AddToolCallBegin();
        if (next.flag) Add(Matcher::Type::kLeadingNewline, "", {StageKind::kReasoning, true}, skip);
        Add(Matcher::Type::kNewlinesAndString, kReasoningEnd, {StageKind::kCommon, true}, skip);
        on_unmatched = {ActionKind::kReasoning, {}, false};
        break;
      case StageKind::kFinished:
        on_unmatched = skip;
        break;
    }
  }

  // --- event emission ---------------------------------------------------------------------------

  void Emit(ParserEvent::Kind kind, std::string_view text, int tool_index = -1) {
    if (text.empty() && kind != ParserEvent::Kind::kToolCallBegin) return;
    if (kind != ParserEvent::Kind::kToolCallBegin && !events.empty() &&
        events.back().kind == kind && events.back().tool_index == tool_index) {
      events.back().text.append(text);
      return;
    }
    events.push_back({kind, std::string(text), tool_index});
  }

  int current_call() const { return static_cast<int>(result.tool_calls.size()) - 1; }

  void AppendArguments(std::string_view text) {
    if (result.tool_calls.empty() || text.empty()) return;
    result.tool_calls.back().arguments.append(text);
    Emit(ParserEvent::Kind::kToolCallArguments, text, current_call());
  }

  // `final_flush`: the text left at Finish, which the oracle flushes as its own segment.
  void Apply(Action action, std::string_view bytes, bool final_flush) {
    const bool after_space = last_was_to_space;
    if (!bytes.empty()) last_was_to_space = action.kind == ActionKind::kToSpace;
    switch (action.kind) {
      case ActionKind::kRaw:
        result.content.append(bytes);
        Emit(ParserEvent::Kind::kContent, bytes);
        break;
      case ActionKind::kToSpace:
        if (options.recover_unparsed && stage.kind == StageKind::kCommon && !bytes.empty()) {
          held_plain.append(bytes);  // a space if JSON follows, itself if none does
          break;
        }
        // The oracle makes one space of each run it flushes; the text left at the end joins the
        // run before it when that run was also turned into a space.
        if (bytes.empty() || (final_flush ? after_space : space_emitted)) break;
        space_emitted = true;
        result.content.push_back(' ');
        Emit(ParserEvent::Kind::kContent, " ");
        break;
      case ActionKind::kContentLabel:
        FlushHeldAsSpace();
        result.content.append(action.label);
        Emit(ParserEvent::Kind::kContent, action.label);
        break;
      case ActionKind::kReasoning:
        result.reasoning.append(bytes);
        Emit(ParserEvent::Kind::kReasoning, bytes);
        break;
      case ActionKind::kSkip:
        break;
      case ActionKind::kStopSequence:
        stopped = true;
        result.stop_sequence = std::string(bytes);
        result.finish_reason = FinishReason::kStop;
        Emit(ParserEvent::Kind::kStopSequence, bytes);
        break;
      case ActionKind::kToolCallBegin:
        naming_call = true;
        pending_name.clear();
        break;
      case ActionKind::kToolName:
        if (naming_call) pending_name.append(bytes);
        break;
      case ActionKind::kToolNameEnd:
        if (!naming_call) break;
        naming_call = false;
        result.tool_calls.push_back({pending_name, ""});
        Emit(ParserEvent::Kind::kToolCallBegin, pending_name, current_call());
        break;
      case ActionKind::kArgumentsLabel:
        AppendArguments(action.label);
        break;
      case ActionKind::kRawArguments:
        if (action.string) {
          std::string escaped;
          AppendJsonEscaped(bytes, &escaped);
          AppendArguments(escaped);
        } else {
          AppendArguments(bytes);
        }
        break;
    }
  }

  // recover_unparsed, at the end: the text of a tool block no call came of, and JSON-mode text
  // that no JSON followed, become answer content.
  void Recover() {
    std::string text;
    if (after_invoke) {  // the rest of the call's closing tag is markup, not text
      constexpr std::string_view kInvokeTail = "invoke>";
      size_t n = 0;
      while (n < unsettled.size() && n < kInvokeTail.size() && unsettled[n] == kInvokeTail[n]) ++n;
      unsettled.erase(0, n);
    }
    if (InToolBlock(stage.kind) && unsettled.find_first_not_of(" \t\r\n") != std::string::npos)
      text = std::move(unsettled);
    else if (stage.kind == StageKind::kCommon)
      text = std::move(held_plain);
    unsettled.clear();
    held_plain.clear();
    if (text.empty()) return;
    result.content.append(text);
    Emit(ParserEvent::Kind::kContent, text);
  }

  // Runs the matcher over complete UTF-8 text.
  void Run(std::string_view text) {
    for (size_t i = 0; i < text.size() && !stopped; ++i) {
      stash.push_back(text[i]);
      if (InToolBlock(stage.kind)) unsettled.push_back(text[i]);
      const Matcher* completed = nullptr;
      for (auto& m : matchers) {
        if (m.Feed(static_cast<unsigned char>(text[i]))) {
          completed = &m;
          break;
        }
      }
      if (!completed) continue;
      const size_t matched = completed->matching_len();
      const Stage next = completed->next();
      const Action on_match = completed->on_match();
      std::string_view all(stash);
      if (matched < all.size()) Apply(on_unmatched, all.substr(0, all.size() - matched), false);
      if (matched > 0) Apply(on_match, all.substr(all.size() - matched), false);
      const bool block_opens = next.kind == StageKind::kToolCalls && !InToolBlock(stage.kind) &&
                               stage.kind != StageKind::kToolCallArguments;
      // The block's opening marker, copied before EnterStage clears the stash it lies in.
      std::string marker = block_opens ? std::string(all.substr(all.size() - matched)) : "";
      EnterStage(next);
      if (block_opens)
        unsettled = marker.substr(std::min(marker.find_first_not_of('\n'), marker.size()));
    }
    if (stopped) return;
    // Bytes that no pattern can still claim are final now.
    size_t held = 0;
    for (const auto& m : matchers) held = std::max(held, m.matching_len());
    if (held < stash.size()) {
      Apply(on_unmatched, std::string_view(stash).substr(0, stash.size() - held), false);
      stash.erase(0, stash.size() - held);
    }
  }
};

OutputParser::OutputParser(OutputParserOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}
OutputParser::OutputParser(OutputParser&&) noexcept = default;
OutputParser& OutputParser::operator=(OutputParser&&) noexcept = default;
OutputParser::~OutputParser() = default;

std::vector<ParserEvent> OutputParser::Feed(std::string_view bytes) {
  Impl& s = *impl_;
  if (s.stopped || s.finished) return {};
  s.events.clear();
  // Only whole characters reach the matcher, so deltas never split a UTF-8 sequence.
  std::string input = std::move(s.utf8_pending);
  s.utf8_pending.clear();
  input.append(bytes);
  const size_t ready = StreamSafePrefixLength(input);
  s.utf8_pending = input.substr(ready);
  input.resize(ready);
  if (IsValidUtf8(input)) {
    s.Run(input);
  } else {
    s.Run(Utf8Lossy(input));
  }
  return std::move(s.events);
}

std::vector<ParserEvent> OutputParser::Finish(BackendFinish backend_finish) {
  Impl& s = *impl_;
  if (s.finished) return {};
  s.events.clear();
  if (!s.stopped) {
    if (!s.utf8_pending.empty()) {
      std::string tail = Utf8Lossy(s.utf8_pending);  // an unfinished character: U+FFFD
      s.utf8_pending.clear();
      s.Run(tail);
    }
  }
  if (!s.stopped) {
    if (!s.stash.empty()) s.Apply(s.on_unmatched, s.stash, /*final_flush=*/true);
    s.stash.clear();
    if (s.options.recover_unparsed) s.Recover();
    switch (backend_finish) {
      case BackendFinish::kStop:
        s.result.finish_reason =
            s.result.tool_calls.empty() ? FinishReason::kStop : FinishReason::kToolCalls;
        break;
      case BackendFinish::kLength:
        s.result.finish_reason = FinishReason::kLength;
        break;
      case BackendFinish::kContentFilter:
        s.result.finish_reason = FinishReason::kContentFilter;
        break;
    }
  }
  s.finished = true;
  return std::move(s.events);
}

bool OutputParser::done() const { return impl_->stopped || impl_->finished; }

const ParseResult& OutputParser::result() const { return impl_->result; }

}  // namespace dsinfer::text
