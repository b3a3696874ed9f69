#include "comm/comm_thread.hpp"

#include <omp.h>

#include <chrono>
#include <future>
#include <thread>

#include "comm/collective.hpp"

namespace stepbench {

void CommThread::loop() {
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

bool run_within(std::function<void()> fn, double seconds) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> f = done->get_future();
  std::thread([fn = std::move(fn), done] {
    try {
      fn();
    } catch (...) {
    }
    done->set_value();
  }).detach();
  return f.wait_for(std::chrono::duration<double>(seconds)) == std::future_status::ready;
}

}  // namespace stepbench
