// tiktoken vocabularies (Kimi-K2's tiktoken.model): ranks are ids, merges are implied by the
// ranks (BpeModel::from_ranks), the split regex is Kimi's pat_str and special tokens come from
// tokenizer_config.json's added_tokens_decoder, with the unnamed slots of the 256 reserved ids
// after the ranks named <|reserved_token_N|> as tokenization_kimi.py does.
#include "core/error.h"
#include "tokenizer/jinja_value.h"
#include "tokenizer/model_files.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

#include <map>
#include <sstream>

namespace moet {

namespace {

constexpr int kReservedSpecialTokens = 256;

// Kimi's pat_str. tiktoken's regex engine supports class intersection ([...&&[^\p{Han}]]), PCRE2
// does not, so each intersected class is written as a negative lookahead plus the class. Han is
// \\p{sc:Han} (Script, as Oniguruma in HF tokenizers): PCRE2's bare \\p{Han} means Script_Extensions,
// which would also take "。" and other shared CJK punctuation.
constexpr const char* kKimiPattern =
    "[\\p{sc:Han}]+"
    "|[^\\r\\n\\p{L}\\p{N}]?(?:(?!\\p{sc:Han})[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}])*"
    "(?:(?!\\p{sc:Han})[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}])+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|[^\\r\\n\\p{L}\\p{N}]?(?:(?!\\p{sc:Han})[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}])+"
    "(?:(?!\\p{sc:Han})[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}])*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|\\p{N}{1,3}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+"
    "|\\s+(?!\\S)"
    "|\\s+";

std::string base64_decode(std::string_view in) {
  static const std::string alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  uint32_t buffer = 0;
  int bits = 0;
  for (char c : in) {
    if (c == '=') break;
    const size_t v = alphabet.find(c);
    if (v == std::string::npos) fail("invalid base64 character in tiktoken.model");
    buffer = (buffer << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(char((buffer >> bits) & 0xFF));
    }
  }
  return out;
}

}  // namespace

std::shared_ptr<Tokenizer::Impl> tiktoken_load(const std::string& path, const nlohmann::ordered_json& config) {
  auto impl = std::make_shared<Tokenizer::Impl>();
  std::istringstream lines(tok::read_file(path));
  std::string line;
  tok::Vocab ranks;
  int32_t max_rank = -1;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    if (space == std::string::npos) fail("{}: malformed line '{}'", path, line);
    const std::string bytes = base64_decode(std::string_view(line).substr(0, space));
    const auto rank = jinja::parse_int(line.substr(space + 1));
    if (!rank || *rank < 0 || *rank > INT32_MAX) fail("{}: bad rank in line '{}'", path, line);
    impl->set_token(int32_t(*rank), tok::bytes_to_unicode_string(bytes));
    ranks.emplace(bytes, int32_t(*rank));
    max_rank = std::max(max_rank, int32_t(*rank));
  }
  impl->model.emplace(tok::BpeModel::from_ranks(std::move(ranks)));
  impl->pre_tokenizer = tok::make_split_pre_tokenizer(kKimiPattern, "Isolated", false);
  impl->decoder = tok::make_byte_level_decoder();
  impl->post_processor.emplace(nlohmann::json());

  std::map<int32_t, tok::AddedToken> specials;
  for (int32_t k = 0; k < kReservedSpecialTokens; ++k) {
    const int32_t id = max_rank + 1 + k;
    specials[id] = {"<|reserved_token_" + std::to_string(id) + "|>", id, true};
  }
  const auto declared = config.value("added_tokens_decoder", nlohmann::ordered_json::object());
  for (const auto& [key, j] : declared.items()) {
    tok::AddedToken t;
    const auto id = jinja::parse_int(key);
    if (!id || *id < 0 || *id > INT32_MAX) fail("tokenizer_config.json: bad added token id '{}'", key);
    t.id = int32_t(*id);
    t.content = j.at("content").get<std::string>();
    t.special = j.value("special", true);
    t.lstrip = j.value("lstrip", false);
    t.rstrip = j.value("rstrip", false);
    t.normalized = j.value("normalized", false);
    t.single_word = j.value("single_word", false);
    specials[t.id] = t;
  }
  std::vector<tok::AddedToken> added;
  for (auto& [id, t] : specials) added.push_back(std::move(t));
  impl->set_added_tokens(std::move(added));
  return impl;
}

}  // namespace moet
