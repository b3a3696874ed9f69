// The input section of the summary: the pipeline's stage breakdown (what the input_pipeline
// benchmark measured), and the verdict, which names the stage to blame and the remedy, with the
// remedy's images/s measured by --suggest or, without it, estimated from the stage times.
#pragma once
#include <cmath>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "bench/feeder.hpp"

namespace stepbench {

// The remedy the verdict names, its images/s over every process (NaN: not estimated) and whether
// --suggest measured it; no name where every remedy --suggest measured was slower than the run.
struct Remedy {
  std::string name, why;
  double ips = NAN;
  bool measured = false;
};
struct RemedyInputs {
  InputMeasure measure;          // the input_pipeline benchmark's stage times
  bool gpu_decode = false;       // --decode gpu
  bool uncached_folder = false;  // a --data folder without --cache memory
  bool cache_fits = false;       // ... whose cache would fit
  std::vector<RemedyRow> rows;   // --suggest's, if it ran
  int processes = 1;
  double step_ips = NAN;  // the step's images/s on synthetic data, over every process
};
// From the stage times, the stage to blame's remedy; where --suggest measured the remedies, the
// one measured to keep the step fed (or the fastest).
Remedy choose_remedy(const RemedyInputs& in);

// step_ips: the step's images/s on synthetic data; pipe_ips: the input_pipeline benchmark's;
// fed_ips: the step fed by the pipeline (NaN where a phase did not run), all of them over every
// process; processes: how many run a pipeline each (the stage times and --suggest are this one's).
void print_input_section(std::ostream& out, const BenchConfig& c, const Feeder& f, double step_ips, double pipe_ips,
                         double fed_ips, int processes);

// The same for --json: per stage ms per image and share, the threads' accounting, the cache, --suggest's rows.
nlohmann::json input_stages_json(const Feeder& f);

}  // namespace stepbench
