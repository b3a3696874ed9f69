// The step's timeline per tower (Towers::set_step_timing, timeline) and the slowed tower of
// --slow-tower (set_delay).
#include <algorithm>

#include "tensor/error.hpp"
#include "train/sync.hpp"
#include "train/tower_parts.hpp"

namespace stepbench {

void Towers::set_step_timing(bool on) {
  step_timing_ = false;
  if (!on) return;
  for (auto& t : towers_)
    for (auto* e : {&t->step_begin, &t->forward_end, &t->backward_begin, &t->backward_end, &t->released})
      *e = t->be->create_event();
  if (!sync_timing_) set_sync_timing(true);  // the buckets' ready and sync events
  step_timing_ = true;                       // once every event exists
}

void Towers::record_step(Replica& t, std::unique_ptr<Event> Replica::*e) {
  if (step_timing_) t.be->record(*(t.*e), t.compute());
}

Towers::Timeline Towers::timeline(int tower) const {
  SB_CHECK(step_timing_, "timeline() without set_step_timing(true)");
  Replica& t = *towers_.at(static_cast<std::size_t>(tower));
  Replica& first = *towers_[0];
  // the process's reference: tower 0's start where both are on one clock (one device, or the host)
  Event& ref = t.be->device() == first.be->device() ? *first.step_begin : *t.step_begin;
  Backend& be = *t.be;
  Timeline l;
  l.begin_ms = be.elapsed_ms(ref, *t.step_begin);
  l.forward_ms = be.elapsed_ms(*t.step_begin, *t.forward_end);
  l.backward_ms = be.elapsed_ms(*t.backward_begin, *t.backward_end);
  l.released_ms = be.elapsed_ms(ref, *t.released);
  if (sync_->bytes() > 0) {
    sync_->wait_for(be, *t.comm);  // its last sync events may come after the compute stream's
    // towers of one process computing on the host's cores (device -1) one after another: the host
    // collective runs during the last one's backward (on the communication thread, or inside it), so
    // that overlap is the sync's, not this tower's compute (else the last CPU tower always looks
    // slowest). One tower per process: its sync mostly waits for the others, and is not subtracted.
    const bool inline_sync = !sync_->enqueued() && be.device() < 0 && towers_.size() > 1;
    const double b0 = be.elapsed_ms(ref, *t.backward_begin), b1 = b0 + l.backward_ms;
    for (std::size_t k = 0; k < buckets_.size(); ++k) {
      l.ready_ms.push_back(be.elapsed_ms(ref, *t.timed_ready[k]));
      l.synced_ms.push_back(be.elapsed_ms(ref, *t.sync_end[k]));
      if (inline_sync) {
        const double s0 = be.elapsed_ms(ref, *t.sync_begin[k]);
        l.backward_ms -= std::max(0.0, std::min(b1, l.synced_ms.back()) - std::max(b0, s0));
      }
    }
  }
  return l;
}

void Towers::set_delay(int tower, double ms) {
  SB_CHECK(ms >= 0, "a delay is not negative");
  towers_.at(static_cast<std::size_t>(tower))->delay_ms = ms;
}

}  // namespace stepbench
