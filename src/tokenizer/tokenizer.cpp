// tokenizer.json loading, the encode pipeline and decode (see tokenizer.h).
#include "tokenizer/tokenizer.h"

#include "core/error.h"
#include "tokenizer/model_files.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace moet {

using tok::AddedToken;

void Tokenizer::Impl::set_token(int32_t id, const std::string& spelling) {
  if (id < 0) fail("negative token id {} for '{}'", id, spelling);
  if (size_t(id) >= id_to_token.size()) {
    id_to_token.resize(size_t(id) + 1);
    special.resize(size_t(id) + 1, 0);
  }
  id_to_token[size_t(id)] = spelling;
  token_to_id[spelling] = id;
}

void Tokenizer::Impl::set_added_tokens(std::vector<AddedToken> tokens) {
  std::vector<AddedToken> raw, normalized;
  std::vector<std::string> raw_patterns, normalized_patterns;
  for (auto& t : tokens) {
    set_token(t.id, t.content);
    special[size_t(t.id)] = t.special;
    if (t.normalized) {
      std::string pattern = t.content;
      if (normalizer) normalizer->apply(pattern);
      normalized_patterns.push_back(pattern);
      normalized.push_back(std::move(t));
    } else {
      raw_patterns.push_back(t.content);
      raw.push_back(std::move(t));
    }
  }
  raw_matcher = std::make_unique<tok::AddedTokenMatcher>(std::move(raw), std::move(raw_patterns));
  normalized_matcher = std::make_unique<tok::AddedTokenMatcher>(std::move(normalized), std::move(normalized_patterns));
}

void Tokenizer::Impl::read_config(const nlohmann::ordered_json& config) {
  info.bos_token = tok::config_token(config, "bos_token");
  info.eos_token = tok::config_token(config, "eos_token");
  info.pad_token = tok::config_token(config, "pad_token");
  info.unk_token = tok::config_token(config, "unk_token");
  const auto add_bos = config.find("add_bos_token");
  info.add_bos_token = add_bos != config.end() && add_bos->is_boolean() && add_bos->get<bool>();
  const auto lookup = [&](const std::optional<std::string>& token) -> std::optional<int32_t> {
    if (!token) return std::nullopt;
    const auto it = token_to_id.find(*token);
    return it == token_to_id.end() ? std::nullopt : std::optional<int32_t>(it->second);
  };
  info.bos_id = lookup(info.bos_token);
  if (const auto eos = lookup(info.eos_token)) info.eos_ids = {*eos};
}

namespace {

AddedToken added_token_from_json(const nlohmann::json& j, int32_t id) {
  AddedToken t;
  t.content = j.at("content").get<std::string>();
  t.id = id;
  t.special = j.value("special", false);
  t.lstrip = j.value("lstrip", false);
  t.rstrip = j.value("rstrip", false);
  t.normalized = j.value("normalized", !t.special);
  t.single_word = j.value("single_word", false);
  return t;
}

std::pair<std::string, std::string> merge_from_json(const nlohmann::json& m) {
  if (m.is_array()) return {m.at(0).get<std::string>(), m.at(1).get<std::string>()};
  const std::string s = m.get<std::string>();
  const size_t space = s.find(' ');
  if (space == std::string::npos) fail("tokenizer.json merge '{}' has no space", s);
  return {s.substr(0, space), s.substr(space + 1)};
}

// Vocabulary spelling -> model bytes (raw bytes for byte-level vocabularies).
std::string model_key(const std::string& spelling, bool byte_level) {
  if (!byte_level) return spelling;
  auto raw = tok::unicode_to_bytes(spelling);
  return raw ? *raw : spelling;
}

std::shared_ptr<Tokenizer::Impl> build_from_json(const nlohmann::json& j, const nlohmann::ordered_json& config) {
  auto impl = std::make_shared<Tokenizer::Impl>();
  const auto& model = j.at("model");
  const std::string type = model.value("type", "BPE");
  if (type != "BPE") fail("unsupported tokenizer model type '{}' (only BPE)", type);
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(affix) && model[affix].is_string() && !model[affix].get<std::string>().empty())
      fail("unsupported BPE option {}", affix);

