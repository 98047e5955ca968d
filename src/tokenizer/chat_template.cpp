// ChatTemplate: loading from a model folder and building the render variables (see chat_template.h).
#include "tokenizer/chat_template.h"

#include "core/error.h"
#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_eval.h"
#include "tokenizer/model_files.h"

namespace moet {

ChatTemplate::ChatTemplate(const std::string& source) : template_(jinja::parse_template(source)) {}

ChatTemplate ChatTemplate::from_dir(const std::string& dir, const std::string& name) {
  const auto config = tok::read_json(dir + "/tokenizer_config.json", true);
  std::string source;
  if (tok::file_exists(dir + "/chat_template.jinja")) {
    source = tok::read_file(dir + "/chat_template.jinja");
  } else if (const auto it = config.find("chat_template"); it != config.end() && it->is_string()) {
    source = it->get<std::string>();
  } else if (it != config.end() && it->is_array()) {
    for (const auto& entry : *it)
      if (entry.is_object() && entry.contains("name") && entry["name"] == name && entry.contains("template") &&
          entry["template"].is_string())
        source = entry["template"].get<std::string>();
    MOET_CHECK(!source.empty(), "{}/tokenizer_config.json has no chat template named '{}'", dir, name);
  } else {
    fail("{} has no chat_template.jinja and no chat_template in tokenizer_config.json", dir);
  }
  ChatTemplate t = [&] {
    try {
      return ChatTemplate(source);
    } catch (const Error& e) {
      fail("chat template of {}: {}", dir, e.what());
    }
  }();
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"})
    if (const auto token = tok::config_token(config, key)) t.set_default(key, *token);
  return t;
}

void ChatTemplate::set_default(const std::string& key, const nlohmann::ordered_json& value) { defaults_[key] = value; }

const std::string& ChatTemplate::source() const { return template_->source; }

std::string ChatTemplate::render(const nlohmann::ordered_json& request) const {
  MOET_CHECK(request.is_object(), "chat request must be a JSON object");
  nlohmann::ordered_json vars = defaults_;
  vars["messages"] = nlohmann::ordered_json::array();
  vars["tools"] = nullptr;
  vars["documents"] = nullptr;
  vars["add_generation_prompt"] = true;
  for (const auto& [k, v] : request.items()) vars[k] = v;
  jinja::Dict variables;
  for (const auto& [k, v] : vars.items()) variables.emplace_back(k, jinja::Value::from_json(v));
  return jinja::render_template(*template_, std::move(variables));
}

}  // namespace moet
