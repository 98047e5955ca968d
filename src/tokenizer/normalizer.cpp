// Normalizer implementations (see normalizer.h).
#include "tokenizer/normalizer.h"

#include "core/error.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

#include <vector>

namespace moet::tok {

std::string pattern_from_json(const nlohmann::json& pattern) {
  if (pattern.contains("String")) return regex_escape(pattern["String"].get<std::string>());
  if (pattern.contains("Regex")) return pattern["Regex"].get<std::string>();
  fail("tokenizer pattern must hold String or Regex: {}", pattern.dump());
}

PatternReplacer::PatternReplacer(const nlohmann::json& pattern, std::string content)
    : regex_(std::make_unique<Regex>(pattern_from_json(pattern))), content_(std::move(content)) {}

PatternReplacer::~PatternReplacer() = default;

std::string PatternReplacer::apply(const std::string& text) const {
  std::string out;
  size_t last = 0;
  regex_->for_each_match(text, [&](size_t begin, size_t end) {
    out.append(text, last, begin - last);
    out.append(content_);
    last = end;
  });
  out.append(text, last, std::string::npos);
  return out;
}

namespace {

class FormNormalizer final : public Normalizer {
 public:
  explicit FormNormalizer(NormalForm form) : form_(form) {}
  void apply(std::string& text) const override { text = unicode_normalize(text, form_); }

 private:
  NormalForm form_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  void apply(std::string& text) const override { text = unicode_lowercase(text); }
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void apply(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  explicit ReplaceNormalizer(const nlohmann::json& spec)
      : replacer_(spec.at("pattern"), spec.at("content").get<std::string>()) {}
  void apply(std::string& text) const override { text = replacer_.apply(text); }

 private:
  PatternReplacer replacer_;
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void apply(std::string& text) const override {
    static const Regex lead("^\\s+"), trail("\\s+$");
    if (left_) erase_match(lead, text);
    if (right_) erase_match(trail, text);
  }

 private:
  static void erase_match(const Regex& regex, std::string& text) {
    size_t begin = 0, end = 0;
    regex.for_each_match(text, [&](size_t b, size_t e) { begin = b, end = e; });
    text.erase(begin, end - begin);
  }
  bool left_, right_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  void apply(std::string& text) const override {
    for (const auto& step : steps_) step->apply(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

}  // namespace

std::unique_ptr<Normalizer> normalizer_from_json(const nlohmann::json& spec) {
  if (spec.is_null()) return nullptr;
  const std::string type = spec.at("type").get<std::string>();
  if (type == "NFC") return std::make_unique<FormNormalizer>(NormalForm::nfc);
  if (type == "NFD") return std::make_unique<FormNormalizer>(NormalForm::nfd);
  if (type == "NFKC") return std::make_unique<FormNormalizer>(NormalForm::nfkc);
  if (type == "NFKD") return std::make_unique<FormNormalizer>(NormalForm::nfkd);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "Prepend") return std::make_unique<PrependNormalizer>(spec.at("prepend").get<std::string>());
  if (type == "Replace") return std::make_unique<ReplaceNormalizer>(spec);
  if (type == "Strip")
    return std::make_unique<StripNormalizer>(spec.value("strip_left", true), spec.value("strip_right", true));
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (const auto& step : spec.at("normalizers"))
      if (auto n = normalizer_from_json(step)) steps.push_back(std::move(n));
    return std::make_unique<SequenceNormalizer>(std::move(steps));
  }
  fail("unsupported normalizer type '{}'", type);
}

}  // namespace moet::tok
