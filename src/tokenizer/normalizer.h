// Normalizers of tokenizer.json ("normalizer" field): NFC/NFD/NFKC/NFKD, Lowercase, Prepend,
// Replace (string or regex), Strip and Sequence, each a pure in-place rewrite of a valid UTF-8
// string. Built once from JSON; an unknown type fails with moet::Error naming it.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>

namespace moet::tok {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void apply(std::string& text) const = 0;
};

// nullptr for a JSON null (no normalizer).
std::unique_ptr<Normalizer> normalizer_from_json(const nlohmann::json& spec);

// Replaces every match of a tokenizer.json pattern ({"String": s} or {"Regex": r}); shared by the
// Replace normalizer and the Replace decoder.
class PatternReplacer {
 public:
  PatternReplacer(const nlohmann::json& pattern, std::string content);
  ~PatternReplacer();
  std::string apply(const std::string& text) const;

 private:
  std::unique_ptr<class Regex> regex_;
  std::string content_;
};

// {"String": s} -> escaped s, {"Regex": r} -> r.
std::string pattern_from_json(const nlohmann::json& pattern);

}  // namespace moet::tok
