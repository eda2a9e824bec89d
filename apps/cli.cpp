#include "cli.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <system_error>
#include <utility>
#include <vector>

#include "tensor/error.h"

namespace fsdp_cli {

namespace {

// "a, b or c": the subcommands of `app` in the order they were added.
std::string command_list(const CLI::App& app) {
  const std::vector<const CLI::App*> commands = app.get_subcommands([](const CLI::App*) { return true; });
  std::string list;
  for (size_t i = 0; i < commands.size(); ++i)
    list += (i == 0 ? "" : i + 1 == commands.size() ? " or " : ", ") + commands[i]->get_name();
  return list;
}

// What CLI11 left over (allow_extras), named the way the hand-written parsers named it. After a
// "--" every argument is a positional, even one that starts with '-'.
void reject_leftovers(const CLI::App& app) {
  const bool has_commands = !app.get_subcommands([](const CLI::App*) { return true; }).empty();
  const bool command_missing = has_commands && app.get_subcommands().empty();
  bool positional_only = false;
  for (const std::string& arg : app.remaining(true)) {
    if (arg == "--" && !positional_only) {
      positional_only = true;
      continue;
    }
    if (!positional_only && arg.size() > 1 && arg[0] == '-')
      throw fsdp::Error("unknown option '" + arg.substr(0, arg.find('=')) + "' (try --help)");
    if (command_missing)
      throw fsdp::Error("unknown command '" + arg + "': expected " + command_list(app) + " (try --help)");
    throw fsdp::Error("unexpected argument '" + arg + "' (try --help)");
  }
  if (command_missing) throw fsdp::Error("no command given: expected " + command_list(app) + " (try --help)");
}

}  // namespace

void configure(CLI::App& app) {
  app.allow_extras();
  // A flag given a value (--plan=2) is an error, as the hand-written parsers had it.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)->disable_flag_override();
}

bool parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    return true;
  } catch (const CLI::ParseError& e) {
    // CLI11's exit() would print "Run with --help for more information." on a line of its own;
    // the advice goes on the message's line instead, which stays one line whatever CLI11 wrote.
    std::string message = e.what();
    std::replace(message.begin(), message.end(), '\n', ' ');
    throw fsdp::Error(message + " (try --help)");
  }
  reject_leftovers(app);
  return false;
}

int launcher_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    const char* value = std::getenv(name);
    int rank = 0;
    if (value && *value && std::from_chars(value, value + std::strlen(value), rank).ec == std::errc()) return rank;
  }
  return 0;
}

CLI::Validator parsed_by(std::function<std::string(const std::string&)> parse) {
  return CLI::Validator(
      [parse = std::move(parse)](std::string& text) -> std::string {
        try {
          text = parse(text);
          return {};
        } catch (const fsdp::Error& e) {
          return e.what();
        }
      },
      "");
}

CLI::Validator integer_in(long long lo, long long hi, const std::string& what) {
  const std::string expected =
      what.empty() ? "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]" : what;
  return CLI::Validator(
      [lo, hi, expected](std::string& text) -> std::string {
        long long value = 0;
        const char* end = text.data() + text.size();
        const auto [stop, error] = std::from_chars(text.data(), end, value);
        if (error == std::errc() && stop == end && value >= lo && value <= hi) return {};
        return "expected " + expected + ", got '" + text + "'";
      },
      "");
}

}  // namespace fsdp_cli
