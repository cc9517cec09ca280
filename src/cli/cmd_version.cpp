// `zaya version`: the build's version and which optional backends were compiled in.
#include <fmt/format.h>

#include <CLI/CLI.hpp>

#include "cli/command.h"
#include "engine/build_info.h"

static int run_version(int argc, char** argv) {
  CLI::App app{"Print the version and the compiled-in backends", "zaya version"};
  if (!zaya::cli::parse_or_help(app, argc, argv)) return 0;
  const zaya::BuildInfo b = zaya::build_info();
  fmt::print("zaya {} (cuda: {}, mpi: {}{})\n", b.version, b.cuda ? "yes" : "no",
             b.mpi ? "yes" : "no", b.decode_trace ? ", decode trace" : "");
  return 0;
}
ZAYA_COMMAND("version", "print the version and the compiled-in backends", run_version);
