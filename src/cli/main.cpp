// Entry point of the `zaya` program: dispatches to the registered subcommands and turns errors into
// a one-line message and a non-zero exit status (2 for command-line and configuration errors).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstring>

#include "cli/command.h"
#include "core/error.h"
#include "dist/ft_protocol.h"

namespace zaya::cli {

static std::vector<Command>& registry() {
  static std::vector<Command> r;
  return r;
}
bool register_command(Command c) {
  registry().push_back(std::move(c));
  return true;
}
const std::vector<Command>& commands() {
  return registry();
}

bool parse_or_help(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    app.exit(e);
    return false;
  } catch (const CLI::CallForAllHelp& e) {
    app.exit(e);
    return false;
  }
  return true;
}

}  // namespace zaya::cli

static void usage() {
  auto cmds = zaya::cli::commands();
  std::sort(cmds.begin(), cmds.end(), [](auto& a, auto& b) { return a.name < b.name; });
  std::printf("zaya: pretrain ZAYA1-style mixture-of-experts models and characterize clusters\n\n");
  std::printf(
      "usage: zaya COMMAND [options]   (zaya COMMAND --help for its options)\n\ncommands:\n");
  for (auto& c : cmds) std::printf("  %-10s %s\n", c.name.c_str(), c.summary.c_str());
}

int main(int argc, char** argv) {
  const char* name = argc > 1 ? argv[1] : "train";  // the main job is the default
  if (argc > 1 &&
      (!std::strcmp(name, "--help") || !std::strcmp(name, "-h") || !std::strcmp(name, "help"))) {
    usage();
    return 0;
  }
  for (auto& c : zaya::cli::commands()) {
    if (c.name != name) continue;
    try {
      if (argc > 1) return c.run(argc - 1, argv + 1);
      char* args[] = {const_cast<char*>(name), nullptr};
      return c.run(1, args);
    } catch (const CLI::ParseError& e) {
      std::fprintf(stderr, "zaya %s: %s\n", name, e.what());
      return 2;
    } catch (const zaya::ConfigError& e) {
      std::fprintf(stderr, "zaya %s: error: %s\n", name, e.what());
      return zaya::ft::kExitBadConfig;
    } catch (const zaya::Error& e) {
      std::fprintf(stderr, "zaya %s: error: %s\n", name, e.what());
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "zaya %s: error: %s\n", name, e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "zaya: unknown command '%s'\n\n", name);
  usage();
  return 2;
}
