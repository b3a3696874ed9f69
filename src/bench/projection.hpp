// --project-gpus: the step time and scaling efficiency at GPU counts beyond the machine, from what a
// one-GPU run measured (the forward, the backward with the moment each gradient bucket is ready,
// the update: the probed steps of bench/layer_times) and an alpha-beta model of the all-reduce over
// the given link (--link-gbps, --link-latency-us, --fabric, or an nccl-tests run: --fabric-from),
// flat or in two levels (--gpus-per-node with the link within a node), and the straggler band.
//
// Assumptions, printed with every projection: weak scaling (the batch per GPU fixed); the per-GPU
// compute as measured; buckets synced one after another on one channel, each from when backward has
// produced it (overlapped with the rest of backward, as the towers do); per bucket the faster of
// NCCL's ring, 2(N-1) (alpha + s / (N beta)), and tree, 2 ceil(log2 N) alpha + 2 s / beta, over one
// flat fabric, or with --gpus-per-node also the two-level one (bench/fabric.hpp); no congestion.
// Run with several processes (one tower each), it projects from one process's compute and prints the
// step the run measured beside it, with the error: the model checked on a point it was not fitted to.
// The straggler band beside the step: the expected slowest of N GPUs' steps drawn like this run's. On the cpu backend
// the towers of one process run one after another and sum in host memory: N (forward + backward + update), the sync
// overlapping the last tower's backward, alpha + 2 (N-1) s / beta per bucket.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "bench/layer_times.hpp"

namespace stepbench {

struct LinkModel {
  std::string name;  // a --fabric preset, or "given" (--link-gbps, --link-latency-us)
  double gbps = 0;   // per GPU, one direction
  double latency_us = 0;
};
// The fabric between the GPUs: one flat link (`between`), or two levels (gpus_per_node > 0): `node`
// within a node, `between` between nodes (bench/fabric.hpp models the all-reduce over it).
struct Fabric {
  LinkModel between;      // between nodes (or the one flat link)
  LinkModel node;         // within a node
  int gpus_per_node = 0;  // 0: one flat fabric (`between`)
  // "": per bucket the fastest model; "ring" or "2-level": the one a measured run used (--fabric-from
  // run), so that the projection of that run models what it did
  std::string algorithm;
};
// The --fabric presets (nominal figures); nullopt-like: name empty when unknown.
LinkModel fabric_preset(const std::string& name);
std::vector<std::string> fabric_names();

struct ProjectionInput {
  double forward_ms = 0, backward_ms = 0, update_ms = 0;
  // one GPU's whole step (ms): the timed steps' median (set_measured_step), else the probed steps'
  // median span; it holds what the parts leave out (the loss, gradient zeroing, the gaps between
  // phases) and leaves out what the probes add. 0: the parts' sum
  double step_ms = 0;
  double base_ms() const { return step_ms > 0 ? step_ms : forward_ms + backward_ms + update_ms; }
  struct Bucket {
    double ready_ms;  // after the backward's start
    double bytes;
  };
  std::vector<Bucket> buckets;  // in sync order
  bool sequential = false;      // cpu towers: one after another, host-memory sums
  // > 1: a run of that many processes, one tower each, projected to check the model against it: each
  // process is a GPU, and one GPU's step is its compute alone (its steps less their wait for the
  // sync), which the model adds the sync to
  int processes = 1;
  // one GPU's steps (ms), the probed ones (projection_input) or the timed ones: their spread makes
  // the straggler band
  std::vector<double> step_samples;
};
// Tower 0's medians over the probed steps of a one-tower run, or of one process of `processes` (one
// tower each). overlap false (--no-overlap): every bucket waits for the end of backward.
ProjectionInput projection_input(const std::vector<ProbedStep>& steps, const Towers& t, bool overlap,
                                 int processes = 1);
// One GPU's step as the run timed it (its median, ms, without probes): the step every tower repeats
void set_measured_step(ProjectionInput& in, double step_ms);

struct ProjectedPoint {
  int gpus = 0;
  double step_ms = 0, sync_ms = 0, exposed_ms = 0, efficiency = 0;
  std::string algorithm;  // what the buckets used: ring, tree, 2-level (joined by +), host
  // the straggler band: the expected slowest of N GPUs' steps drawn like step_samples, over their
  // median (bench/fabric.hpp straggler_tax); 0 for one GPU, for cpu towers and without samples
  double tax_lo_ms = 0, tax_hi_ms = 0;
};
std::vector<ProjectedPoint> project(const ProjectionInput& in, const Fabric& fabric, const std::vector<int>& gpus);

// The table, the assumptions, and per count where `measured` has one (gpus -> step ms, 0: none)
// the measured step and the error.
void print_projection(const ProjectionInput& in, const Fabric& fabric, const std::vector<ProjectedPoint>& pts,
                      const std::vector<std::pair<int, double>>& measured, std::int64_t batch);
// `measured` as print_projection's: the points it has gain measured_step_ms and error (projected over
// measured, less 1).
nlohmann::json projection_json(const ProjectionInput& in, const Fabric& fabric, const std::vector<ProjectedPoint>& pts,
                               const std::vector<std::pair<int, double>>& measured = {});

}  // namespace stepbench
