#include "bench/progress.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace stepbench {

Progress::Progress(bool on, std::FILE* out) : on_(on), out_(out), start_(std::chrono::steady_clock::now()) {
  if (on_) thread_ = std::thread([this] { loop(); });
}

Progress::~Progress() {
  if (!on_) return;
  {
    std::lock_guard<std::mutex> l(m_);
    done_ = true;
  }
  cv_.notify_all();
  thread_.join();
  clear();
}

void Progress::set(std::string what) {
  if (!on_) return;
  std::lock_guard<std::mutex> l(m_);
  what_ = std::move(what);
  draw_locked();
}

void Progress::set_total(int n) {
  std::lock_guard<std::mutex> l(m_);
  total_ = n;
}

void Progress::repetition(const std::string& what, long long iterations, int repetitions) {
  if (!on_) return;
  std::lock_guard<std::mutex> l(m_);
  if (what != last_name_) {  // a new benchmark: its first repetition
    rep_ = 1;
    ++index_;
  } else if (iterations == last_iterations_) {  // the count settled: the next repetition
    ++rep_;
  }
  last_name_ = what;
  last_iterations_ = iterations;
  const std::string k = total_ > 0 ? fmt::format("[{}/{}] ", index_, total_) : "";
  what_ = fmt::format("{}{} · repetition {}/{}", k, what, std::min(rep_, repetitions), repetitions);
  draw_locked();
}

void Progress::clear() {
  if (!on_) return;
  std::lock_guard<std::mutex> l(m_);
  if (shown_) {
    std::fputs("\r\033[K", out_);
    std::fflush(out_);
  }
  shown_ = false;
  what_.clear();
}

void Progress::draw_locked() {
  if (what_.empty()) return;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::fputs(fmt::format("\r\033[K  {} · {:.0f} s", what_, s).c_str(), out_);
  std::fflush(out_);
  shown_ = true;
}

void Progress::loop() {
  std::unique_lock<std::mutex> l(m_);
  while (!done_) {
    cv_.wait_for(l, std::chrono::milliseconds(200));
    if (!done_) draw_locked();
  }
}

}  // namespace stepbench
