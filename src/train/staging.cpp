// Host batches staged to the device, double-buffered (Towers::enable_staging, stage, flip).
#include "tensor/error.hpp"
#include "train/sync.hpp"
#include "train/tower_parts.hpp"

namespace stepbench {

std::size_t Towers::input_bytes() const { return graph(0).input_tensor().desc.bytes(); }
std::size_t Towers::input_floats() const { return static_cast<std::size_t>(graph(0).input_tensor().desc.numel()); }

void Towers::enable_staging() {
  if (!staging_.empty()) return;
  for (int i = 0; i < size(); ++i) {
    Backend& be = backend(i);
    auto st = std::make_unique<Staging>();
    for (int k = 0; k < 2; ++k) {
      st->images[k] = Buffer(be, input_floats() * sizeof(float));
      if (opt_.dtype() != DType::f32) st->narrow[k] = Buffer(be, input_bytes());
      st->labels[k] = Buffer(be, sizeof(std::int32_t) * static_cast<std::size_t>(opt_.batch_per_tower));
      st->copied[k] = be.create_sync_event();
      st->consumed[k] = be.create_sync_event();
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
  if (st.begin) be.record(*st.begin, *st.copy);
  be.copy(*st.copy, st.images[spare].get(), images, input_floats() * sizeof(float));
  if (opt_.dtype() != DType::f32)
    be.cast(*st.copy, st.images[spare].get(), DType::f32, st.narrow[spare].get(), opt_.dtype(), input_floats());
  be.copy(*st.copy, st.labels[spare].get(), labels, st.labels[spare].bytes());
  if (st.end) be.record(*st.end, *st.copy), st.timed = true;
  be.record(*st.copied[spare], *st.copy);
  sync_->wait_for(be, *st.copy);  // the host batch may be reused once this returns (the copy waited for the step)
}

void Towers::stage_on_device(int tower, const std::function<void(Stream&, const Tensor&)>& fill,
                             const std::int32_t* labels) {
  SB_CHECK(!staging_.empty(), "enable_staging() first");
  auto& st = *staging_.at(static_cast<std::size_t>(tower));
  Backend& be = backend(tower);
  const int spare = st.cur == 0 ? 1 : 0;
  if (st.consumed_recorded[spare]) be.wait(*st.copy, *st.consumed[spare]);
  if (st.begin) be.record(*st.begin, *st.copy);
  const TensorDesc in = graph(tower).input_tensor().desc;
  fill(*st.copy, Tensor{st.images[spare].get(), TensorDesc::dense(in.shape, DType::f32, in.layout)});
  if (opt_.dtype() != DType::f32)
    be.cast(*st.copy, st.images[spare].get(), DType::f32, st.narrow[spare].get(), opt_.dtype(), input_floats());
  be.copy(*st.copy, st.labels[spare].get(), labels, st.labels[spare].bytes());
  if (st.end) be.record(*st.end, *st.copy), st.timed = true;
  be.record(*st.copied[spare], *st.copy);
  sync_->wait_for(be, *st.copy);
}

void Towers::set_staging_timing(bool on) {
  for (int i = 0; i < static_cast<int>(staging_.size()); ++i) {
    auto& st = *staging_[static_cast<std::size_t>(i)];
    st.begin = on ? backend(i).create_event() : nullptr;
    st.end = on ? backend(i).create_event() : nullptr;
    st.timed = false;
  }
}

std::optional<std::pair<double, double>> Towers::staging_span(int tower, Event& ref) {
  if (static_cast<std::size_t>(tower) >= staging_.size()) return std::nullopt;
  auto& st = *staging_[static_cast<std::size_t>(tower)];
  if (!st.timed) return std::nullopt;
  st.timed = false;
  Backend& be = backend(tower);
  return std::make_pair(be.elapsed_ms(ref, *st.begin), be.elapsed_ms(ref, *st.end));
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
    graph(i).bind_input(opt_.dtype() != DType::f32 ? st.narrow[spare].get() : st.images[spare].get(),
                        st.labels[spare].as<std::int32_t>());
    st.cur = spare;
  }
}

}  // namespace stepbench
