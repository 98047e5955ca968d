// moet::ChatTemplate: renders a model's Jinja chat template exactly as HF transformers'
// apply_chat_template does with jinja2 (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
// loopcontrols, generation blocks, tojson/raise_exception/strftime_now). A request is a JSON
// object: "messages", optional "tools" (default None), "add_generation_prompt" (default true) and
// any other keys as template variables (enable_thinking, reasoning_effort, ...). Defaults for
// bos_token/eos_token/unk_token/pad_token come from tokenizer_config.json. Parsing happens once;
// render is const and thread-safe. Errors are moet::Error with the template's line and column.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>

namespace moet {

namespace jinja {
struct Template;
}

class ChatTemplate {
 public:
  explicit ChatTemplate(const std::string& source);
  // chat_template.jinja when present, else tokenizer_config.json's chat_template (a string, or a
  // list of {name, template} from which `name` (default "default") is taken).
  static ChatTemplate from_dir(const std::string& dir, const std::string& name = "default");

  std::string render(const nlohmann::ordered_json& request) const;
  // Sets a variable every render sees unless the request overrides it.
  void set_default(const std::string& key, const nlohmann::ordered_json& value);
  const std::string& source() const;

 private:
  std::shared_ptr<const jinja::Template> template_;
  nlohmann::ordered_json defaults_ = nlohmann::ordered_json::object();
};

}  // namespace moet
