// The fabric a projection assumes between GPUs, and what it makes of the step's spread:
//   - one flat link (--fabric, --link-gbps, --link-latency-us), or two levels (--gpus-per-node G):
//     within a node (--node-fabric, --node-link-gbps, --node-link-latency-us), then between nodes;
//   - a link's alpha and beta fitted from an nccl-tests all-reduce run (its -J JSON file,
//     --fabric-from FILE): the level it measured is the one its ranks spanned (one host: within a
//     node; several: between nodes);
//   - the straggler tax: a synchronous step over N GPUs waits for the slowest, so from one GPU's
//     spread of step times, the expected maximum of N of them, as a band.
#pragma once
#include <string>
#include <vector>

#include "bench/config.hpp"
#include "bench/projection.hpp"

namespace stepbench {

// The fabric the flags describe (resolve() fitted --fabric-from into them).
Fabric fabric_of(const BenchConfig& c);
// "nvlink4 (3600 Gb/s, 3 us per hop)", or "8 GPUs per node over ..., then ... between nodes".
std::string describe(const Fabric& f);

// One all-reduce of `bytes` over `gpus`: the fastest of NCCL's ring and tree over the flat link, and
// with two levels, of the hierarchical one (a reduce-scatter within the node, an all-reduce of each
// GPU's share between the nodes, an all-gather within the node) and the flat ring and tree through
// the slower link. Sets `algorithm` to the one taken ("ring", "tree", "2-level"). With one node (G >=
// gpus) it is the flat model over the node's link.
double allreduce_ms(const Fabric& f, double bytes, int gpus, std::string* algorithm);

// An nccl-tests run read from its -J JSON file: ranks, hosts, and the link alpha-beta fitted to its
// all-reduce times (t = 2(n-1) alpha + 2(n-1)/n s / beta, least squares on relative error).
struct FittedLink {
  LinkModel link;  // name "FILE"
  int ranks = 0, hosts = 0, points = 0;
  double worst_residual = 0;  // the largest relative misfit over the sizes
  std::string note;           // what was read, for the run's report
};
// UsageError naming the file and what is wrong when it is not such a file.
FittedLink fit_nccl_tests(const std::string& path);

// --fabric-from run: the links fitted to a multi-process run's own grad_sync fixture (the sync alone,
// no compute beside it), each the busbw its level reached, with no latency (one total per level
// cannot split the two; the buckets are megabytes). Flat (per_node 0): Gloo's ring over the
// processes, the grad_sync's busbw. Two levels (distributed_all_reduce, per_node processes per
// node): within a node from the reduce-scatter's and the all-gather's busbw, between nodes the
// cross-node all-reduce's. The algorithm is pinned to the one the run used, so that the run's buckets
// projected alone take the time the fixture measured; what the step's projection then gets wrong
// is what the model leaves out (overlap with compute, the machine's cores shared, stragglers).
struct RunLinks {
  double flat_GBps = 0;                                                            // per_node 0
  double node_reduce_scatter_GBps = 0, across_GBps = 0, node_all_gather_GBps = 0;  // two levels
  int per_node = 0;
};
Fabric fabric_from_run(const RunLinks& r);

// The expected slowest of `gpus` step times drawn like `samples` (one GPU's timed steps), minus
// their median: the expected maximum of that many normal draws (Blom's approximation of its
// quantile) at the samples' spread, from the robust one (1.4826 MAD, blind to rare hiccups) less its
// sampling error to the plain standard deviation (which counts them) plus its sampling error. Both 0
// for one GPU; the band widens with the count and with the spread.
struct StragglerTax {
  double lo_ms = 0, hi_ms = 0;
};
StragglerTax straggler_tax(const std::vector<double>& samples, int gpus);

}  // namespace stepbench
