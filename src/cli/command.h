// The `zaya` subcommands. Each command file registers itself with ZAYA_COMMAND; main() dispatches
// on the first argument. Commands are thin: parse flags, call into libzaya, print.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace zaya::cli {

struct Command {
  std::string name;
  std::string summary;
  // argv[0] is the command name; returns the process exit code.
  std::function<int(int argc, char** argv)> run;
};

bool register_command(Command c);
const std::vector<Command>& commands();

// app.parse(argc, argv), except that --help (or --help-all) prints the app's options, or the
// selected subcommand's, to stdout and returns false: the command then returns 0. Other parse
// errors propagate as CLI::ParseError (main prints them and exits 2).
bool parse_or_help(CLI::App& app, int argc, char** argv);

}  // namespace zaya::cli

#define ZAYA_CLI_CAT2(a, b) a##b
#define ZAYA_CLI_CAT(a, b) ZAYA_CLI_CAT2(a, b)
#define ZAYA_COMMAND(name, summary, fn)                     \
  static const bool ZAYA_CLI_CAT(zaya_cmd_reg_, __LINE__) = \
      ::zaya::cli::register_command({name, summary, fn})
