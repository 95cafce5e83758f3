// A tokenizer.json with some added tokens' contents replaced (tokenizer.h,
// ApplyAddedTokenOverlay): how the V4.1 tokenizer is made from V4's.
#include <nlohmann/json.hpp>

#include "text/tokenizer.h"
#include "text/utf8.h"

namespace dsinfer::text {

Result<std::string> ApplyAddedTokenOverlay(std::string_view tokenizer_json,
                                           std::string_view overlay_json) {
  using Json = nlohmann::json;
  try {
    Json tok = Json::parse(tokenizer_json);
    const Json overlay = Json::parse(overlay_json);
    const auto contents = overlay.find("added_token_content");
    if (!overlay.is_object() || contents == overlay.end() || !contents->is_object())
      return InvalidArgument("tokenizer overlay: needs an object 'added_token_content'");
    if (!tok.is_object() || !tok.contains("added_tokens") || !tok["added_tokens"].is_array())
      return InvalidArgument("tokenizer overlay: the tokenizer has no added_tokens array");
    for (const auto& [id_text, content] : contents->items()) {
      if (!content.is_string() || !IsValidUtf8(content.get<std::string>()))
        return InvalidArgument("tokenizer overlay: content of id " + id_text +
                               " must be a UTF-8 string");
      bool found = false;
      for (Json& t : tok["added_tokens"]) {
        if (t.is_object() && t.contains("id") && t["id"].is_number_integer() &&
            std::to_string(t["id"].get<int64_t>()) == id_text) {
          t["content"] = content;
          found = true;
        }
      }
      if (!found)
        return InvalidArgument("tokenizer overlay: id " + id_text +
                               " is not an added token of this tokenizer");
    }
    return tok.dump(2) + "\n";
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(std::string("tokenizer overlay: ") + e.what());
  }
}

}  // namespace dsinfer::text
