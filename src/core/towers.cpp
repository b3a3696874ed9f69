#include "stepbench/towers.hpp"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <random>
#include <thread>

#include "stepbench/error.hpp"
#include "stepbench/process_group.hpp"
#include "stepbench/trainer.hpp"

namespace stepbench {

std::string_view to_string(VariableUpdate v) {
  switch (v) {
    case VariableUpdate::replicated: return "replicated";
    case VariableUpdate::parameter_server: return "parameter_server";
    case VariableUpdate::independent: return "independent";
  }
  return "?";
}

VariableUpdate parse_variable_update(std::string_view s) {
  if (s == "replicated") return VariableUpdate::replicated;
  if (s == "parameter_server") return VariableUpdate::parameter_server;
  if (s == "independent") return VariableUpdate::independent;
  throw UsageError(
      fmt::format("--variable-update '{}' is not one of: replicated, parameter_server, independent", s));
}

namespace {

TensorDesc flat(std::size_t count) {
  return TensorDesc::dense(Shape{1, static_cast<std::int64_t>(count), 1, 1}, DType::f32, Layout::nchw);
}

// Towers whose memory the host can address (the cpu backend): sums on tower 0's backend, then, under
// mpirun, across the processes with MPI on tower 0's buffer.
class HostCollective final : public Collective {
 public:
  HostCollective(Backend& be, int local, int processes) : be_(be), local_(local), procs_(processes) {}
  std::string name() const override {
    return procs_ > 1 ? fmt::format("MPI over {} processes + host memory", procs_) : "host memory";
  }
  void allreduce_average(const std::vector<float*>& bufs, std::size_t off, std::size_t count) override {
    local_sum(bufs, off, count);
    if (procs_ > 1) allreduce_sum(bufs[0] + off, count);
    be_.scale(be_.default_stream(), bufs[0] + off, 1.0f / static_cast<float>(local_ * procs_), count);
    local_copy(bufs, off, count);
  }
  void reduce_average(const std::vector<float*>& bufs, std::size_t off, std::size_t count) override {
    local_sum(bufs, off, count);
    if (procs_ > 1) reduce_sum_to_root(bufs[0] + off, count);  // the average is only meaningful on process 0
    be_.scale(be_.default_stream(), bufs[0] + off, 1.0f / static_cast<float>(local_ * procs_), count);
  }
  void broadcast(const std::vector<float*>& bufs, std::size_t off, std::size_t count) override {
    if (procs_ > 1) broadcast_from_root(bufs[0] + off, count);
    local_copy(bufs, off, count);
  }

 private:
  void local_sum(const std::vector<float*>& bufs, std::size_t off, std::size_t count) {
    auto& s = be_.default_stream();
    const Tensor dst{bufs[0] + off, flat(count)};
    for (std::size_t i = 1; i < bufs.size(); ++i) be_.add(s, Tensor{bufs[i] + off, flat(count)}, dst, 1.0f);
    be_.synchronize(s);
  }
  void local_copy(const std::vector<float*>& bufs, std::size_t off, std::size_t count) {
    auto& s = be_.default_stream();
    for (std::size_t i = 1; i < bufs.size(); ++i) be_.copy(s, bufs[i] + off, bufs[0] + off, count * sizeof(float));
  }
  Backend& be_;
  int local_, procs_;
};

}  // namespace

// Runs bucket syncs in order on its own thread; wait() returns when all handed over are done.
struct Towers::CommThread {
  explicit CommThread(std::function<void(std::size_t)> work) : work_(std::move(work)), th_([this] { loop(); }) {}
  ~CommThread() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    th_.join();
  }
  void push(std::size_t k) {
    {
      std::lock_guard<std::mutex> l(mu_);
      q_.push_back(k);
    }
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return q_.empty() && !busy_; });
    if (err_) std::rethrow_exception(std::exchange(err_, nullptr));
  }

 private:
  void loop() {
    // One thread for the sums on the CPU: an OpenMP team of its own would compete with backward's
    // for the same cores (measured: 2 CPU towers of Inception-v3, step 9.3 -> 11.3 s).
    omp_set_num_threads(1);
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      cv_.wait(l, [&] { return stop_ || !q_.empty(); });
      if (q_.empty()) return;  // stop
      const std::size_t k = q_.front();
      q_.pop_front();
      busy_ = true;
      l.unlock();
      try {
        work_(k);
      } catch (...) {
        l.lock();
        err_ = std::current_exception();
        l.unlock();
      }
      l.lock();
      busy_ = false;
      cv_.notify_all();
    }
  }
  std::function<void(std::size_t)> work_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::size_t> q_;
  bool busy_ = false, stop_ = false;
  std::exception_ptr err_;
  std::thread th_;  // last: starts after the members it uses
};

