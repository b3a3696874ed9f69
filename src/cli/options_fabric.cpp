// The fabric --project-gpus projects over, beyond one flat link: two levels (--gpus-per-node, the
// link within a node) and a link fitted from an nccl-tests run (--fabric-from), registered and
// resolved into BenchConfig (bench/fabric.hpp models it).
#include <fmt/format.h>

#include <algorithm>

#include <CLI/CLI.hpp>

#include "bench/fabric.hpp"
#include "cli/options.hpp"
#include "tensor/error.hpp"

namespace stepbench::cli {

void add_fabric_flags(CLI::App& app, Options& o) {
  BenchConfig& b = o.bench;
  app.add_option("--gpus-per-node", b.gpus_per_node,
                 "--project-gpus: GPUs per node, for a two-level fabric (within a node, then between nodes)")
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--node-fabric", b.node_fabric, "--gpus-per-node: the link within a node, a preset")
      ->check(CLI::IsMember(fabric_names()));
  app.add_option("--node-link-gbps", b.node_link_gbps, "--gpus-per-node: the link within a node, Gbit/s per GPU")
      ->check(CLI::Range(1e-3, 1e7));
  app.add_option("--node-link-latency-us", b.node_link_latency_us,
                 "--gpus-per-node: the link within a node, latency per hop, microseconds")
      ->check(CLI::Range(0.0, 1e6));
  app.add_option("--fabric-from", b.fabric_from,
                 "--project-gpus: fit the link to an nccl-tests all_reduce_perf -J FILE run (one host: the link "
                 "within a node with --gpus-per-node; else between nodes), or to this run's grad_sync (run: "
                 "several processes)");
}

// Before the flat link's checks (options.cpp): returns whether --fabric-from gave the link between
// nodes (the flat one), which then needs no --fabric or --link-*.
bool resolve_fabric(Options& o) {
  BenchConfig& b = o.bench;
  const bool node_given = o.given("--node-fabric") || o.given("--node-link-gbps") || o.given("--node-link-latency-us");
  if (b.project_gpus.empty()) {
    if (o.given("--gpus-per-node") || node_given || o.given("--fabric-from"))
      throw UsageError(
          "--gpus-per-node, --node-fabric, --node-link-* and --fabric-from describe the fabric for --project-gpus: "
          "add it or drop them");
    return false;
  }
  if (node_given && !o.given("--gpus-per-node"))
    throw UsageError("--node-fabric and --node-link-* describe the link within a node: add --gpus-per-node G");
  if (o.given("--node-fabric") && (o.given("--node-link-gbps") || o.given("--node-link-latency-us")))
    throw UsageError(
        "--node-fabric and --node-link-gbps/--node-link-latency-us both describe the node's link: give one");
  if (o.given("--node-link-gbps") != o.given("--node-link-latency-us"))
    throw UsageError("the link within a node needs both --node-link-gbps and --node-link-latency-us");
  if (o.given("--node-fabric")) {
    const LinkModel l = fabric_preset(b.node_fabric);
    b.node_link_gbps = l.gbps;
    b.node_link_latency_us = l.latency_us;
  }
  bool between = false;
  if (b.fabric_from == "run") {  // fitted once the run's grad_sync fixture has run (bench/stage_probe.cpp)
    if (o.given("--fabric") || o.given("--link-gbps") || o.given("--link-latency-us") || node_given ||
        o.given("--gpus-per-node"))
      throw UsageError(
          "--fabric-from run takes the links and the nodes from this run; drop --fabric, --link-*, --gpus-per-node "
          "and --node-*");
    if (b.sweep())
      throw UsageError("--fabric-from run fits the links to one run of several processes, not a sweep: drop --sweep-*");
    if (!b.phases.empty() && std::find(b.phases.begin(), b.phases.end(), Phase::grad_sync) == b.phases.end())
      throw UsageError("--fabric-from run fits the links to the grad_sync fixture: add grad_sync to --phases");
    b.fabric = "this run's grad_sync";
    return true;
  }
  if (!b.fabric_from.empty()) {
    const FittedLink f = fit_nccl_tests(b.fabric_from);
    b.fabric_note = f.note;
    const std::string name = "nccl-tests fit";
    if (f.hosts == 1 && o.given("--gpus-per-node")) {  // one host measured: the link within a node
      if (node_given)
        throw UsageError(
            fmt::format("--fabric-from {} measured one host: it is the link within a node; drop "
                        "--node-fabric/--node-link-*",
                        b.fabric_from));
      b.node_fabric = name;
      b.node_link_gbps = f.link.gbps;
      b.node_link_latency_us = f.link.latency_us;
    } else {
      if (o.given("--fabric") || o.given("--link-gbps") || o.given("--link-latency-us"))
        throw UsageError(fmt::format("--fabric-from {} gives the link{}; drop --fabric and --link-*", b.fabric_from,
                                     o.given("--gpus-per-node") ? " between nodes" : ""));
      b.fabric = name;
      b.link_gbps = f.link.gbps;
      b.link_latency_us = f.link.latency_us;
      between = true;
    }
  }
  if (o.given("--gpus-per-node") && b.node_link_gbps <= 0)
    throw UsageError(
        "--gpus-per-node needs the link within a node: --node-fabric NAME, --node-link-gbps G with "
        "--node-link-latency-us L, or --fabric-from an nccl-tests run on one host");
  return between;
}

}  // namespace stepbench::cli
