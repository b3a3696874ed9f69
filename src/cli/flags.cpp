#include "cli/flags.hpp"

#include <fmt/format.h>

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
  add_enum(app, "--model", m.model, "inception_v3 or tiny", user_models());
  add_enum(app, "--format", m.layout, "activation layout: nchw or nhwc", names_of<Layout>());
  add_enum(app, "--precision", m.precision, "fp32, tf32 (cuda), bf16 or fp16");
  add_switch(app, "--aux-logits", m.aux_logits, "Inception's auxiliary head in training: on or off");
  app.add_option("--image-size", m.image_size, "input height and width (inception_v3: >= 75, 299 with the aux head)")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 16));
}

std::optional<int> parse_args(CLI::App& app, int argc, const char* const* argv, int first, const std::string& name) {
  try {
    std::vector<std::string> args;
    for (int i = argc - 1; i >= first; --i) args.emplace_back(argv[i]);  // CLI11 takes them reversed
    if (app.get_config_ptr() != nullptr)
      for (int i = first; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--config" && i + 1 < argc) check_config_file(app, argv[i + 1]);
        if (a.rfind("--config=", 0) == 0) check_config_file(app, a.substr(9));
      }
    app.parse(args);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const UsageError& e) {
    std::cerr << fmt::format("{}: {}\n", name, e.what());
    return 2;
  } catch (const CLI::ParseError& e) {
    std::cerr << fmt::format("{}: {}\nRun '{} --help' for every flag and its accepted values.\n", name, e.what(), name);
    return 2;
  }
  return std::nullopt;
}

}  // namespace stepbench::cli
