// The draft-vocabulary file (model/draft_vocabulary.h): a JSON array of distinct token ids in the
// vocabulary, returned ascending; anything else is refused with the file and entry named.
#include "model/draft_vocabulary.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace dsinfer::model {
namespace {

TEST(DraftVocabularyFile, IdsComeBackAscending) {
  auto ids = ParseDraftVocabulary("[7, 0, 1023, 5]\n", 1024, "map.json");
  ASSERT_TRUE(ids.ok()) << ids.status().ToString();
  EXPECT_EQ(*ids, (std::vector<int32_t>{0, 5, 7, 1023}));
}

TEST(DraftVocabularyFile, BadFilesAreRefusedWithTheReason) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "map.json"},                       // no JSON at all
      {"[1, 2", "map.json"},                  // truncated
      {"{\"ids\": [1]}", "non-empty JSON array"},
      {"[]", "non-empty JSON array"},
      {"[1, 2.5]", "entry 1 (2.5)"},
      {"[1, \"2\"]", "entry 1"},
      {"[1, true]", "entry 1"},
      {"[-1]", "entry 0 (-1)"},
      {"[1024]", "[0, 1024)"},
      {"[99999999999]", "entry 0"},
      {"[3, 4, 3]", "token id 3 appears twice"},
      {"[[1]]", "entry 0"},
  };
  for (const auto& [text, reason] : cases) {
    auto ids = ParseDraftVocabulary(text, 1024, "map.json");
    ASSERT_FALSE(ids.ok()) << text;
    EXPECT_NE(ids.status().message().find(reason), std::string::npos)
        << text << " -> " << ids.status().ToString();
    EXPECT_NE(ids.status().message().find("map.json"), std::string::npos) << text;
  }
}

TEST(DraftVocabularyFile, AMissingFileIsAnError) {
  auto ids = ReadDraftVocabulary("/nonexistent/draft-vocabulary.json", 1024);
  ASSERT_FALSE(ids.ok());
  EXPECT_NE(ids.status().ToString().find("/nonexistent/draft-vocabulary.json"), std::string::npos);
}

}  // namespace
}  // namespace dsinfer::model
