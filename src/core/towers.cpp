#include "stepbench/towers.hpp"

#include <fmt/format.h>
#include <omp.h>

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
  std::unique_ptr<Stream> comm;               // the gradient sync's stream
  std::vector<std::unique_ptr<Event>> ready;  // per bucket: backward has produced it (compute stream)
  std::unique_ptr<Event> computed, synced;    // compute -> comm and comm -> compute ordering
  std::size_t recorded = 0;                   // ready events recorded this step
};

// The parameter server in host memory (ps_on_host): the variables, their summed gradients and the
// optimizer state, updated by the cpu backend; pinned where the towers' backend pins.
struct Towers::HostServer {
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  HostBuffer params, grads;
  std::vector<HostBuffer> tmp;  // per tower but the first: one bucket of its gradients
  std::unique_ptr<OptimizerState> opt;
};

Towers::Towers(const TowerOptions& o) : opt_(o) {
  if (o.towers < 1) throw UsageError(fmt::format("--gpus {} must be at least 1", o.towers));
  int local_rank = 0, local_size = 1;
  if (o.use_process_group) {
    const ProcessGroup& pg = process_group();
    rank_ = pg.rank;
    processes_ = pg.size;
    local_rank = pg.local_rank;
    local_size = pg.local_size;
  }
  if (o.backend == "cuda") {
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
  if (o.dtype == DType::f16 && o.variable_update == VariableUpdate::parameter_server)
    throw UnsupportedError("--precision fp16 with parameter_server: the dynamic loss scale lives on each tower and "
                           "only the server updates, so the towers' scales would drift apart (not implemented); use "
                           "--variable-update replicated, or --precision bf16, which needs no loss scaling");
  if (o.use_process_group) set_sync_timeout(o.sync_timeout_s);
  for (int i = 0; i < o.towers; ++i) {
    auto t = std::make_unique<Tower>();
    t->be = make_backend(o.backend, local_rank * o.towers + i);  // the GPUs of this node, split by process
    if (o.tf32) t->be->set_tensor_math(true);
    t->be->set_workspace_limit(o.workspace_bytes);
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
  } else if (o.backend == "cpu") {
    coll_ = std::make_unique<HostCollective>(*towers_[0]->be, o.towers, processes_);
  } else if (sync_bytes() > 0) {
    coll_ = make_nccl_collective(bes, comm_streams, rank_, processes_);
  }
  if (const char* f = std::getenv("STEPBENCH_FAULT_SYNC_STALL")) {  // "<rank>:<seconds>", tests only
    int r = -1;
    double sec = 0;
    if (std::sscanf(f, "%d:%lf", &r, &sec) == 2 && r == rank_) stall_s_ = sec;
  }
  if (opt_.overlap && sync_bytes() > 0 && !async() && (processes_ == 1 || process_group().threads_ok))
    comm_ = std::make_unique<CommThread>([this](std::size_t k) { sync_bucket(k); });
}

struct Towers::Staging {
  Buffer images[2], labels[2];
  Buffer narrow[2];  // bf16/fp16 models: the fp32 images cast on the copy stream, as tf_cnn_benchmarks does
  std::unique_ptr<Stream> copy;
  std::unique_ptr<Event> copied[2], consumed[2];
  bool consumed_recorded[2] = {false, false};
  int cur = -1;  // the buffer steps read; -1: the graph's own
};

Towers::~Towers() = default;

std::size_t Towers::input_bytes() const { return graph(0).input_tensor().desc.bytes(); }
std::size_t Towers::input_floats() const { return static_cast<std::size_t>(graph(0).input_tensor().desc.numel()); }

void Towers::enable_staging() {
  if (!staging_.empty()) return;
  for (int i = 0; i < size(); ++i) {
    Backend& be = backend(i);
    auto st = std::make_unique<Staging>();
    for (int k = 0; k < 2; ++k) {
      st->images[k] = Buffer(be, input_floats() * sizeof(float));
      if (opt_.dtype != DType::f32) st->narrow[k] = Buffer(be, input_bytes());
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
  be.copy(*st.copy, st.images[spare].get(), images, input_floats() * sizeof(float));
  if (opt_.dtype != DType::f32)
    be.cast(*st.copy, st.images[spare].get(), DType::f32, st.narrow[spare].get(), opt_.dtype, input_floats());
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
    graph(i).bind_input(opt_.dtype != DType::f32 ? st.narrow[spare].get() : st.images[spare].get(),
                        st.labels[spare].as<std::int32_t>());
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
  if (opt_.variable_update == VariableUpdate::replicated) coll_->allreduce_average(grads_, off, n);
  else coll_->reduce_average(grads_, off, n);
}

void Towers::backward(bool start_sync) {
  if (!start_sync || sync_bytes() == 0 || !(async() || comm_)) {
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
    if (processes_ > 1) reduce_sum_to_root(sum, n);
    cpu.scale(cs, sum, 1.0f / static_cast<float>(global_size()), n);
    return;
  }
  if (opt_.variable_update == VariableUpdate::replicated) coll_->allreduce_average(grads_, off, n);
  else if (opt_.variable_update == VariableUpdate::parameter_server) coll_->reduce_average(grads_, off, n);
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
    if (processes_ > 1) broadcast_from_root(p, total);
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
void Towers::capture(bool step) {
  if (opt_.backend != "cuda") throw UsageError("--cuda-graph needs the cuda backend; drop it or use --backend cuda");
  if (size() != 1)
    throw UsageError(fmt::format("--cuda-graph captures one GPU's stream: use one GPU per process (--gpus 1, and "
                                 "mpirun -np {} for {} GPUs)",
                                 size(), size()));
  if (server_)
    throw UsageError("--cuda-graph cannot capture the host parameter server's CPU work; use --ps-device device");
  if (!staging_.empty())
    throw UsageError("--cuda-graph replays the synthetic batch on the device; use --data synthetic with it");
  Tower& t = *towers_[0];
  auto& s = t.be->default_stream();
  synchronize();
  t.be->begin_capture(s);
  try {
    if (step) this->step();
    else forward_inference();
  } catch (...) {
    try {
      t.be->end_capture(s);  // leave the stream usable; the first error is the one to report
    } catch (...) {
    }
    throw;
  }
  (step ? graph_step_ : graph_forward_) = t.be->end_capture(s);
}

void Towers::replay(bool step) {
  auto& g = step ? graph_step_ : graph_forward_;
  SB_CHECK(g != nullptr, "capture() before replay()");
  g->replay(stream(0));
}

void Towers::synchronize() const {
  if (!coll_ || !coll_->asynchronous()) {
    for (auto& t : towers_) t->be->synchronize(t->be->default_stream());
    return;
  }
  // Poll, as nccl-tests does: a hung collective must end the run, not block it in the driver.
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& t : towers_) {
    while (!t->be->query(t->be->default_stream())) {
      coll_->check();
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (opt_.sync_timeout_s > 0 && waited > opt_.sync_timeout_s) {
        coll_->abort();
        throw SyncError(fmt::format(
            "the GPUs' work with the gradient sync ({}) did not complete within {:g} s on process {} of {}: a peer "
            "failed or stalled. If the step is legitimately that slow, raise --sync-timeout-s (0 waits forever)",
            coll_->name(), opt_.sync_timeout_s, rank_, processes_));
      }
      std::this_thread::yield();
    }
  }
  coll_->check();
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
  t_.synchronize();
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

#ifndef STEPBENCH_HAVE_CUDA
namespace stepbench {
std::unique_ptr<Collective> make_nccl_collective(const std::vector<Backend*>&, const std::vector<Stream*>&, int, int) {
  throw UnsupportedError("NCCL needs the cuda backend: stepbench was built without CUDA (configure with -DSTEPBENCH_CUDA=ON)");
}
}  // namespace stepbench
#endif
