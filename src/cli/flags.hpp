// What every subcommand's flags share: enum flags from the name tables, the model flags of the main
// command and `check`, and one way to parse and report errors.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "backend/registry.hpp"
#include "graph/graph.hpp"
#include "models/models.hpp"
#include "tensor/names.hpp"
#include "tensor/tensor.hpp"

namespace stepbench::cli {

// A flag whose values are an enum's names (or `allowed`, a subset), stored straight into `v`.
template <NamedEnum E>
CLI::Option* add_enum(CLI::App& app, const std::string& flag, E& v, const std::string& help,
                      const std::vector<std::string>& allowed = names_of<E>()) {
  return app
      .add_option_function<std::string>(
          flag, [&v](const std::string& s) { v = *try_parse_enum<E>(s); }, help)
      ->default_str(std::string(to_string(v)))
      ->check(CLI::IsMember(allowed));
}

// on/off flags (--aux-logits on)
CLI::Option* add_switch(CLI::App& app, const std::string& flag, bool& v, const std::string& help);

// The model and where it runs: flags of the main command and of `check`.
struct ModelFlags {
  BackendKind backend = BackendKind::automatic;
  ModelKind model = ModelKind::inception_v3;
  Layout layout = Layout::nchw;
  Precision precision = Precision::fp32;
  bool aux_logits = true;
  std::int64_t image_size = 299;
  Recompute recompute = Recompute::automatic;
  Fuse fuse = Fuse::off;
};
void add_model_flags(CLI::App& app, ModelFlags& m);

// Checks a --config TOML file strictly against app's flags; throws UsageError naming the file, the
// line and the key (an unknown key with the nearest valid one, a key given twice, a malformed line
// or value).
std::map<std::string, int> check_config_file(const CLI::App& app, const std::string& path);  // key -> line

// Parses argv[first..] (a --config file checked with check_config_file first). Returns the exit code to return at once
// (0 after --help, 2 after a usage error, printed with `name` and how to get help), or nullopt to go on.
std::optional<int> parse_args(CLI::App& app, int argc, const char* const* argv, int first, const std::string& name);

}  // namespace stepbench::cli