  impl->normalizer = tok::normalizer_from_json(j.value("normalizer", nlohmann::json()));
  impl->pre_tokenizer = tok::pre_tokenizer_from_json(j.value("pre_tokenizer", nlohmann::json()));
  impl->decoder = tok::decoder_from_json(j.value("decoder", nlohmann::json()));
  impl->post_processor.emplace(j.value("post_processor", nlohmann::json()));

  tok::BpeOptions options;
  options.byte_level = tok::pre_tokenizer_is_byte_level(j.value("pre_tokenizer", nlohmann::json()));
  options.byte_fallback = model.value("byte_fallback", false);
  options.ignore_merges = model.value("ignore_merges", false);
  options.fuse_unk = model.value("fuse_unk", false);
  tok::Vocab vocab;
  vocab.reserve(model.at("vocab").size());
  for (const auto& [spelling, id] : model.at("vocab").items()) {
    impl->set_token(id.get<int32_t>(), spelling);
    vocab.emplace(model_key(spelling, options.byte_level), id.get<int32_t>());
  }
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    const auto it = impl->token_to_id.find(model["unk_token"].get<std::string>());
    if (it != impl->token_to_id.end()) options.unk_id = it->second;
  }
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(model.at("merges").size());
  for (const auto& m : model.at("merges")) {
    auto [a, b] = merge_from_json(m);
    merges.emplace_back(model_key(a, options.byte_level), model_key(b, options.byte_level));
  }
  impl->model.emplace(std::move(vocab), merges, options);

  std::vector<AddedToken> added;
  for (const auto& t : j.value("added_tokens", nlohmann::json::array()))
    added.push_back(added_token_from_json(t, t.at("id").get<int32_t>()));
  impl->set_added_tokens(std::move(added));
  impl->read_config(config);
  return impl;
}

std::shared_ptr<Tokenizer::Impl> load_tokenizer_json(const nlohmann::json& j, const nlohmann::ordered_json& config) {
  try {
    return build_from_json(j, config);
  } catch (const nlohmann::json::exception& e) {
    fail("malformed tokenizer.json: {}", e.what());
  }
}

}  // namespace

Tokenizer Tokenizer::from_json(const nlohmann::json& j, const nlohmann::ordered_json& config) {
  return Tokenizer(load_tokenizer_json(j, config));
}