struct Towers::Tower {
  std::unique_ptr<Backend> be;
  std::unique_ptr<Graph> g;
  std::unique_ptr<Trainer> tr;
};

Towers::Towers(const TowerOptions& o) : opt_(o) {
  if (o.towers < 1) throw UsageError(fmt::format("--gpus {} must be at least 1", o.towers));
  if (o.use_process_group) {
    rank_ = process_group().rank;
    processes_ = process_group().size;
  }
  if (o.backend == "cuda") {
    const int visible = cuda_device_count();
    if (o.towers > visible)
      throw UsageError(fmt::format("--gpus {} but only {} GPU{} visible; use --gpus {} or fewer", o.towers, visible,
                                   visible == 1 ? " is" : "s are", visible));
  }
  if (o.backend != "cpu" && (o.towers > 1 || processes_ > 1))  // NCCL is not written yet
    throw UnsupportedError(fmt::format("gradient sync between GPUs (NCCL) is not implemented yet: use one GPU "
                                       "(--gpus 1, no mpirun), or CPU towers (--backend cpu)"));
  for (int i = 0; i < o.towers; ++i) {
    auto t = std::make_unique<Tower>();
    t->be = make_backend(o.backend, i);
    if (o.tf32) t->be->set_tensor_math(true);
    const int global = rank_ * o.towers + i;  // each replica draws its own dropout masks
    t->g = std::make_unique<Graph>(*t->be, GraphConfig{o.batch_per_tower, o.layout, o.dtype, o.seed + 977 * global});
    info_ = build_model(*t->g, o.model, o.model_options);
    t->g->plan();
    init_parameters(*t->g, o.seed);  // every replica starts from the same variables
    t->tr = std::make_unique<Trainer>(*t->g, o.optimizer);
    grads_.push_back(t->g->grad_arena());
    params_.push_back(t->g->param_arena());
    towers_.push_back(std::move(t));
  }
  coll_ = std::make_unique<HostCollective>(*towers_[0]->be, o.towers, processes_);
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
  const std::size_t first = std::max<std::size_t>(std::min(opt_.first_bucket_bytes, opt_.bucket_bytes) / sizeof(float), 1);
  for (std::size_t k = 1; k < bounds.size(); ++k) {
    if (bounds[k] - start > (buckets_.empty() ? first : per) && bounds[k - 1] > start) {
      buckets_.emplace_back(start, bounds[k - 1] - start);
      start = bounds[k - 1];
    }
  }
  if (total > start) buckets_.emplace_back(start, total - start);
  if (opt_.overlap && sync_bytes() > 0 && (processes_ == 1 || process_group().threads_ok))
    comm_ = std::make_unique<CommThread>([this](std::size_t k) { sync_bucket(k); });
}

struct Towers::Staging {
  Buffer images[2], labels[2];
  std::unique_ptr<Stream> copy;
  std::unique_ptr<Event> copied[2], consumed[2];
  bool consumed_recorded[2] = {false, false};
  int cur = -1;  // the buffer steps read; -1: the graph's own
};

Towers::~Towers() = default;

std::size_t Towers::input_bytes() const { return graph(0).input_tensor().desc.bytes(); }

void Towers::enable_staging() {
  if (!staging_.empty()) return;
  if (opt_.dtype != DType::f32)
    throw UnsupportedError(fmt::format("host-staged input in {} is not implemented yet; use --data synthetic",
                                       to_string(opt_.dtype)));
  for (int i = 0; i < size(); ++i) {
    Backend& be = backend(i);
    auto st = std::make_unique<Staging>();
    for (int k = 0; k < 2; ++k) {
      st->images[k] = Buffer(be, input_bytes());
      st->labels[k] = Buffer(be, sizeof(std::int32_t) * static_cast<std::size_t>(opt_.batch_per_tower));
      st->copied[k] = be.create_event();
      st->consumed[k] = be.create_event();
    }
    st->copy = be.create_stream();
    staging_.push_back(std::move(st));
  }
}

void Towers::stage(int tower, const float* images, const std::int32_t* labels) {
  SB_CHECK(!staging_.empty(), "enable_staging() first");
  auto& st = *staging_.at(static_cast<std::size_t>(tower));
  Backend& be = backend(tower);
  const int spare = st.cur == 0 ? 1 : 0;
  if (st.consumed_recorded[spare]) be.wait(*st.copy, *st.consumed[spare]);
  be.copy(*st.copy, st.images[spare].get(), images, input_bytes());
  be.copy(*st.copy, st.labels[spare].get(), labels, st.labels[spare].bytes());
  be.record(*st.copied[spare], *st.copy);
  be.synchronize(*st.copy);  // the host batch may be reused once this returns
}

