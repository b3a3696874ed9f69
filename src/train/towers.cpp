#include "train/towers.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <thread>

#include "comm/comm_thread.hpp"
#include "tensor/error.hpp"
#include "train/sync.hpp"
#include "train/tower_parts.hpp"

namespace stepbench {

// Gradients are summed element by element, so every tower, here and in every process, must lay its
// arenas out alike. A backend's own filter storage may not: oneDNN picks its blocked weight format
// per instruction set, thread count and batch.
void Towers::check_arena_layouts() const {
  const std::uint64_t layout = towers_[0]->g->arena_fingerprint();
  for (const auto& t : towers_)
    SB_CHECK(t->g->arena_fingerprint() == layout, "the towers of one process laid their parameters out differently");
  if (processes_ == 1) return;
  const auto v = static_cast<double>(layout >> 12);  // 52 bits: exact in a double
  if (group().allreduce_max(v) != -group().allreduce_max(-v))
    throw UsageError(
        "the processes laid their parameters out differently (the cpu backend keeps convolution filters in the "
        "format oneDNN picks for the CPU's instruction set, the thread count and the batch): run every process "
        "with the same --batch-size and OMP_NUM_THREADS on CPUs of one kind");
}

Towers::Towers(const TowerOptions& o) : opt_(o) {
  if (o.towers < 1) throw UsageError(fmt::format("--gpus {} must be at least 1", o.towers));
  int local_size = 1;
  opt_.backend = resolve(o.backend);
  if (o.group) {
    rank_ = o.group->rank();
    processes_ = o.group->size();
    local_size = o.group->local_size();
  }
  if (o.ranks_per_gpu < 1) throw UsageError(fmt::format("--ranks-per-gpu {} must be at least 1", o.ranks_per_gpu));
  if (opt_.backend == BackendKind::cuda) {
    const int visible = cuda_device_count(), k = o.ranks_per_gpu;
    const int need = (o.towers * local_size + k - 1) / k;  // GPUs this node's towers take
    if (need > visible) {
      const std::string towers =
          local_size > 1 ? fmt::format("{} processes on this node with --gpus {} each", local_size, o.towers)
                         : fmt::format("--gpus {}", o.towers);
      const int share = (o.towers * local_size + std::max(visible, 1) - 1) / std::max(visible, 1);
      throw UsageError(fmt::format(
          "{} need{} {} GPU{}{}, but {} {} visible; use fewer towers or processes, or share the GPUs (a test of the "
          "multi-rank path: its times are not scaling figures): {}",
          towers, local_size > 1 ? "" : "s", need, need == 1 ? "" : "s",
          k > 1 ? fmt::format(" at {} ranks per GPU", k) : "", visible, visible == 1 ? "is" : "are",
          o.towers > 1
              ? fmt::format("stepbench launch --nproc {} -- --gpus 1 (one rank per process)", o.towers * local_size)
              : fmt::format("--ranks-per-gpu {}", share)));
    }
  }
  check_sync_options(o);
  if (o.group) o.group->set_sync_timeout(o.sync_timeout_s);
  const auto plans = o.plans ? o.plans : std::make_shared<ConvPlanCache>();
  for (int i = 0; i < o.towers; ++i) {
    auto t = std::make_unique<Replica>();
    BackendOptions bo;
    bo.kind = opt_.backend;
    const TowerPlace place = tower_place(opt_, i);
    bo.device = place.device;
    bo.memory_share = place.memory_share;
    bo.precision = o.precision;
    bo.workspace_bytes = o.workspace_bytes;
    bo.own_kernels = o.own_kernels;
    bo.emulate_bf16 = o.emulate_bf16;
    bo.memory_limit_bytes = o.memory_limit_bytes;
    bo.plans = plans;
    t->be = make_backend(bo);
    const int global = rank_ * o.towers + i;  // each replica draws its own dropout masks
    t->g = std::make_unique<Graph>(*t->be, graph_config(o, o.batch_per_tower, o.seed + 977 * global));
    t->g->set_fault(o.fault_slow_conv);
    info_ = build_model(*t->g, o.model, o.model_options);
    t->g->plan();
    init_parameters(*t->g, o.seed);  // every replica starts from the same variables
    t->tr = std::make_unique<Trainer>(*t->g, o.optimizer);
    grads_.push_back(t->g->grad_arena());
    params_.push_back(t->g->param_arena());
    towers_.push_back(std::move(t));
  }
  check_arena_layouts();
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

  for (auto& t : towers_) {
    t->comm = t->be->create_stream();
    for (std::size_t k = 0; k < buckets_.size(); ++k) t->ready.push_back(t->be->create_sync_event());
    t->computed = t->be->create_sync_event();
    t->synced = t->be->create_sync_event();
  }
  sync_ = make_gradient_sync(opt_, SyncTowers{towers_, buckets_, grads_, params_, group(), total, o.sync_timeout_s});
  stall_s_ = o.fault_sync_stall_s;
  if (opt_.overlap && sync_->bytes() > 0 && !sync_->enqueued() && (processes_ == 1 || group().threads_ok()))
    comm_ = std::make_unique<CommThread>([this](std::size_t k) { sync_on_host(k); });
}

Towers::~Towers() = default;

TowerPlace tower_place(const TowerOptions& o, int tower) {
  const int local_rank = o.group ? o.group->local_rank() : 0, local_size = o.group ? o.group->local_size() : 1;
  TowerPlace p;
  if (resolve(o.backend) == BackendKind::cuda) {
    p.device = (local_rank * o.towers + tower) / std::max(o.ranks_per_gpu, 1);
    p.memory_share = std::max(o.ranks_per_gpu, 1);
  } else {
    p.memory_share = local_size;  // the processes of a host plan on its memory at once
  }
  return p;
}

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
  for (auto& t : towers_) {
    record_step(*t, &Replica::step_begin);
    t->tr->forward(t->be->default_stream());
    record_step(*t, &Replica::forward_end);
  }
}
void Towers::mark_ready(int i) {
  Replica& t = *towers_[static_cast<std::size_t>(i)];
  for (; t.recorded < buckets_.size(); ++t.recorded) record_ready(t, t.recorded);
}
void Towers::record_ready(Replica& t, std::size_t k) {
  t.be->record(*t.ready[k], t.be->default_stream());
  if (sync_timing_) t.be->record(*t.timed_ready[k], t.be->default_stream());
}
void Towers::record_sync(std::size_t k, bool end) {
  if (!sync_timing_) return;
  for (auto& t : towers_) t->be->record(end ? *t->sync_end[k] : *t->sync_begin[k], *t->comm);
}

