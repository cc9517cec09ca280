#include "ft/launch_cmd.h"

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "train/run_config.h"

namespace zaya::ft {
namespace {

std::string file_name(const std::string& path) {
  return std::filesystem::path(path).filename().string();
}

LauncherKind launcher_of(const std::string& arg0) {
  const std::string n = file_name(arg0);
  if (n == "mpirun" || n == "mpiexec" || n == "orterun" || n == "prterun")
    return LauncherKind::Mpirun;
  if (n == "srun") return LauncherKind::Srun;
  return LauncherKind::Other;
}

// A launcher option's position and how its value is spelled: "-np 4" (value at i + 1), "--np=4"
// or "-n4" (value inside argv[i] from `offset`).
struct OptionAt {
  size_t i = 0;
  size_t offset = 0;  // 0: the value is the next argument
};

// The last occurrence among argv[1, end) of any of `names` (each "-x" or "--long"); `glued`
// allows "-n4" for single-letter options.
std::optional<OptionAt> find_option(const Argv& argv, size_t end,
                                    const std::vector<std::string>& names, bool glued) {
  std::optional<OptionAt> found;
  for (size_t i = 1; i < end; i++) {
    const std::string& a = argv[i];
    for (const auto& n : names) {
      if (a == n && i + 1 < end) {
        found = OptionAt{i, 0};
      } else if (a.size() > n.size() + 1 && a.compare(0, n.size() + 1, n + "=") == 0) {
        found = OptionAt{i, n.size() + 1};
      } else if (glued && n.size() == 2 && a.size() > 2 && a.compare(0, 2, n) == 0 && a[2] != '-' &&
                 a[2] != '=') {
        found = OptionAt{i, 2};
      }
    }
  }
  return found;
}

std::string value_at(const Argv& argv, const OptionAt& o) {
  return o.offset ? argv[o.i].substr(o.offset) : argv[o.i + 1];
}

void set_value(LaunchCommand& cmd, const OptionAt& o, const std::string& v) {
  if (o.offset)
    cmd.argv[o.i] = cmd.argv[o.i].substr(0, o.offset) + v;
  else
    cmd.argv[o.i + 1] = v;
}

void insert_after_launcher(LaunchCommand& cmd, const Argv& args) {
  cmd.argv.insert(cmd.argv.begin() + 1, args.begin(), args.end());
  cmd.zaya += args.size();
}

int parse_count(const std::string& v, const std::string& what) {
  size_t used = 0;
  int n = 0;
  try {
    n = std::stoi(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  ZAYA_CHECK(used == v.size() && n > 0, "launch command: {} '{}': expected a positive integer",
             what, v);
  return n;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t b = 0;
  while (b <= s.size()) {
    size_t e = s.find(sep, b);
    if (e == std::string::npos) e = s.size();
    if (e > b) out.push_back(s.substr(b, e - b));
    b = e + 1;
  }
  return out;
}

std::string join(const std::vector<std::string>& v, char sep) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : std::string(1, sep)) + x;
  return s;
}

const std::vector<std::string> kMpiNp = {"-np", "--np", "-n", "-c"};
const std::vector<std::string> kSrunNtasks = {"-n", "--ntasks"};

}  // namespace

LaunchCommand LaunchCommand::parse(const Argv& argv, const std::string& zaya_exe) {
  ZAYA_CHECK(!argv.empty(), "supervise: no launch command after '--'");
  LaunchCommand c;
  c.argv = argv;
  size_t i = 0;
  for (; i < argv.size(); i++)
    if (file_name(argv[i]) == "zaya" || (!zaya_exe.empty() && argv[i] == zaya_exe)) break;
  ZAYA_CHECK(i < argv.size(),
             "supervise: the launch command '{}' runs no zaya executable (expected e.g. "
             "'mpirun -np 2 zaya train ...')",
             show_argv(argv));
  ZAYA_CHECK(i + 1 < argv.size() && argv[i + 1].rfind("-", 0) != 0,
             "supervise: the launch command '{}' gives zaya no subcommand (expected 'zaya train')",
             show_argv(argv));
  c.zaya = i;
  c.subcommand = argv[i + 1];
  c.launcher = i == 0 ? LauncherKind::None : launcher_of(argv[0]);
  return c;
}

std::optional<std::string> LaunchCommand::zaya_option(const std::string& name) const {
  std::optional<std::string> v;
  for (size_t i = zaya + 2; i < argv.size(); i++) {
    if (argv[i] == name && i + 1 < argv.size())
      v = argv[++i];
    else if (argv[i].rfind(name + "=", 0) == 0)
      v = argv[i].substr(name.size() + 1);
  }
  return v;
}

std::vector<std::string> LaunchCommand::config_overrides() const {
  std::vector<std::string> o;
  for (size_t i = zaya + 2; i < argv.size(); i++)
    if (is_config_override(argv[i])) o.push_back(argv[i]);
  return o;
}

std::optional<int> LaunchCommand::world() const {
  std::optional<OptionAt> o;
  if (launcher == LauncherKind::None) return 1;
  if (launcher == LauncherKind::Mpirun) o = find_option(argv, zaya, kMpiNp, false);
  if (launcher == LauncherKind::Srun) o = find_option(argv, zaya, kSrunNtasks, true);
  if (!o) return std::nullopt;
  return parse_count(value_at(argv, *o), "the number of ranks");
}

LaunchCommand with_resume_auto(LaunchCommand cmd) {
  if (cmd.subcommand != "train" || cmd.zaya_option("--resume")) return cmd;
  cmd.argv.push_back("--resume");
  cmd.argv.push_back("auto");
  return cmd;
}

LaunchCommand with_world(LaunchCommand cmd, int n) {
  ZAYA_CHECK(n > 0, "launch command: {} ranks", n);
  if (cmd.world() == n) return cmd;
  const std::string v = std::to_string(n);
  switch (cmd.launcher) {
    case LauncherKind::Mpirun:
      if (auto o = find_option(cmd.argv, cmd.zaya, kMpiNp, false))
        set_value(cmd, *o, v);
      else
        insert_after_launcher(cmd, {"-np", v});
      return cmd;
    case LauncherKind::Srun:
      if (auto o = find_option(cmd.argv, cmd.zaya, kSrunNtasks, true))
        set_value(cmd, *o, v);
      else
        insert_after_launcher(cmd, {"--ntasks=" + v});
      return cmd;
    default:
      fail(
          "launch command '{}': cannot change its number of ranks to {} (only mpirun's -np and "
          "srun's --ntasks are rewritten)",
          show_argv(cmd.argv), n);
  }
}

LaunchCommand with_excluded_hosts(LaunchCommand cmd, const std::vector<std::string>& hosts,
                                  bool* done) {
  *done = false;
  if (hosts.empty()) {
    *done = true;
    return cmd;
  }
  if (cmd.launcher == LauncherKind::Srun) {
    std::vector<std::string> ex;
    std::optional<OptionAt> o = find_option(cmd.argv, cmd.zaya, {"-x", "--exclude"}, true);
    if (o) ex = split(value_at(cmd.argv, *o), ',');
    int added = 0;
    for (const auto& h : hosts)
      if (std::find(ex.begin(), ex.end(), h) == ex.end()) {
        ex.push_back(h);
        added++;
      }
    if (o)
      set_value(cmd, *o, join(ex, ','));
    else
      insert_after_launcher(cmd, {"--exclude=" + join(ex, ',')});
    if (auto n = find_option(cmd.argv, cmd.zaya, {"-N", "--nodes"}, true)) {
      const int nodes = parse_count(value_at(cmd.argv, *n), "srun's node count");
      set_value(cmd, *n, std::to_string(std::max(1, nodes - added)));
    }
    *done = true;
  } else if (cmd.launcher == LauncherKind::Mpirun) {
    if (auto o = find_option(cmd.argv, cmd.zaya, {"-H", "--host", "-host"}, false)) {
      std::vector<std::string> keep;
      for (const auto& e : split(value_at(cmd.argv, *o), ',')) {
        const std::string name = e.substr(0, e.find(':'));
        if (std::find(hosts.begin(), hosts.end(), name) == hosts.end()) keep.push_back(e);
      }
      set_value(cmd, *o, join(keep, ','));
      *done = true;
    }
  }
  return cmd;
}

LaunchCommand with_forwarded_env(LaunchCommand cmd, const std::vector<std::string>& names) {
  if (cmd.launcher != LauncherKind::Mpirun) return cmd;
  Argv args;
  for (const auto& n : names) {
    bool present = false;
    for (size_t i = 1; i + 1 < cmd.zaya; i++)
      if (cmd.argv[i] == "-x" && cmd.argv[i + 1] == n) present = true;
    if (!present) args.insert(args.end(), {"-x", n});
  }
  insert_after_launcher(cmd, args);
  return cmd;
}

LaunchCommand health_command(const LaunchCommand& cmd, const std::string& dir,
                             const std::vector<std::string>& extra) {
  LaunchCommand h = cmd;
  h.argv.assign(cmd.argv.begin(), cmd.argv.begin() + cmd.zaya + 1);
  h.argv.insert(h.argv.end(), {"health", "--dir", dir});
  h.argv.insert(h.argv.end(), extra.begin(), extra.end());
  h.subcommand = "health";
  return h;
}

std::string show_argv(const Argv& argv) {
  std::string s;
  for (const auto& a : argv) {
    if (!s.empty()) s += ' ';
    if (a.empty() || a.find_first_of(" \t\"'\\$") != std::string::npos) {
      s += '\'';
      for (char c : a) s += c == '\'' ? std::string("'\\''") : std::string(1, c);
      s += '\'';
    } else {
      s += a;
    }
  }
  return s;
}

}  // namespace zaya::ft