Tokenizer Tokenizer::from_dir(const std::string& dir) {
  const auto config = tok::read_json(dir + "/tokenizer_config.json", true);
  std::shared_ptr<Impl> impl;
  if (tok::file_exists(dir + "/tokenizer.json") || tok::file_exists(dir + "/tokenizer.json.gz")) {
    const std::string path = dir + (tok::file_exists(dir + "/tokenizer.json") ? "/tokenizer.json" : "/tokenizer.json.gz");
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(tok::read_file(path));
    } catch (const nlohmann::json::exception& e) {
      fail("{} is not valid JSON: {}", path, e.what());
    }
    impl = load_tokenizer_json(j, config);
  } else if (tok::file_exists(dir + "/tiktoken.model")) {
    impl = tiktoken_load(dir + "/tiktoken.model", config);
    impl->read_config(config);
  } else {
    fail("{} holds no tokenizer.json, tokenizer.json.gz or tiktoken.model", dir);
  }
  const auto generation = tok::read_json(dir + "/generation_config.json", true);
  if (const auto eos = generation.find("eos_token_id"); eos != generation.end() && !eos->is_null()) {
    const auto ids = eos->is_array() ? *eos : nlohmann::ordered_json::array({*eos});
    impl->info.eos_ids.clear();
    for (const auto& id : ids) {
      MOET_CHECK(id.is_number_integer(), "{}/generation_config.json: eos_token_id must hold integers", dir);
      impl->info.eos_ids.push_back(id.get<int32_t>());
    }
  }
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view input, bool add_special_tokens) const {
  const Impl& im = *impl_;
  std::string repaired;
  if (!tok::utf8_is_valid(input)) {
    repaired = tok::utf8_lossy(input);
    input = repaired;
  }
  std::vector<int32_t> ids;
  ids.reserve(input.size() / 3 + 4);
  std::vector<tok::Piece> pieces;
  const auto run_model = [&](std::string_view text, bool at_start) {
    pieces.clear();
    pieces.push_back({std::string(text), at_start});
    if (im.pre_tokenizer) im.pre_tokenizer->apply(pieces);
    for (const auto& p : pieces) im.model->tokenize(p.text, ids);
  };
  im.raw_matcher->split(input, [&](std::string_view segment, int32_t id) {
    if (id >= 0) {
      ids.push_back(id);
      return;
    }
    const bool at_start = segment.data() == input.data();
    std::string normalized(segment);
    if (im.normalizer) im.normalizer->apply(normalized);
    im.normalized_matcher->split(normalized, [&](std::string_view part, int32_t part_id) {
      if (part_id >= 0) ids.push_back(part_id);
      else run_model(part, at_start && part.data() == normalized.data());
    });
  });
  im.post_processor->apply(ids, add_special_tokens);
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const Impl& im = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || size_t(id) >= im.id_to_token.size() || im.id_to_token[size_t(id)].empty()) continue;
    if (skip_special_tokens && im.special[size_t(id)]) continue;
    tokens.push_back(im.id_to_token[size_t(id)]);
  }
  std::string out;
  if (im.decoder) {
    im.decoder->apply(tokens);
    for (const auto& t : tokens) out += t;
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
  }
  return out;
}

std::string Tokenizer::token_bytes(int32_t id) const {
  const auto token = id_to_token(id);
  if (!token) return {};
  if (impl_->decoder && impl_->decoder->uses_byte_fallback()) {
    if (const int byte = tok::byte_fallback_value(*token); byte >= 0) return std::string(1, char(byte));
  }
  // Decoded after a plain token, so that a decoder's start-of-text rules (a stripped leading
  // space) do not apply; the anchor's text is then cut off.
  static constexpr std::string_view kReplacement = "\xef\xbf\xbd";
  const auto anchor = token_to_id("a");
  std::string text;
  if (anchor && !is_special(id)) {
    const int32_t pair[2] = {*anchor, id};
    const std::string head = decode(std::span<const int32_t>(pair, 1));
    text = decode(std::span<const int32_t>(pair, 2));
    text = text.starts_with(head) ? text.substr(head.size()) : decode(std::span<const int32_t>(&id, 1));
  } else {
    text = decode(std::span<const int32_t>(&id, 1));
  }
  if (text.find(kReplacement) == std::string::npos) return text;
  if (auto raw = tok::unicode_to_bytes(*token)) return *raw;  // a byte-level spelling
  return text;
}

size_t Tokenizer::vocab_size() const { return impl_->id_to_token.size(); }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  const auto it = impl_->token_to_id.find(token);
  return it == impl_->token_to_id.end() ? std::nullopt : std::optional<int32_t>(it->second);
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || size_t(id) >= impl_->id_to_token.size() || impl_->id_to_token[size_t(id)].empty()) return std::nullopt;
  return impl_->id_to_token[size_t(id)];
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && size_t(id) < impl_->special.size() && impl_->special[size_t(id)];
}

bool Tokenizer::is_partial_byte_token(int32_t id) const {
  const auto token = id_to_token(id);
  return token && impl_->decoder && impl_->decoder->uses_byte_fallback() && tok::byte_fallback_value(*token) >= 0;
}

const TokenizerInfo& Tokenizer::info() const { return impl_->info; }

}  // namespace moet
