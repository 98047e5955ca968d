// Tokenizer unit tests: UTF-8 repair, llama.cpp's Qwen2 vocabulary test (47 cases with known ids)
// on the real Qwen3 tokenizer.json, special-token handling and model-folder metadata. Parity with
// HF tokenizers on large corpora lives in tests/python/tokenizer/test_tokenizer_golden.py.
#include "core/error.h"
#include "tokenizer/model_files.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

#include <gtest/gtest.h>

#include <sstream>

namespace {

const std::string kData = std::string(MOET_SOURCE_DIR) + "/../shared/data";

const moet::Tokenizer& qwen3() {
  static const moet::Tokenizer t = moet::Tokenizer::from_dir(kData + "/qwen3");
  return t;
}

TEST(Utf8, LossyReplacesMaximalSubparts) {
  using moet::tok::utf8_lossy;
  EXPECT_EQ(utf8_lossy("abc"), "abc");
  EXPECT_EQ(utf8_lossy("a\xE4\xB8"), "a\xEF\xBF\xBD");              // truncated 3-byte char: one U+FFFD
  EXPECT_EQ(utf8_lossy("\xE4\xB8x"), "\xEF\xBF\xBDx");
  EXPECT_EQ(utf8_lossy("\xFF\xFE"), "\xEF\xBF\xBD\xEF\xBF\xBD");     // each invalid byte
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_TRUE(moet::tok::utf8_is_valid("\xF0\x9F\x98\x80"));
}

TEST(Utf8, ByteLevelTableRoundTrips) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(char(b));
  const auto back = moet::tok::unicode_to_bytes(moet::tok::bytes_to_unicode_string(all));
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(*back, all);
  EXPECT_EQ(moet::tok::bytes_to_unicode_string(" "), "\xC4\xA0");  // "Ġ"
}

TEST(Tokenizer, LlamaCppQwen2VocabTest) {
  const std::string inputs = moet::tok::read_file(kData + "/qwen3/llama.cpp-vocab-test-qwen2.inp");
  std::istringstream expected(moet::tok::read_file(kData + "/qwen3/llama.cpp-vocab-test-qwen2.out"));
  const std::string separator = "\n__ggml_vocab_test__\n";
  size_t start = 0, cases = 0;
  for (size_t at = inputs.find(separator); at != std::string::npos; at = inputs.find(separator, start)) {
    const std::string text = inputs.substr(start, at - start);
    start = at + separator.size();
    std::string line;
    ASSERT_TRUE(std::getline(expected, line));
    std::istringstream ids_text(line);
    std::vector<int32_t> want;
    for (int32_t id; ids_text >> id;) want.push_back(id);
    EXPECT_EQ(qwen3().encode(text, false), want) << "case " << cases << ": '" << text << "'";
    ++cases;
  }
  EXPECT_EQ(cases, 46u);
}

TEST(Tokenizer, SpecialTokensAreMatchedAndSkippable) {
  const auto ids = qwen3().encode("<|im_start|>user\nhi<|im_end|>", false);
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), *qwen3().token_to_id("<|im_start|>"));
  EXPECT_EQ(ids.back(), *qwen3().token_to_id("<|im_end|>"));
  EXPECT_TRUE(qwen3().is_special(ids.front()));
  EXPECT_EQ(qwen3().decode(ids, false), "<|im_start|>user\nhi<|im_end|>");
  EXPECT_EQ(qwen3().decode(ids, true), "user\nhi");
}

TEST(Tokenizer, InvalidUtf8InputIsRepaired) {
  EXPECT_EQ(qwen3().encode("a\xFF" "b", false), qwen3().encode("a\xEF\xBF\xBD" "b", false));
}

TEST(Tokenizer, ModelFolderMetadata) {
  const auto gpt_oss = moet::Tokenizer::from_dir(kData + "/gpt-oss");  // tokenizer.json.gz
  EXPECT_EQ(gpt_oss.info().eos_ids, (std::vector<int32_t>{200002, 199999}));  // generation_config.json
  const auto mixtral = moet::Tokenizer::from_dir(kData + "/mixtral");
  EXPECT_TRUE(mixtral.info().add_bos_token);
  EXPECT_EQ(mixtral.info().bos_id, 1);
  EXPECT_EQ(mixtral.encode("Hi", true).front(), 1);  // TemplateProcessing adds <s>
  const auto kimi = moet::Tokenizer::from_dir(kData + "/kimi-k2");  // tiktoken.model
  EXPECT_EQ(kimi.token_to_id("<|im_end|>"), 163586);
  EXPECT_EQ(kimi.token_to_id("<|reserved_token_163589|>"), 163589);
  EXPECT_EQ(kimi.decode(kimi.encode("Kimi 你好 123", false)), "Kimi 你好 123");
}

TEST(Tokenizer, MissingFolderFailsWithItsName) {
  try {
    moet::Tokenizer::from_dir("/nonexistent/model");
    FAIL();
  } catch (const moet::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/model"), std::string::npos);
  }
}

}  // namespace
