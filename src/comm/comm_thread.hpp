// A thread that runs gradient-bucket syncs in the order they are handed over, so that the host
// collectives (host memory, MPI) overlap backward on the calling thread.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace stepbench {

// Runs bucket syncs in order on its own thread; wait() returns when all handed over are done and
// rethrows the first error of the work.
class CommThread {
 public:
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

  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

 private:
  void loop();
  std::function<void(std::size_t)> work_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::size_t> q_;
  bool busy_ = false, stop_ = false;
  std::exception_ptr err_;
  std::thread th_;  // last: starts after the members it uses
};

}  // namespace stepbench