void Towers::set_sync_timing(bool on) {
  sync_timing_ = false;
  if (!on) return;
  for (auto& t : towers_) {
    for (auto* v : {&t->timed_ready, &t->sync_begin, &t->sync_end}) {
      v->clear();
      for (std::size_t k = 0; k < buckets_.size(); ++k) v->push_back(t->be->create_event());
    }
  }
  sync_timing_ = true;  // once every event exists
}

std::vector<Towers::BucketSpan> Towers::bucket_spans(int tower, Event& ref) const {
  SB_CHECK(sync_timing_, "bucket_spans without set_sync_timing(true)");
  std::vector<BucketSpan> v;
  if (sync_->bytes() == 0) return v;
  Replica& t = *towers_.at(static_cast<std::size_t>(tower));
  sync_->wait_for(*t.be, *t.comm);  // its last events may be after the compute stream's (the host server)
  for (std::size_t k = 0; k < buckets_.size(); ++k) {
    const double ready = t.be->elapsed_ms(ref, *t.timed_ready[k]), free = t.be->elapsed_ms(ref, *t.sync_begin[k]);
    v.push_back({k, std::max(ready, free), t.be->elapsed_ms(ref, *t.sync_end[k])});
  }
  return v;
}

void Towers::launch(std::size_t k) {
  SB_CHECK(k == launched_, "buckets launch in order");
  ++launched_;
  if (!sync_->enqueued()) {
    comm_->push(k);
    return;
  }
  if (stall_s_ > 0 && k == 0)  // fault injection: this process stalls before enqueuing its first sync
    std::this_thread::sleep_for(std::chrono::duration<double>(std::exchange(stall_s_, 0.0)));
  record_sync(k, false);
  sync_->sync_bucket(k);  // the communication streams wait for backward, then the collective is enqueued
  record_sync(k, true);
}

