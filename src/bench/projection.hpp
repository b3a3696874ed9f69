// --project-gpus: the step time and scaling efficiency at GPU counts beyond the machine, from what a
// one-GPU run measured (the forward, the backward with the moment each gradient bucket is ready,
// the update: the probed steps of bench/layer_times) and an alpha-beta model of the all-reduce over
// the given link (--link-gbps, --link-latency-us, or --fabric).
//
// Assumptions, printed with every projection: weak scaling (the batch per GPU fixed); the per-GPU
// compute as measured; buckets synced one after another on one channel, each from when backward has
// produced it (overlapped with the rest of backward, as the towers do); per bucket the faster of
// NCCL's ring, 2(N-1) (alpha + s / (N beta)), and tree, 2 ceil(log2 N) alpha + 2 s / beta, over one
// flat fabric (no node hierarchy, no congestion, no stragglers). On the cpu backend the towers of
// one process run one after another and sum in host memory: N (forward + backward + update), the
// sync overlapping the last tower's backward, alpha + 2 (N-1) s / beta per bucket.
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
// The --fabric presets (nominal figures); nullopt-like: name empty when unknown.
LinkModel fabric_preset(const std::string& name);
std::vector<std::string> fabric_names();

struct ProjectionInput {
  double forward_ms = 0, backward_ms = 0, update_ms = 0;
  struct Bucket {
    double ready_ms;  // after the backward's start
    double bytes;
  };
  std::vector<Bucket> buckets;  // in sync order
  bool sequential = false;      // cpu towers: one after another, host-memory sums
};
// Tower 0's medians over the probed steps of a one-tower run. overlap false (--no-overlap): every
// bucket waits for the end of backward.
ProjectionInput projection_input(const std::vector<ProbedStep>& steps, const Towers& t, bool overlap);

struct ProjectedPoint {
  int gpus = 0;
  double step_ms = 0, sync_ms = 0, exposed_ms = 0, efficiency = 0;
  std::string algorithm;  // what the buckets used: ring, tree, ring+tree, host
};
std::vector<ProjectedPoint> project(const ProjectionInput& in, const LinkModel& link, const std::vector<int>& gpus);

// The table, the assumptions, and per count where `measured` has one (gpus -> step ms, 0: none)
// the measured step and the error.
void print_projection(const ProjectionInput& in, const LinkModel& link, const std::vector<ProjectedPoint>& pts,
                      const std::vector<std::pair<int, double>>& measured, std::int64_t batch);
nlohmann::json projection_json(const ProjectionInput& in, const LinkModel& link,
                               const std::vector<ProjectedPoint>& pts);

}  // namespace stepbench
