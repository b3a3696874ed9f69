// The input section of the summary: the pipeline's stage breakdown (what the input_pipeline
// benchmark measured), and the verdict, which names the stage to blame and the remedy, with the
// remedy's images/s measured by --suggest or, without it, estimated from the stage times.
#pragma once
#include <nlohmann/json.hpp>
#include <ostream>

#include "bench/feeder.hpp"

namespace stepbench {

// step_ips: the step's images/s on synthetic data; pipe_ips: the input_pipeline benchmark's;
// fed_ips: the step fed by the pipeline (NaN where a phase did not run), all of them over every
// process; processes: how many run a pipeline each (the stage times and --suggest are this one's).
void print_input_section(std::ostream& out, const BenchConfig& c, const Feeder& f, double step_ips, double pipe_ips,
                         double fed_ips, int processes);

// The same for --json: per stage ms per image and share, the threads' accounting, the cache, --suggest's rows.
nlohmann::json input_stages_json(const Feeder& f);

}  // namespace stepbench
