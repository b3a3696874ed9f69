// What a run reports besides Google Benchmark's table: the JSON context and the summary.
#pragma once
#include <map>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "bench/config.hpp"
#include "bench/feeder.hpp"
#include "bench/memory_report.hpp"
#include "bench/peer.hpp"
#include "bench/reporter.hpp"
#include "train/towers.hpp"

namespace stepbench {

// The configuration, the machine (its fingerprint: versions, device, GPU clocks and power limit
// where NVML reports them) and what runs each op, in order.
std::vector<std::pair<std::string, std::string>> run_context(const BenchConfig& c, const Towers& t);
// run_context into Google Benchmark's context.
void add_context(const BenchConfig& c, const Towers& t);
// One line for c.history (compare::history_record): the context and every repetition.
void append_history(const BenchConfig& c, const Towers& t, const SummaryReporter& rep);

// --per-layer: every distinct convolution shape's fwd, bwd_data and bwd_filter medians.
void print_per_layer_table(std::ostream& out, const SummaryReporter& rep, const std::string& prefix);
// Medians per phase, the step's inside, the sync's bandwidths, the memory plan, the input verdict
// and the peer's ratios; peak: the "of peak" line's text ("": none).
void print_summary(const BenchConfig& c, const Towers& t, const SummaryReporter& rep, const std::string& prefix,
                   const PeerResult& peer, const Feeder& feeder, const MemoryReport& memory,
                   const std::string& peak = "");

}  // namespace stepbench
