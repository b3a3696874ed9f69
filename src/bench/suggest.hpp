// --suggest: the input pipeline run alone for a few batches as the run configured it and with each
// remedy that applies (--cache memory, a record file, twice the --data-threads), on a sample of
// the folder, so the verdict can quote measured images/s instead of estimates.
#pragma once
#include <vector>

#include "bench/feeder.hpp"

namespace stepbench {

// Runs on this process's CPU; the step is not running meanwhile. Throws UsageError only for what
// the run itself would refuse; a remedy that cannot run here gets a row saying why.
std::vector<RemedyRow> run_suggest(const BenchConfig& c, const Feeder& f);

}  // namespace stepbench
