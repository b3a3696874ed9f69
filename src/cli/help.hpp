// stepbench --help: the main command's flags by group (what to run, the model, towers and sync,
// data, timing, output, GPU), one short line each with its values and default, then the
// subcommands; at most 100 columns. tests/cli/help.txt is its snapshot (ctest cli.help).
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <utility>
#include <vector>

namespace stepbench::cli {

// The groups in the order --help lists them; an option in none of them is listed under "Other".
const std::vector<std::string>& help_groups();

// Puts every flag of the main command in its group with a short help line and the name of its
// value (a table in help.cpp: a flag added elsewhere and missing there is listed under "Other").
void describe_flags(CLI::App& app);

// describe_flags, then --help prints grouped_help with the main command's intro and subcommands.
void use_grouped_help(CLI::App& app);

// The grouped help for `app`: `intro`, the usage, every group's options, `subcommands` (name, what
// it does), `outro`.
std::string grouped_help(const CLI::App& app, const std::string& intro,
                         const std::vector<std::pair<std::string, std::string>>& subcommands, const std::string& outro);

}  // namespace stepbench::cli
