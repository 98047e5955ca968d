// `moet chat-template`: renders a model's chat template for a request file and prints the prompt
// exactly (no added newline), for debugging prompts. --template FILE renders that template file
// instead of the model's; --model may then be omitted (no special-token defaults).
#include "cli/commands.h"
#include "core/error.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/model_files.h"

#include <iostream>
#include <memory>

namespace moet::cli {

namespace {

struct ChatTemplateArgs {
  std::string model;
  std::string request;
  std::string template_file;
};

void run_chat_template(const ChatTemplateArgs& args) {
  MOET_CHECK(!args.model.empty() || !args.template_file.empty(), "chat-template needs --model or --template");
  ChatTemplate tmpl = args.template_file.empty() ? ChatTemplate::from_dir(args.model)
                                                 : ChatTemplate(tok::read_file(args.template_file));
  const auto request = tok::read_json(args.request);
  std::cout << tmpl.render(request) << std::flush;
}

}  // namespace

void register_chat_template(CLI::App& app, Actions& actions) {
  auto args = std::make_shared<ChatTemplateArgs>();
  CLI::App* sub = app.add_subcommand("chat-template", "render a model's chat template for a request and print the prompt");
  sub->add_option("--model", args->model, "model folder (chat_template.jinja or tokenizer_config.json)");
  sub->add_option("--request", args->request,
                  "JSON file: {messages, tools?, add_generation_prompt? (default true), template kwargs...}")
      ->required();
  sub->add_option("--template", args->template_file, "render this Jinja file instead of the model's template");
  actions[sub] = [args] { run_chat_template(*args); };
}

}  // namespace moet::cli
