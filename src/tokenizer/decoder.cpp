// Decoder and post-processor implementations (see decoder.h); each step mirrors the HF
// tokenizers decoder of the same name.
#include "tokenizer/decoder.h"

#include "core/error.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/unicode.h"

namespace moet::tok {

int byte_fallback_value(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
  int value = 0;
  for (int k = 3; k < 5; ++k) {
    const char c = token[k];
    const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

namespace {

class ByteLevelDecoder final : public Decoder {
 public:
  void apply(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const auto& t : tokens) {
      if (auto raw = unicode_to_bytes(t)) bytes += *raw;
      else bytes += t;
    }
    tokens.assign(1, utf8_lossy(bytes));
  }
};

class MetaspaceDecoder final : public Decoder {
 public:
  explicit MetaspaceDecoder(const nlohmann::json& spec)
      : replacer_(nlohmann::json{{"String", spec.value("replacement", "\xE2\x96\x81")}}, " "),
        strip_first_(spec.value("prepend_scheme", spec.value("add_prefix_space", true) ? "always" : "never") !=
                     "never") {}
  void apply(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = replacer_.apply(tokens[i]);
      if (i == 0 && strip_first_ && !tokens[i].empty() && tokens[i][0] == ' ') tokens[i].erase(0, 1);
    }
  }

 private:
  PatternReplacer replacer_;
  bool strip_first_;
};

class ByteFallbackDecoder final : public Decoder {
 public:
  bool uses_byte_fallback() const override { return true; }
  void apply(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string pending;
    const auto flush = [&] {
      if (pending.empty()) return;
      if (utf8_is_valid(pending)) out.push_back(pending);
      else
        for (size_t k = 0; k < pending.size(); ++k) out.emplace_back("\xEF\xBF\xBD");
      pending.clear();
    };
    for (auto& t : tokens) {
      const int value = byte_fallback_value(t);
      if (value >= 0) {
        pending.push_back(char(value));
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }
};

class FuseDecoder final : public Decoder {
 public:
  void apply(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.assign(1, all);
  }
};

class StripDecoder final : public Decoder {
 public:
  explicit StripDecoder(const nlohmann::json& spec)
      : content_(spec.at("content").get<std::string>()), start_(spec.value("start", 0)), stop_(spec.value("stop", 0)) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) {
      std::vector<std::string> chars;
      for (size_t i = 0; i < t.size();) {
        const size_t begin = i;
        utf8_next(t, i);
        chars.push_back(t.substr(begin, i - begin));
      }
      size_t lo = 0, hi = chars.size();
      while (lo < size_t(start_) && lo < hi && chars[lo] == content_) ++lo;
      while (chars.size() - hi < size_t(stop_) && hi > lo && chars[hi - 1] == content_) --hi;
      std::string out;
      for (size_t k = lo; k < hi; ++k) out += chars[k];
      t = std::move(out);
    }
  }

 private:
  std::string content_;
  int start_, stop_;
};

class ReplaceDecoder final : public Decoder {
 public:
  explicit ReplaceDecoder(const nlohmann::json& spec)
      : replacer_(spec.at("pattern"), spec.at("content").get<std::string>()) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) t = replacer_.apply(t);
  }

 private:
  PatternReplacer replacer_;
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps) : steps_(std::move(steps)) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (const auto& step : steps_) step->apply(tokens);
  }
  bool uses_byte_fallback() const override {
    for (const auto& step : steps_)
      if (step->uses_byte_fallback()) return true;
    return false;
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

}  // namespace

std::unique_ptr<Decoder> make_byte_level_decoder() { return std::make_unique<ByteLevelDecoder>(); }

std::unique_ptr<Decoder> decoder_from_json(const nlohmann::json& spec) {
  if (spec.is_null()) return nullptr;
  const std::string type = spec.at("type").get<std::string>();
  if (type == "ByteLevel") return make_byte_level_decoder();
  if (type == "Metaspace") return std::make_unique<MetaspaceDecoder>(spec);
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") return std::make_unique<StripDecoder>(spec);
  if (type == "Replace") return std::make_unique<ReplaceDecoder>(spec);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> steps;
    for (const auto& step : spec.at("decoders"))
      if (auto d = decoder_from_json(step)) steps.push_back(std::move(d));
    return std::make_unique<SequenceDecoder>(std::move(steps));
  }
  fail("unsupported decoder type '{}'", type);
}

namespace {

// Collects the ids of one TemplateProcessing "single" template around sequence A.
void template_ids(const nlohmann::json& spec, std::vector<int32_t>& prefix, std::vector<int32_t>& suffix) {
  bool seen_sequence = false;
  for (const auto& item : spec.at("single")) {
    if (item.contains("Sequence")) {
      seen_sequence = true;
      continue;
    }
    const std::string name = item.at("SpecialToken").at("id").get<std::string>();
    const auto& ids = spec.at("special_tokens").at(name).at("ids");
    for (const auto& id : ids) (seen_sequence ? suffix : prefix).push_back(id.get<int32_t>());
  }
}

}  // namespace

PostProcessor::PostProcessor(const nlohmann::json& spec) {
  if (spec.is_null()) return;
  const std::string type = spec.at("type").get<std::string>();
  if (type == "TemplateProcessing") {
    template_ids(spec, prefix_, suffix_);
  } else if (type == "Sequence") {
    for (const auto& step : spec.at("processors")) {
      const PostProcessor inner(step);
      prefix_.insert(prefix_.end(), inner.prefix_.begin(), inner.prefix_.end());
      suffix_.insert(suffix_.end(), inner.suffix_.begin(), inner.suffix_.end());
    }
  } else if (type != "ByteLevel") {
    fail("unsupported post_processor type '{}'", type);
  }
}

void PostProcessor::apply(std::vector<int32_t>& ids, bool add_special_tokens) const {
  if (!add_special_tokens) return;
  ids.insert(ids.begin(), prefix_.begin(), prefix_.end());
  ids.insert(ids.end(), suffix_.begin(), suffix_.end());
}

}  // namespace moet::tok
