// The moet subcommands. Each lives in its own cmd_<name>.cpp and registers itself on the app
// with an action that main runs after the whole command line parsed (so global flags such as
// --log-level apply first). An action throws moet::Error for bad input; main turns that into a
// one-line message and exit code 1.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <map>

namespace moet::cli {

using Actions = std::map<const CLI::App*, std::function<void()>>;

void register_generate(CLI::App& app, Actions& actions);
void register_inspect(CLI::App& app, Actions& actions);
void register_bench(CLI::App& app, Actions& actions);
void register_score(CLI::App& app, Actions& actions);
void register_tokenize(CLI::App& app, Actions& actions);
void register_chat_template(CLI::App& app, Actions& actions);
void register_pack(CLI::App& app, Actions& actions);
void register_dequant(CLI::App& app, Actions& actions);
void register_quantize_report(CLI::App& app, Actions& actions);
void register_serve(CLI::App& app, Actions& actions);
void register_imatrix(CLI::App& app, Actions& actions);

}  // namespace moet::cli
