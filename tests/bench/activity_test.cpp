// The device's activity records in the layer times and the trace (bench/activity.cpp,
// bench/layer_report.cpp): real probed steps of CPU towers, into which records are laid as CUPTI
// would deliver them on a GPU (kernels inside their pieces, a gap, work overlapping on one stream,
// work no piece launched), so that the arithmetic and the tracks are checked without a GPU. The
// CUPTI side itself runs in CudaActivity.* where a GPU is visible.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "bench/layer_times.hpp"
#include "train/towers.hpp"

namespace stepbench {
namespace {

TowerOptions tiny_towers() {
  TowerOptions o;
  o.backend = BackendKind::cpu;
  o.batch_per_tower = 4;
  o.model = ModelKind::tiny;
  o.model_options.image_size = 24;
  o.model_options.num_classes = 10;
  return o;
}

// Per probed step, in its first leaf pieces: one kernel in the first half of each of them and, in
// the first piece, a second kernel overlapping the first on the same stream; after the last piece
// a kernel no piece launched (stream 9). The records are laid on the pieces' own times.
constexpr double kGap = 50;     // ms before the untagged kernel: longer than any gap the pieces leave
constexpr double kLast = 1e-3;  // ms, its duration: shorter than anything between two probed steps

struct Laid {
  double busy = 0, window = 0, idle = 0;
  int count = 0;
  std::string first_piece;
};
Laid lay(ProbedStep& st, const Towers& t) {
  Laid l;
  std::vector<const ProbeSpan*> leaves;
  for (const auto& s : st.towers[0])
    if (s.layer >= -1) leaves.push_back(&s);
  std::vector<KernelSpan> k;
  for (std::size_t i = 0; i < 3 && i < leaves.size(); ++i) {
    const ProbeSpan& p = *leaves[i];
    const double mid = p.dev0 + 0.5 * (p.dev1 - p.dev0);
    k.push_back({"kernel_" + std::to_string(i), p.dev0, mid, p.layer, p.part, p.phase, 7});
    if (i == 0) k.push_back({"overlapping", p.dev0 + 0.25 * (p.dev1 - p.dev0), p.dev1, p.layer, p.part, p.phase, 7});
  }
  const double end = k.back().t1;  // kernel_2's
  k.push_back({"nccl_untagged", end + kGap, end + kGap + kLast, KernelSpan::kUntagged, "", "", 9});
  st.kernels = {k};
  // busy: piece 0 fully ([dev0, mid] and [q, dev1] overlap), half of pieces 1 and 2, and the last
  const ProbeSpan &a = *leaves[0], &b = *leaves[1], &c = *leaves[2];
  l.busy = (a.dev1 - a.dev0) + 0.5 * (b.dev1 - b.dev0) + 0.5 * (c.dev1 - c.dev0) + kLast;
  l.window = end + kGap + kLast - a.dev0;
  l.idle = l.window - l.busy;
  l.count = static_cast<int>(k.size());
  l.first_piece = t.graph(0).layers().at(static_cast<std::size_t>(a.layer)).label + "/" + a.part;
  return l;
}

TEST(Activity, BusyIdleAndEachPiecesKernels) {
  Towers t(tiny_towers());
  t.set_synthetic_batch(1);
  std::string note;
  auto steps = run_probed_steps(t, 3, true, &note);
  EXPECT_NE(note.find("no device activity records"), std::string::npos) << note;  // the cpu backend says why
  for (const auto& st : steps) EXPECT_TRUE(st.kernels.empty() || st.kernels[0].empty());
  std::vector<Laid> laid;
  for (auto& st : steps) laid.push_back(lay(st, t));
  LayerTimes lt = summarize_layer_times(steps, t, 0);
  summarize_activity(lt, steps, t);
  std::vector<double> busy, idle, window;
  for (const auto& l : laid) busy.push_back(l.busy), idle.push_back(l.idle), window.push_back(l.window);
  std::sort(busy.begin(), busy.end());
  std::sort(idle.begin(), idle.end());
  std::sort(window.begin(), window.end());
  EXPECT_EQ(lt.kernels, laid[0].count);
  EXPECT_NEAR(lt.busy_ms, busy[1], 1e-9);
  EXPECT_NEAR(lt.window_ms, window[1], 1e-9);
  EXPECT_NEAR(lt.gap_ms, idle[1], 1e-9);
  EXPECT_GE(lt.gaps, 1);
  ASSERT_FALSE(lt.largest_gaps.empty());
  EXPECT_NEAR(lt.largest_gaps[0].ms, kGap, 1e-9);  // before the untagged kernel, in every step
  EXPECT_EQ(lt.largest_gaps[0].before.rfind("(no piece: nccl_untagged", 0), 0u) << lt.largest_gaps[0].before;
  // the first piece's row holds its two kernels, the larger first, launched once each
  ASSERT_EQ(lt.row_kernels.size(), lt.rows.size());
  std::size_t row = lt.rows.size();
  for (std::size_t r = 0; r < lt.rows.size(); ++r)
    if (lt.rows[r].label + "/" + lt.rows[r].part == laid[0].first_piece && lt.rows[r].pass == "forward") row = r;
  ASSERT_LT(row, lt.rows.size()) << laid[0].first_piece;
  ASSERT_EQ(lt.row_kernels[row].size(), 2u);
  EXPECT_EQ(lt.row_kernels[row][0].name, "overlapping");  // 3/4 of the piece against 1/2
  EXPECT_EQ(lt.row_kernels[row][1].name, "kernel_0");
  EXPECT_EQ(lt.row_kernels[row][0].count, 1);
  const auto j = layer_times_json(lt);
  EXPECT_EQ(j["device_activity"]["kernels_per_step"], laid[0].count);
  EXPECT_EQ(j["pieces"][row]["kernels"].size(), 2u);
}

TEST(Activity, TraceTracksPerStreamWithALaneForOverlaps) {
  Towers t(tiny_towers());
  t.set_synthetic_batch(1);
  auto steps = run_probed_steps(t, 2);
  std::size_t records = 0;
  for (auto& st : steps) records += static_cast<std::size_t>(lay(st, t).count);
  const auto j = trace_json(steps, t, {{"kernels", "test"}});
  struct Span {
    double b, e;
    std::string name, cat;
  };
  std::map<int, std::string> names;
  std::map<int, std::vector<Span>> tracks;  // the kernel tracks (tid >= 10)
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") names[e["tid"].get<int>()] = e["args"]["name"];
    if (e["ph"] == "X" && e["tid"].get<int>() >= 10) {
      const double b = e["ts"].get<double>();
      tracks[e["tid"].get<int>()].push_back({b, b + e["dur"].get<double>(), e["name"], e["cat"]});
    }
  }
  std::size_t kernels = 0;
  std::set<std::string> pieces;
  int seven = 0, nine = 0;
  for (const auto& [tid, v] : tracks) {
    ASSERT_TRUE(names.count(tid)) << tid;
    seven += names[tid].find("stream 7 ") != std::string::npos;
    nine += names[tid].find("stream 9 ") != std::string::npos;
    std::vector<const Span*> stack;  // every track nests: a span ends inside the one it starts in
    for (const Span& s : v) {
      while (!stack.empty() && stack.back()->e <= s.b + 1e-6) stack.pop_back();
      if (!stack.empty()) {
        EXPECT_LE(s.e, stack.back()->e + 1e-6) << names[tid] << ": " << s.name;
        EXPECT_EQ(stack.back()->cat, "piece") << s.name << " inside " << stack.back()->name;
      }
      stack.push_back(&s);
      kernels += s.cat == "kernel";
      if (s.cat == "piece") pieces.insert(s.name);
    }
  }
  EXPECT_EQ(kernels, records) << "every kernel once";
  // the first piece's two kernels overlap: its span alone, they on two more lanes of stream 7; the
  // other pieces' kernels under their spans on the first lane; stream 9's untagged kernel alone
  EXPECT_EQ(seven, 3);
  EXPECT_EQ(nine, 1);
  EXPECT_EQ(pieces.size(), 3u) << "the three pieces that launched kernels";
  for (const auto& [tid, v] : tracks)
    for (const Span& s : v)
      if (s.name == "kernel_1") {
        const bool under = std::any_of(v.begin(), v.end(), [&](const Span& p) {
          return p.cat == "piece" && p.b <= s.b + 1e-6 && s.e <= p.e + 1e-6;
        });
        EXPECT_TRUE(under) << "kernel_1 under its piece's span on " << names[tid];
      }
}

}  // namespace
}  // namespace stepbench
