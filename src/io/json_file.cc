#include "io/json_file.h"

#include <exception>
#include <unordered_set>
#include <vector>

#include "io/mapped_file.h"

namespace dsinfer::io {
namespace {

using json = nlohmann::json;

constexpr uint64_t kMaxJsonFileBytes = 64ull << 20;

// A validating SAX pass run before the DOM is built: it sees every key of every object (the
// DOM keeps only the last of duplicates) and stops at the first over-deep container, so the
// DOM built afterwards is known to be shallow and duplicate-free.
class ValidatingSax : public nlohmann::json_sax<json> {
 public:
  explicit ValidatingSax(const JsonParseLimits& limits) : limits_(limits) {}

  const std::string& error() const { return error_; }

  bool null() override { return true; }
  bool boolean(bool /*value*/) override { return true; }
  bool number_integer(number_integer_t /*value*/) override { return true; }
  bool number_unsigned(number_unsigned_t /*value*/) override { return true; }
  bool number_float(number_float_t /*value*/, const string_t& /*text*/) override { return true; }
  bool string(string_t& /*value*/) override { return true; }
  bool binary(binary_t& /*value*/) override { return true; }

  bool start_object(std::size_t /*elements*/) override { return Open(/*is_object=*/true); }
  bool end_object() override { return Close(); }
  bool start_array(std::size_t /*elements*/) override { return Open(/*is_object=*/false); }
  bool end_array() override { return Close(); }

  bool key(string_t& key) override {
    Frame& frame = frames_.back();
    if (!frame.keys.insert(key).second) {
      error_ = "duplicate key '" + key + "' in " + frame.Describe();
      return false;
    }
    last_key_ = key;
    return true;
  }

  bool parse_error(std::size_t position, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& ex) override {
    // ex.what() already carries "line L, column C" and what was expected.
    error_ = "invalid JSON at byte " + std::to_string(position) + ": " + ex.what();
    return false;
  }

 private:
  struct Frame {
    bool is_object = false;
    std::string name_in_parent;  // key (or "[]" for array elements) under which it was opened
    std::unordered_set<std::string> keys;
    std::string Describe() const {
      return name_in_parent.empty() ? std::string("the top-level object")
                                    : "object '" + name_in_parent + "'";
    }
  };

  bool Open(bool is_object) {
    if (static_cast<int>(frames_.size()) >= limits_.max_depth) {
      error_ = "JSON nested deeper than " + std::to_string(limits_.max_depth) + " levels";
      return false;
    }
    Frame frame;
    frame.is_object = is_object;
    if (!frames_.empty()) frame.name_in_parent = frames_.back().is_object ? last_key_ : "[]";
    frames_.push_back(std::move(frame));
    return true;
  }

  bool Close() {
    if (!frames_.empty()) frames_.pop_back();
    return true;
  }

  JsonParseLimits limits_;
  std::vector<Frame> frames_;  // open containers, outermost first
  std::string last_key_;
  std::string error_;
};

}  // namespace

Result<nlohmann::json> ParseJsonText(std::string_view text, const std::string& source,
                                     const JsonParseLimits& limits) {
  try {
    ValidatingSax validator(limits);
    const bool valid = json::sax_parse(text.begin(), text.end(), &validator);
    if (!valid) {
      std::string why = validator.error().empty() ? "invalid JSON" : validator.error();
      return InvalidArgument(source + ": " + why);
    }
    json document = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
    if (document.is_discarded()) {
      return Internal(source + ": JSON accepted by the validating pass but not by the parser");
    }
    return document;
  } catch (const std::exception& e) {  // nlohmann::json errors, std::bad_alloc
    return InvalidArgument(source + ": cannot parse JSON: " + e.what());
  }
}

Result<nlohmann::json> ReadJsonFile(const std::string& path) {
  DSINFER_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file, MappedFile::Open(path));
  if (file->size() > kMaxJsonFileBytes) {
    return InvalidArgument(path + ": JSON file is " + std::to_string(file->size()) +
                           " bytes, more than the 64 MiB limit");
  }
  std::span<const uint8_t> bytes = file->bytes();
  std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  return ParseJsonText(text, path);
}

}  // namespace dsinfer::io
