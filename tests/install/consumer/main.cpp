// A program of another project: builds the tiny model on the cpu backend, plans it, times its step,
// and reads a run file written by the stepbench binary; prints what it found.
//   consumer RUN.json
#include <stepbench/stepbench.hpp>

#include <cstdio>
#include <exception>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer RUN.json\n");
    return 2;
  }
  try {
    stepbench::ModelSpec spec;
    spec.model = "tiny";
    spec.backend = "cpu";
    spec.batch = 4;
    spec.image_size = 32;
    stepbench::Model model(spec);  // build
    std::printf("stepbench %s, model %s on %s: %lld parameters, %.4f GFLOP per image\n", stepbench::version().c_str(),
                spec.model.c_str(), model.backend().c_str(), static_cast<long long>(model.parameters()),
                model.forward_gflop_per_image());
    const std::size_t bytes = model.plan();  // plan
    std::printf("planned: %zu bytes\n", bytes);
    const stepbench::StepTimes t = model.time_step(1, 3);  // time a step
    std::printf("step %.3f ms: forward %.3f, backward %.3f, update %.3f; %.1f images/s over %d steps\n", t.step_ms,
                t.forward_ms, t.backward_ms, t.update_ms, t.images_per_s(), t.steps);
    if (!(t.step_ms > 0 && t.forward_ms > 0 && t.backward_ms > 0 && t.steps == 3)) return 1;
    const stepbench::RunFile run = stepbench::read_run_file(argv[1]);  // read a run file
    std::printf("run file: model %s, %zu benchmarks\n", run.context.at("model").c_str(), run.benchmarks.size());
    for (const auto& b : run.benchmarks)
      std::printf("  %s: %zu repetitions, median %.3f ms\n", b.name.c_str(), b.ms.size(), b.median_ms);
    return run.benchmarks.empty() ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
}
