#include "cli/flags.hpp"

#include <fmt/format.h>

#include <cctype>
#include <cmath>
#include <cstdlib>

#include <iostream>

#include "tensor/error.hpp"

namespace stepbench::cli {

CLI::Option* add_switch(CLI::App& app, const std::string& flag, bool& v, const std::string& help) {
  return app
      .add_option_function<std::string>(
          flag, [&v](const std::string& s) { v = s == "on"; }, help)
      ->default_str(v ? "on" : "off")
      ->check(CLI::IsMember({"on", "off"}));
}

void add_model_flags(CLI::App& app, ModelFlags& m) {
  add_enum(app, "--backend", m.backend, "auto (cuda when a GPU is visible, else cpu), cpu or cuda");
  add_enum(app, "--model", m.model, join_or(user_models()), user_models());
  add_enum(app, "--format", m.layout, "activation layout: nchw or nhwc", names_of<Layout>());
  add_enum(app, "--precision", m.precision, "fp32, tf32 (cuda), bf16 or fp16");
  app.add_flag_callback(
      "--no-aux-logits", [&m] { m.aux_logits = false; }, "leave out Inception's auxiliary head (training only)");
  // the old spelling, still read (presets, scripts), no longer listed
  add_switch(app, "--aux-logits", m.aux_logits, "Inception's auxiliary head in training: on or off")->group("");
  add_enum(app, "--recompute", m.recompute,
           "make each conv + BN (+ ReLU) output again in backward from its pre-norm output instead of keeping it "
           "from the forward: less memory for one more BN pass per unit; auto: on on the cpu, off on a GPU");
  add_enum(app, "--fuse", m.fuse,
           "run each conv + BN (+ ReLU) as a fused unit: an output that feeds only convolutions or a residual add is "
           "not stored, its readers apply its batch norm as they load its pre-norm output (MLPerf's ResNet-50 on "
           "cuDNN); off: separate ops, every output stored");
  app.add_option("--image-size", m.image_size,
                 "input height and width [default: the model's training size, --list-models; inception_v3's aux "
                 "head needs 299]")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 16));  // no [299]: the default is the model's
}

// Every flag that takes a number with a fraction (CLI11's FLOAT; X in stepbench --help) refuses NaN
// and the infinities: CLI11's Range and PositiveNumber let NaN through (it compares false).
void refuse_non_finite(CLI::App& app) {
  static const CLI::Validator finite(
      [](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        return end != s.c_str() && *end == '\0' && !std::isfinite(v) ? "not a finite number: " + s : "";
      },
      "", "finite");
  for (CLI::Option* o : app.get_options()) {
    const std::string t = o->get_type_name();
    if (t.rfind("FLOAT", 0) == 0 || t == "X" || t.rfind("X:", 0) == 0) o->check(finite);  // with validators: "X:..."
  }
}

std::optional<int> parse_args(CLI::App& app, int argc, const char* const* argv, int first, const std::string& name) {
  refuse_non_finite(app);
  std::string config;                // the --config file, if any
  std::map<std::string, int> lines;  // its keys and their lines
  try {
    std::vector<std::string> args;
    for (int i = argc - 1; i >= first; --i) args.emplace_back(argv[i]);  // CLI11 takes them reversed
    if (app.get_config_ptr() != nullptr)
      for (int i = first; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--config" && i + 1 < argc) config = argv[i + 1];
        if (a.rfind("--config=", 0) == 0) config = a.substr(9);
      }
    if (!config.empty()) lines = check_config_file(app, config);
    app.parse(args);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const UsageError& e) {
    std::cerr << fmt::format("{}: {}\n", name, e.what());
    return 2;
  } catch (const CLI::ParseError& e) {
    // a value CLI11 refused that came from the --config file (not from the command line): say where
    std::string where;
    const std::string what = e.what();
    for (const auto& [key, line] : lines) {
      const std::string flag = "--" + key;
      const std::size_t at = what.find(flag);
      const bool named =
          at != std::string::npos &&
          (at + flag.size() == what.size() ||
           !(std::isalnum(static_cast<unsigned char>(what[at + flag.size()])) || what[at + flag.size()] == '-'));
      bool on_command_line = false;
      for (int i = first; i < argc; ++i)
        on_command_line |= std::string(argv[i]) == flag || std::string(argv[i]).rfind(flag + "=", 0) == 0;
      if (named && !on_command_line)
        where = fmt::format(" (the value of '{}' in --config {} line {})", key, config, line);
    }
    std::cerr << fmt::format("{}: {}{}\nRun '{} --help' for every flag and its accepted values.\n", name, what, where,
                             name);
    return 2;
  }
  return std::nullopt;
}

}  // namespace stepbench::cli
