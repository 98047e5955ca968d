// Pre-tokenizer implementations (see pre_tokenizer.h). Split behaviours follow HF tokenizers'
// SplitDelimiterBehavior exactly (normalizer.rs / pattern.rs).
#include "tokenizer/pre_tokenizer.h"

#include "core/error.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/regex.h"

namespace moet::tok {

namespace {

enum class Behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

Behavior behavior_parse(const std::string& name) {
  if (name == "Removed") return Behavior::removed;
  if (name == "Isolated") return Behavior::isolated;
  if (name == "MergedWithPrevious") return Behavior::merged_with_previous;
  if (name == "MergedWithNext") return Behavior::merged_with_next;
  if (name == "Contiguous") return Behavior::contiguous;
  fail("unsupported split behavior '{}'", name);
}

struct Segment {
  size_t begin, end;
  bool is_match;
};

// Turns the alternating match / non-match segments into the kept ranges of one behaviour.
std::vector<Segment> apply_behavior(std::vector<Segment> segs, Behavior behavior) {
  std::vector<Segment> out;
  bool previous_match = false;
  switch (behavior) {
    case Behavior::isolated: return segs;
    case Behavior::removed:
      for (const auto& s : segs)
        if (!s.is_match) out.push_back(s);
      return out;
    case Behavior::merged_with_previous:
      for (const auto& s : segs) {
        if (s.is_match && !previous_match && !out.empty()) out.back().end = s.end;
        else out.push_back(s);
        previous_match = s.is_match;
      }
      return out;
    case Behavior::merged_with_next:
      for (auto it = segs.rbegin(); it != segs.rend(); ++it) {
        if (it->is_match && !previous_match && !out.empty()) out.back().begin = it->begin;
        else out.push_back(*it);
        previous_match = it->is_match;
      }
      return {out.rbegin(), out.rend()};
    case Behavior::contiguous:
      for (const auto& s : segs) {
        if (s.is_match == previous_match && !out.empty()) out.back().end = s.end;
        else out.push_back(s);
        previous_match = s.is_match;
      }
      return out;
  }
  return out;
}

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(const std::string& regex, Behavior behavior, bool invert)
      : regex_(regex), behavior_(behavior), invert_(invert) {}

  void apply(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    out.reserve(pieces.size() * 2);
    std::vector<Segment> segs;
    for (auto& piece : pieces) {
      const std::string& text = piece.text;
      segs.clear();
      size_t prev = 0;
      regex_.for_each_match(text, [&](size_t b, size_t e) {
        if (prev != b) segs.push_back({prev, b, invert_});
        segs.push_back({b, e, !invert_});
        prev = e;
      });
      if (prev != text.size()) segs.push_back({prev, text.size(), invert_});
      if (behavior_ == Behavior::isolated && segs.size() == 1) {
        out.push_back(std::move(piece));
        continue;
      }
      for (const auto& s : apply_behavior(segs, behavior_)) {
        if (s.end > s.begin) out.push_back({text.substr(s.begin, s.end - s.begin), piece.at_start && s.begin == 0});
      }
    }
    pieces = std::move(out);
  }

 private:
  Regex regex_;
  Behavior behavior_;
  bool invert_;
};

constexpr const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space),
        split_(use_regex ? make_split_pre_tokenizer(kGpt2Pattern, "Isolated", false) : nullptr) {}

  void apply(std::vector<Piece>& pieces) const override {
    if (add_prefix_space_)
      for (auto& p : pieces)
        if (p.text.empty() || p.text[0] != ' ') p.text.insert(0, " ");
    if (split_) split_->apply(pieces);
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<PreTokenizer> split_;
};

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  explicit MetaspacePreTokenizer(const nlohmann::json& spec)
      : replacement_(spec.value("replacement", "\xE2\x96\x81")),
        scheme_(spec.value("prepend_scheme", spec.value("add_prefix_space", true) ? "always" : "never")),
        split_(spec.value("split", true) ? make_split_pre_tokenizer(regex_escape(replacement_), "MergedWithNext", false)
                                         : nullptr),
        space_(nlohmann::json{{"String", " "}}, replacement_) {}

  void apply(std::vector<Piece>& pieces) const override {
    for (auto& p : pieces) {
      p.text = space_.apply(p.text);
      const bool prepend = scheme_ == "always" || (scheme_ == "first" && p.at_start);
      if (prepend && p.text.compare(0, replacement_.size(), replacement_) != 0) p.text.insert(0, replacement_);
    }
    if (split_) split_->apply(pieces);
  }

 private:
  std::string replacement_;
  std::string scheme_;
  std::unique_ptr<PreTokenizer> split_;
  PatternReplacer space_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {}
  void apply(std::vector<Piece>& pieces) const override {
    for (const auto& step : steps_) step->apply(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

}  // namespace

std::unique_ptr<PreTokenizer> make_split_pre_tokenizer(const std::string& regex, const std::string& behavior,
                                                       bool invert) {
  return std::make_unique<SplitPreTokenizer>(regex, behavior_parse(behavior), invert);
}

std::unique_ptr<PreTokenizer> pre_tokenizer_from_json(const nlohmann::json& spec) {
  if (spec.is_null()) return nullptr;
  const std::string type = spec.at("type").get<std::string>();
  if (type == "Split")
    return make_split_pre_tokenizer(pattern_from_json(spec.at("pattern")), spec.at("behavior").get<std::string>(),
                                    spec.value("invert", false));
  if (type == "ByteLevel")
    return std::make_unique<ByteLevelPreTokenizer>(spec.value("add_prefix_space", true), spec.value("use_regex", true));
  if (type == "Metaspace") return std::make_unique<MetaspacePreTokenizer>(spec);
  if (type == "Digits")
    return make_split_pre_tokenizer("\\p{N}", spec.value("individual_digits", false) ? "Isolated" : "Contiguous", false);
  if (type == "Whitespace") return make_split_pre_tokenizer("\\w+|[^\\w\\s]+", "Removed", true);
  if (type == "WhitespaceSplit") return make_split_pre_tokenizer("\\s+", "Removed", false);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (const auto& step : spec.at("pretokenizers"))
      if (auto p = pre_tokenizer_from_json(step)) steps.push_back(std::move(p));
    return std::make_unique<SequencePreTokenizer>(std::move(steps));
  }
  fail("unsupported pre_tokenizer type '{}'", type);
}

bool pre_tokenizer_is_byte_level(const nlohmann::json& spec) {
  if (spec.is_null()) return false;
  const std::string type = spec.value("type", "");
  if (type == "ByteLevel") return true;
  if (type == "Sequence")
    for (const auto& step : spec.at("pretokenizers"))
      if (pre_tokenizer_is_byte_level(step)) return true;
  return false;
}

}  // namespace moet::tok

