// moet: entry point. Parses the command line with CLI11, applies global flags (log level) and
// runs the chosen subcommand; any moet::Error becomes "moet: error: <message>" and exit code 1.
#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"

#include <cstdio>
#include <exception>
#include <string>

int main(int argc, char** argv) {
  CLI::App app{"moet: a Mixture-of-Experts inference engine for GPUs that cannot hold the model"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("moet 0.1.0"));
  std::string log_level = "info";
  app.add_option("--log-level", log_level,
                 "log verbosity: debug|info|warn|error|off (env MOET_LOG_LEVEL)")
      ->envname("MOET_LOG_LEVEL");

  moet::cli::Actions actions;
  moet::cli::register_generate(app, actions);
  moet::cli::register_inspect(app, actions);
  moet::cli::register_bench(app, actions);
  moet::cli::register_score(app, actions);
  moet::cli::register_tokenize(app, actions);
  moet::cli::register_chat_template(app, actions);
  moet::cli::register_pack(app, actions);
  moet::cli::register_dequant(app, actions);
  moet::cli::register_quantize_report(app, actions);
  moet::cli::register_serve(app, actions);
  moet::cli::register_imatrix(app, actions);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    moet::log_set_level(moet::log_level_parse(log_level));
    for (const CLI::App* sub : app.get_subcommands()) actions.at(sub)();
  } catch (const moet::Error& e) {
    std::fprintf(stderr, "moet: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moet: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
