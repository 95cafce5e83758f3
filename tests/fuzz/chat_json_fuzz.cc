// libFuzzer target for text::ParseJson (strict RFC 8259, the prompt renderer's JSON) and the
// printers behind it. Byte 0 picks the check:
//   even: the rest is a JSON document. Accepted documents must print in both float styles, and
//         parsing must be deterministic (the same document twice gives the same printing).
//   odd:  the rest is a string. When it is valid UTF-8, escaping it the way serde_json does and
//         parsing the quoted result must give it back exactly; invalid UTF-8 is rejected.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "text/chat_json_value.h"
#include "text/utf8.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  using dsinfer::text::FloatStyle;
  if ((data[0] & 1) == 0) {
    auto parsed = dsinfer::text::ParseJson(rest);
    if (!parsed.ok()) return 0;
    const std::string ryu = dsinfer::text::StringifyPythonStyle(*parsed, FloatStyle::kRyuPlus);
    const std::string repr = dsinfer::text::StringifyPythonStyle(*parsed, FloatStyle::kPythonRepr);
    if (!dsinfer::text::IsValidUtf8(ryu) || !dsinfer::text::IsValidUtf8(repr)) std::abort();
    auto again = dsinfer::text::ParseJson(rest);
    if (!again.ok() || dsinfer::text::StringifyPythonStyle(*again, FloatStyle::kRyuPlus) != ryu) {
      std::abort();
    }
    return 0;
  }
  std::string quoted = "\"";
  dsinfer::text::AppendJsonEscaped(rest, &quoted);
  quoted += '"';
  auto parsed = dsinfer::text::ParseJson(quoted);
  if (dsinfer::text::IsValidUtf8(rest)) {
    if (!parsed.ok() || parsed->kind != dsinfer::text::JsonValue::Kind::kString ||
        parsed->string_value != rest) {
      std::abort();
    }
  } else if (parsed.ok()) {
    std::abort();  // JSON text is UTF-8: an ill-formed byte must not get through
  }
  return 0;
}
