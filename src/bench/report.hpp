// What a run reports besides Google Benchmark's table: the JSON context and the summary.
#pragma once
#include <map>
#include <string>

#include "bench/config.hpp"
#include "bench/feeder.hpp"
#include "bench/peer.hpp"
#include "bench/reporter.hpp"
#include "train/towers.hpp"

namespace stepbench {

// The configuration, the machine and what runs each op, into Google Benchmark's context.
void add_context(const BenchConfig& c, const Towers& t);

// Medians per phase, the step's inside, the sync's bandwidths, the input verdict and the peer's ratios.
void print_summary(const BenchConfig& c, const Towers& t, const SummaryReporter& rep, const std::string& prefix,
                   const PeerResult& peer, const Feeder& feeder);

}  // namespace stepbench