void Towers::backward(bool start_sync) {
  auto begin = [this](Replica& t) {
    record_step(t, &Replica::backward_begin);
    if (t.delay_ms > 0) t.be->delay(t.compute(), t.delay_ms);
  };
  if (!start_sync || !opt_.overlap || sync_->bytes() == 0 || !(sync_->enqueued() || comm_)) {
    for (auto& t : towers_) {
      begin(*t);
      t->tr->backward(t->be->default_stream());
      record_step(*t, &Replica::backward_end);
    }
    return;
  }
  // A bucket is ready when every tower has produced it. The towers of one process are launched one
  // after another, so that is when the last one's backward passes it; each tower records an event
  // on its stream there, for the communication stream (NCCL) or thread (host) to wait on.
  for (std::size_t i = 0; i < towers_.size(); ++i) {
    Replica& t = *towers_[i];
    const bool last = i + 1 == towers_.size();
    begin(t);
    t.g->backward(t.be->default_stream(), [&, last](std::size_t ready) {
      while (t.recorded < buckets_.size() && buckets_[t.recorded].first + buckets_[t.recorded].second <= ready) {
        record_ready(t, t.recorded);
        if (last) launch(t.recorded);
        ++t.recorded;
      }
    });
    record_step(t, &Replica::backward_end);
    if (!last) mark_ready(static_cast<int>(i));  // its backward is all launched
  }
}

void Towers::sync_on_host(std::size_t k) {
  if (stall_s_ > 0 && k == 0) {  // fault injection: this process stalls before its first sync
    std::this_thread::sleep_for(std::chrono::duration<double>(std::exchange(stall_s_, 0.0)));
  }
  record_sync(k, false);
  sync_->sync_bucket(k);
  record_sync(k, true);
}

void Towers::grad_sync() {
  if (sync_->bytes() == 0) {
    for (auto& t : towers_) record_step(*t, &Replica::released);
    return;
  }
  overlapped_ = launched_;
  for (int i = 0; i < size(); ++i) mark_ready(i);  // backward is all launched by now
  if (sync_->enqueued()) {
    while (launched_ < buckets_.size()) launch(launched_);
    for (auto& t : towers_) t->compute_after_comm();  // the next phase on each tower waits for its share of the sync
  } else if (launched_ > 0) {                         // backward(true) started some: hand over the rest, wait for all
    while (launched_ < buckets_.size()) launch(launched_);
    comm_->wait();
  } else {
    for (std::size_t k = 0; k < buckets_.size(); ++k) sync_on_host(k);
  }
  launched_ = 0;
  for (auto& t : towers_) {
    t->recorded = 0;
    record_step(*t, &Replica::released);
  }
}

void Towers::update() { sync_->update(); }

void Towers::step() {
  forward_train();
  backward(true);
  grad_sync();
  update();
}
std::string Towers::sync_name() const { return sync_->name(); }
std::size_t Towers::sync_bytes() const { return sync_->bytes(); }
double Towers::bus_factor() const { return sync_->bus_factor(); }
std::vector<SyncLevel> Towers::sync_levels() const { return sync_->levels(); }
void Towers::set_level_tracing(bool on) { sync_->trace_levels(on); }
std::vector<LevelSpan> Towers::take_level_spans() { return sync_->take_level_spans(); }
bool Towers::asynchronous() const { return sync_->asynchronous(); }
AsyncStats Towers::async_stats() const { return sync_->async_stats(); }

float Towers::loss(int tower) const { return graph(tower).loss(stream(tower)); }

}  // namespace stepbench