void Towers::flip() {
  for (int i = 0; i < size(); ++i) {
    auto& st = *staging_.at(static_cast<std::size_t>(i));
    Backend& be = backend(i);
    const int spare = st.cur == 0 ? 1 : 0;
    if (st.cur >= 0) {
      be.record(*st.consumed[st.cur], stream(i));  // after every step that read it
      st.consumed_recorded[st.cur] = true;
    }
    be.wait(stream(i), *st.copied[spare]);
    graph(i).bind_input(st.images[spare].get(), st.labels[spare].as<std::int32_t>());
    st.cur = spare;
  }
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
  for (auto& t : towers_) t->tr->forward(t->be->default_stream());
}
void Towers::backward(bool start_sync) {
  if (!start_sync || !comm_) {
    for (auto& t : towers_) t->tr->backward(t->be->default_stream());
    return;
  }
  // A bucket is ready when every tower has produced it. The towers of one process run one after
  // another, so that is when the last one's backward passes it.
  for (std::size_t i = 0; i + 1 < towers_.size(); ++i) towers_[i]->tr->backward(towers_[i]->be->default_stream());
  Tower& last = *towers_.back();
  last.g->backward(last.be->default_stream(), [this](std::size_t ready) {
    while (launched_ < buckets_.size() && buckets_[launched_].first + buckets_[launched_].second <= ready)
      comm_->push(launched_++);
  });
}
void Towers::sync_bucket(std::size_t k) {
  const auto [off, n] = buckets_[k];
  if (opt_.variable_update == VariableUpdate::replicated) coll_->allreduce_average(grads_, off, n);
  else if (opt_.variable_update == VariableUpdate::parameter_server) coll_->reduce_average(grads_, off, n);
}
void Towers::grad_sync() {
  if (sync_bytes() == 0) return;
  overlapped_ = launched_;
  if (launched_ > 0) {  // backward(true) started some: hand over the rest, wait for all
    while (launched_ < buckets_.size()) comm_->push(launched_++);
    comm_->wait();
    launched_ = 0;
    return;
  }
  for (std::size_t k = 0; k < buckets_.size(); ++k) sync_bucket(k);
}
void Towers::update() {
  if (opt_.variable_update == VariableUpdate::parameter_server && global_size() > 1) {
    // the server is tower 0 of process 0: it alone applies the update, then everyone gets the result
    if (rank_ == 0) towers_[0]->tr->update(towers_[0]->be->default_stream());
    towers_[0]->be->synchronize(towers_[0]->be->default_stream());
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
void Towers::synchronize() {
  for (auto& t : towers_) t->be->synchronize(t->be->default_stream());
}

std::size_t Towers::sync_bytes() const {
  if (global_size() < 2 || opt_.variable_update == VariableUpdate::independent) return 0;
  return towers_[0]->g->param_arena_floats() * sizeof(float);
}

double Towers::bus_factor() const {
  if (sync_bytes() == 0) return 0.0;
  const double n = global_size();
  return opt_.variable_update == VariableUpdate::replicated ? 2.0 * (n - 1) / n : 1.0;
}

float Towers::loss(int tower) const { return graph(tower).loss(stream(tower)); }

// ---- timing --------------------------------------------------------------------------------------
RegionTimer::RegionTimer(const Towers& t, int points) : t_(t) {
  SB_CHECK(points >= 2, "a region has a start and a stop");
  ev_.resize(static_cast<std::size_t>(t.size()));
  for (int i = 0; i < t.size(); ++i)
    for (int p = 0; p < points; ++p) ev_[static_cast<std::size_t>(i)].push_back(t.backend(i).create_event());
}
void RegionTimer::start() {
  h0_ = std::chrono::steady_clock::now();
  mark(0);
}
void RegionTimer::mark(int point) {
  for (int i = 0; i < t_.size(); ++i)
    t_.backend(i).record(*ev_[static_cast<std::size_t>(i)].at(static_cast<std::size_t>(point)), t_.stream(i));
}
void RegionTimer::stop() {
  mark(static_cast<int>(ev_[0].size()) - 1);
  for (int i = 0; i < t_.size(); ++i) t_.backend(i).synchronize(t_.stream(i));
  h1_ = std::chrono::steady_clock::now();
}
double RegionTimer::device_ms(int from, int to) const {
  double ms = 0;
  for (int i = 0; i < t_.size(); ++i) {
    auto& ev = ev_[static_cast<std::size_t>(i)];
    ms = std::max(ms, t_.backend(i).elapsed_ms(*ev.at(static_cast<std::size_t>(from)),
                                               *ev.at(static_cast<std::size_t>(to))));
  }
  return ms;
}
double RegionTimer::host_ms() const { return std::chrono::duration<double, std::milli>(h1_ - h0_).count(); }

}  // namespace stepbench
