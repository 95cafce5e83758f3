// DeepSeek-V4.1 Engram's compressed vocabulary (spec §14.5 step 1): every token id mapped to a
// class by the normalised text it decodes to, so that "The", " the" and "THE" share n-gram
// hash rows. The rule, per id in increasing order:
//   text = Decode([id]) (special tokens kept);
//   key  = the raw token string if text holds U+FFFD (a partial UTF-8 sequence), else
//          normalise(text) = NFKC -> NFD -> strip marks (General_Category M) -> per-character
//          lowercase -> [ \t\r\n]+ to " " -> strip Unicode whitespace (a lone " " is kept),
//          or text itself when that is empty;
//   class = the first-seen index of key.
// This is HF tokenizers' normalizer Sequence of the official engram.py, with ICU providing the
// Unicode tables. On the V4 / V4.1 tokenizer it gives 99,092 classes (the released
// engram_compressed_vocab_size), checked against the oracle's fixture in tests/text.
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "text/tokenizer.h"

namespace dsinfer::text {

// The normalisation above (the U+FFFD rule excepted). Input must be valid UTF-8.
Result<std::string> EngramNormalize(std::string_view text);

struct EngramTokenMap {
  std::vector<int32_t> class_of;  // [tokenizer vocab_size]
  int64_t classes = 0;
};
Result<EngramTokenMap> BuildEngramTokenMap(const Tokenizer& tokenizer);

}  // namespace dsinfer::text
