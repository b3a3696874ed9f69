#include "train/towers.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <mutex>
#include <random>
#include <thread>

#include "comm/comm_thread.hpp"
#include "tensor/error.hpp"
#include "train/tower_parts.hpp"

namespace stepbench {

namespace {

TensorDesc flat(std::size_t count) {
  return TensorDesc::dense(Shape{1, static_cast<std::int64_t>(count), 1, 1}, DType::f32, Layout::nchw);
}

}  // namespace

Towers::Towers(const TowerOptions& o) : opt_(o) {
  if (o.towers < 1) throw UsageError(fmt::format("--gpus {} must be at least 1", o.towers));
  int local_rank = 0, local_size = 1;
  opt_.backend = resolve(o.backend);
  if (o.group) {
    rank_ = o.group->rank();
    processes_ = o.group->size();
    local_rank = o.group->local_rank();
    local_size = o.group->local_size();
  }
  if (opt_.backend == BackendKind::cuda) {
    const int visible = cuda_device_count();
    if (o.towers * local_size > visible)
      throw UsageError(
          local_size > 1
              ? fmt::format("{} processes on this node with --gpus {} each need {} GPUs, but {} {} visible; use "
                            "--gpus {} or fewer processes per node",
                            local_size, o.towers, o.towers * local_size, visible, visible == 1 ? "is" : "are",
                            std::max(visible / local_size, 1))
              : fmt::format("--gpus {} but only {} GPU{} visible; use --gpus {} or fewer", o.towers, visible,
                            visible == 1 ? " is" : "s are", visible));
  }
  if (o.ps_on_host && o.variable_update != VariableUpdate::parameter_server)
    throw UsageError("--ps-device cpu applies to --variable-update parameter_server only");
  if (o.sync_timeout_s < 0) throw UsageError("--sync-timeout-s must be 0 (wait forever) or more");
  if (o.precision == Precision::fp16 && o.variable_update == VariableUpdate::parameter_server)
    throw UnsupportedError(
        "--precision fp16 with parameter_server: the dynamic loss scale lives on each tower and "
        "only the server updates, so the towers' scales would drift apart (not implemented); use "
        "--variable-update replicated, or --precision bf16, which needs no loss scaling");
  if (o.group) o.group->set_sync_timeout(o.sync_timeout_s);
  for (int i = 0; i < o.towers; ++i) {
    auto t = std::make_unique<Tower>();
    BackendOptions bo;
    bo.kind = opt_.backend;
    bo.device = local_rank * o.towers + i;  // the GPUs of this node, split by process
    bo.precision = o.precision;
    bo.workspace_bytes = o.workspace_bytes;
    bo.own_kernels = o.own_kernels;
    t->be = make_backend(bo);
    const int global = rank_ * o.towers + i;  // each replica draws its own dropout masks
    t->g = std::make_unique<Graph>(*t->be, GraphConfig{o.batch_per_tower, o.layout, o.dtype(), o.seed + 977 * global});
    info_ = build_model(*t->g, o.model, o.model_options);
    t->g->plan();
    init_parameters(*t->g, o.seed);  // every replica starts from the same variables
    t->tr = std::make_unique<Trainer>(*t->g, o.optimizer);
    grads_.push_back(t->g->grad_arena());
    params_.push_back(t->g->param_arena());
    towers_.push_back(std::move(t));
  }
  // Buckets over the gradient arena, each at most bucket_bytes, split at parameter boundaries when
  // a parameter fits (a parameter larger than a bucket gets a bucket of its own).
  const std::size_t per = std::max<std::size_t>(opt_.bucket_bytes / sizeof(float), 1);
  const std::size_t total = towers_[0]->g->param_arena_floats();
  std::vector<std::size_t> bounds;  // parameter starts, ascending
  for (const auto& e : towers_[0]->g->params())
    if (e.trainable) bounds.push_back(e.offset);
  std::sort(bounds.begin(), bounds.end());
  bounds.push_back(total);
  std::size_t start = 0;
  const std::size_t first =
      std::max<std::size_t>(std::min(opt_.first_bucket_bytes, opt_.bucket_bytes) / sizeof(float), 1);
  for (std::size_t k = 1; k < bounds.size(); ++k) {
    if (bounds[k] - start > (buckets_.empty() ? first : per) && bounds[k - 1] > start) {
      buckets_.emplace_back(start, bounds[k - 1] - start);
      start = bounds[k - 1];
    }
  }
  if (total > start) buckets_.emplace_back(start, total - start);
  std::size_t largest = 0;
  for (auto [off, n] : buckets_) largest = std::max(largest, n);

  std::vector<Backend*> bes;
  std::vector<Stream*> comm_streams;
  for (auto& t : towers_) {
    t->comm = t->be->create_stream();
    for (std::size_t k = 0; k < buckets_.size(); ++k) t->ready.push_back(t->be->create_event());
    t->computed = t->be->create_event();
    t->synced = t->be->create_event();
    bes.push_back(t->be.get());
    comm_streams.push_back(t->comm.get());
  }
  if (o.ps_on_host) {
    server_ = std::make_unique<HostServer>();
    Backend& be0 = *towers_[0]->be;
    server_->params = HostBuffer(be0, total * sizeof(float));
    server_->grads = HostBuffer(be0, total * sizeof(float));
    for (int i = 1; i < o.towers; ++i) server_->tmp.emplace_back(be0, largest * sizeof(float));
    be0.copy(be0.default_stream(), server_->params.get(), params_[0], total * sizeof(float));
    be0.synchronize(be0.default_stream());
    server_->opt = std::make_unique<OptimizerState>(*server_->cpu, o.optimizer, total);
  } else if (opt_.backend == BackendKind::cpu) {
    coll_ = make_host_collective(*towers_[0]->be, o.towers, group());
  } else if (sync_bytes() > 0) {
    coll_ = make_nccl_collective(bes, comm_streams, group());
  }
  stall_s_ = o.fault_sync_stall_s;
  if (opt_.overlap && sync_bytes() > 0 && !async() && (processes_ == 1 || group().threads_ok()))
    comm_ = std::make_unique<CommThread>([this](std::size_t k) { sync_bucket(k); });
}

Towers::~Towers() = default;

Backend& Towers::backend(int i) const { return *towers_.at(static_cast<std::size_t>(i))->be; }
Graph& Towers::graph(int i) const { return *towers_.at(static_cast<std::size_t>(i))->g; }
Stream& Towers::stream(int i) const { return backend(i).default_stream(); }

void Towers::set_synthetic_batch(std::uint64_t seed) {
  for (int i = 0; i < size(); ++i) {
    Graph& g = graph(i);
    const Shape s = g.input_tensor().shape();
    std::mt19937_64 rng(seed + 7919 * static_cast<std::uint64_t>(rank_ * size() + i));  // per global tower
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> img(static_cast<std::size_t>(s.numel()));
    for (auto& v : img) v = nd(rng);
    g.set_input_nchw(img.data());
    const auto classes = static_cast<std::uint64_t>(opt_.model_options.num_classes);
    std::vector<std::int32_t> labels(static_cast<std::size_t>(s.n));
    for (auto& l : labels) l = static_cast<std::int32_t>(rng() % classes);
    g.set_labels(labels.data());
  }
}

void Towers::forward_inference() {
  for (auto& t : towers_) t->g->forward(t->be->default_stream(), false);
}
void Towers::forward_train() {
  for (auto& t : towers_) t->tr->forward(t->be->default_stream());
}
void Towers::mark_ready(int i) {
  Tower& t = *towers_[static_cast<std::size_t>(i)];
  for (; t.recorded < buckets_.size(); ++t.recorded) t.be->record(*t.ready[t.recorded], t.be->default_stream());
}

void Towers::launch(std::size_t k) {
  SB_CHECK(k == launched_, "buckets launch in order");
  ++launched_;
  if (!async()) {
    comm_->push(k);
    return;
  }
  for (auto& t : towers_) t->be->wait(*t->comm, *t->ready[k]);  // the comm stream waits for backward
  const auto [off, n] = buckets_[k];
  if (opt_.variable_update == VariableUpdate::replicated)
    coll_->allreduce_average(grads_, off, n);
  else
    coll_->reduce_average(grads_, off, n);
}

void Towers::backward(bool start_sync) {
  if (!start_sync || !opt_.overlap || sync_bytes() == 0 || !(async() || comm_)) {
    for (auto& t : towers_) t->tr->backward(t->be->default_stream());
    return;
  }
  // A bucket is ready when every tower has produced it. The towers of one process are launched one
  // after another, so that is when the last one's backward passes it; each tower records an event
  // on its stream there, for the communication stream (NCCL) or thread (host) to wait on.
  for (std::size_t i = 0; i < towers_.size(); ++i) {
    Tower& t = *towers_[i];
    const bool last = i + 1 == towers_.size();
    t.g->backward(t.be->default_stream(), [&, last](std::size_t ready) {
      while (t.recorded < buckets_.size() && buckets_[t.recorded].first + buckets_[t.recorded].second <= ready) {
        t.be->record(*t.ready[t.recorded], t.be->default_stream());
        if (last) launch(t.recorded);
        ++t.recorded;
      }
    });
    if (!last) mark_ready(static_cast<int>(i));  // its backward is all launched
  }
}

void Towers::sync_bucket(std::size_t k) {
  if (stall_s_ > 0 && k == 0) {  // fault injection: this process stalls before its first sync
    std::this_thread::sleep_for(std::chrono::duration<double>(std::exchange(stall_s_, 0.0)));
  }
  const auto [off, n] = buckets_[k];
  if (server_) {
    // Every tower's bucket to host memory on its communication stream (after backward produced
    // it), summed on the CPU, then across processes onto process 0; averaged.
    float* sum = server_->grads.as<float>() + off;
    for (std::size_t i = 0; i < towers_.size(); ++i) {
      Tower& t = *towers_[i];
      t.be->wait(*t.comm, *t.ready[k]);
      t.be->copy(*t.comm, i == 0 ? sum : server_->tmp[i - 1].as<float>(), grads_[i] + off, n * sizeof(float));
    }
    Backend& cpu = *server_->cpu;
    auto& cs = cpu.default_stream();
    for (std::size_t i = 0; i < towers_.size(); ++i) {
      towers_[i]->be->synchronize(*towers_[i]->comm);
      if (i > 0) cpu.add(cs, Tensor{server_->tmp[i - 1].get(), flat(n)}, Tensor{sum, flat(n)}, 1.0f);
    }
    if (processes_ > 1) group().reduce_sum_to_root(sum, n);
    cpu.scale(cs, sum, 1.0f / static_cast<float>(global_size()), n);
    return;
  }
  if (opt_.variable_update == VariableUpdate::replicated)
    coll_->allreduce_average(grads_, off, n);
  else if (opt_.variable_update == VariableUpdate::parameter_server)
    coll_->reduce_average(grads_, off, n);
}

void Towers::grad_sync() {
  if (sync_bytes() == 0) return;
  overlapped_ = launched_;
  for (int i = 0; i < size(); ++i) mark_ready(i);  // backward is all launched by now
  if (async()) {
    while (launched_ < buckets_.size()) launch(launched_);
    for (auto& t : towers_) {  // the next phase on each tower waits for its share of the sync
      t->be->record(*t->synced, *t->comm);
      t->be->wait(t->be->default_stream(), *t->synced);
    }
  } else if (launched_ > 0) {  // backward(true) started some: hand over the rest, wait for all
    while (launched_ < buckets_.size()) launch(launched_);
    comm_->wait();
  } else {
    for (std::size_t k = 0; k < buckets_.size(); ++k) sync_bucket(k);
  }
  launched_ = 0;
  for (auto& t : towers_) t->recorded = 0;
}

void Towers::update() {
  const std::size_t total = towers_[0]->g->param_arena_floats();
  if (server_) {
    // The server updates the variables in host memory (process 0), every process gets them, and
    // every tower copies them in on its stream, before its next forward.
    float* p = server_->params.as<float>();
    if (rank_ == 0) server_->opt->update(server_->cpu->default_stream(), p, server_->grads.as<float>());
    if (processes_ > 1) group().broadcast_from_root(p, total);
    for (std::size_t i = 0; i < towers_.size(); ++i)
      towers_[i]->be->copy(towers_[i]->be->default_stream(), params_[i], p, total * sizeof(float));
    return;
  }
  if (opt_.variable_update == VariableUpdate::parameter_server && global_size() > 1) {
    // the server is tower 0 of process 0: it alone applies the update, then everyone gets the result
    Tower& t0 = *towers_[0];
    if (rank_ == 0) t0.tr->update(t0.be->default_stream());
    if (async()) {
      for (auto& t : towers_) {
        t->be->record(*t->computed, t->be->default_stream());
        t->be->wait(*t->comm, *t->computed);
      }
      coll_->broadcast(params_, 0, total);
      for (auto& t : towers_) {
        t->be->record(*t->synced, *t->comm);
        t->be->wait(t->be->default_stream(), *t->synced);
      }
      return;
    }
    t0.be->synchronize(t0.be->default_stream());
    for (auto [off, n] : buckets_) coll_->broadcast(params_, off, n);
    return;
  }
  for (auto& t : towers_) t->tr->update(t->be->default_stream());
}
void Towers::step() {
  forward_train();
  backward(true);
  grad_sync();
  update();
}
std::string Towers::sync_name() const {
  if (sync_bytes() == 0) return "none";
  if (server_)
    return processes_ > 1 ? fmt::format("host memory (parameter server on the CPU) + MPI over {} processes", processes_)
                          : "host memory (parameter server on the CPU)";
  return coll_->name();
}

std::size_t Towers::sync_bytes() const {
  if (opt_.variable_update == VariableUpdate::independent) return 0;
  if (global_size() < 2 && !opt_.ps_on_host) return 0;  // one tower with its variables: nothing moves
  return towers_[0]->g->param_arena_floats() * sizeof(float);
}

double Towers::bus_factor() const {
  if (sync_bytes() == 0) return 0.0;
  const double n = global_size();
  return opt_.variable_update == VariableUpdate::replicated ? 2.0 * (n - 1) / n : 1.0;
}

float Towers::loss(int tower) const { return graph(tower).loss(stream(tower)); }

}  // namespace stepbench
