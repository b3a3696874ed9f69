#include "bench/input_report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace stepbench {

namespace {

constexpr Stage kWorkerStages[] = {Stage::read,   Stage::crop,           Stage::decode,
                                   Stage::resize, Stage::flip_normalise, Stage::assembly};
double ms_per_image(const InputMeasure& m, Stage s) {
  return m.images ? 1e3 * m.stages[s] / static_cast<double>(m.images) : NAN;
}

}  // namespace

Remedy choose_remedy(const RemedyInputs& in) {
  const InputMeasure& m = in.measure;
  const StageTimes& st = m.stages;
  const double busy = st.busy();
  const double front = st[Stage::read] + st[Stage::decode] + st[Stage::resize];  // what a cache or records remove
  const double per_step = st[Stage::crop] + st[Stage::flip_normalise] + st[Stage::assembly];
  const double threads = std::max(1, m.threads);
  Remedy r;
  if (in.gpu_decode) {
    // the threads only read; the GPU's part runs on the step's thread (the copy stage)
    const double device = st[Stage::copy], per_thread = busy / threads;
    if (device >= per_thread) {
      r.name = "make-records";
      r.why = fmt::format(
          "decoding on the GPU takes {:.3f} ms per image on the step's thread, reading {:.3f}: a record file is "
          "decoded and resized once",
          1e3 * device / static_cast<double>(m.images), 1e3 * per_thread / static_cast<double>(m.images));
      r.ips = NAN;  // not estimated; --suggest measures it
    } else {
      r.name = fmt::format("--data-threads {}", 2 * m.threads);
      r.why = "reading the files limits the pipeline";
      r.ips = 2 * threads * static_cast<double>(m.images) / std::max(busy, 1e-12);
    }
  } else if (in.uncached_folder && busy > 0 && front / busy >= 0.5) {
    // decoding dominates: cache it, or pre-resize it to a record file where it does not fit
    r.name = in.cache_fits ? "--cache memory" : "make-records";
    r.why = fmt::format("read, decode and resize are {:.0f}% of the pipeline's work and run once with {}",
                        100 * front / busy, in.cache_fits ? "a cache" : "a record file");
    r.ips = threads * static_cast<double>(m.images) / per_step;
  } else {  // what remains runs every step: more threads
    r.name = fmt::format("--data-threads {}", 2 * m.threads);
    r.why = "the stages left run every step";
    r.ips = 2 * threads * static_cast<double>(m.images) / std::max(busy, 1e-12);
  }
  r.ips *= in.processes;
  // --suggest's rows (one process's pipeline each; the first is the pipeline as run): the remedy
  // above where it was measured to keep up with the step; else the first remedy measured to, in
  // the rows' order; else the fastest measured remedy where it beats the one above. A row the run
  // would refuse (a cache that does not fit) is no candidate.
  const RemedyRow *own = nullptr, *first_ok = nullptr, *fastest = nullptr;
  const auto name_of = [](const RemedyRow& row) {  // "make-records, --data OUT.records (drop --cache)": make-records
    std::string n = row.name.substr(0, row.name.find_first_of(",("));
    return n.substr(0, n.find_last_not_of(' ') + 1);
  };
  for (std::size_t i = 1; i < in.rows.size(); ++i) {
    const RemedyRow& row = in.rows[i];
    if (row.images_per_s <= 0 || !row.applies || row.name.rfind("as run", 0) == 0 || row.name.rfind("without", 0) == 0)
      continue;
    if (name_of(row) == r.name) own = &row;
    if (!first_ok && row.images_per_s * in.processes >= in.step_ips) first_ok = &row;
    if (!fastest || row.images_per_s > fastest->images_per_s) fastest = &row;
  }
  const RemedyRow* pick = own && own->images_per_s * in.processes >= in.step_ips ? own
                          : first_ok                                             ? first_ok
                          : own && own->images_per_s >= fastest->images_per_s    ? own
                                                                                 : fastest;
  if (!pick) return r;
  r.measured = true;
  if (in.rows.front().images_per_s > 0 && pick->images_per_s <= in.rows.front().images_per_s) {
    r.name.clear();  // nothing measured beats the pipeline as run
    r.ips = NAN;
    return r;
  }
  if (pick != own) {
    const char* how =
        pick == first_ok ? "the first remedy measured to keep up with the step" : "the fastest remedy measured";
    r.why = own ? fmt::format("{} measured {:.0f} images/s; {}", r.name, own->images_per_s * in.processes, how) : how;
  }
  r.name = pick->name;
  r.ips = pick->images_per_s * in.processes;
  if (pick->on_device) r.why += "; timed on the GPU without the step, which shares it in the run";
  if (in.processes > 1)
    r.why +=
        fmt::format("; one process's pipeline x {} processes: processes sharing a node share its cores", in.processes);
  return r;
}

namespace {

Remedy choose_remedy(const BenchConfig& c, const Feeder& f, int processes, double step_ips) {
  RemedyInputs in;
  in.measure = f.measure();
  in.gpu_decode = c.decode == DecodeOn::gpu;
  in.uncached_folder = c.data == DataKind::image_folder && c.cache != InputCache::memory;
  if (in.uncached_folder && !in.gpu_decode) {
    const ImagePipeline* p = f.pipeline();
    const double bytes = static_cast<double>(f.folder().files.size()) * p->store_size() * p->store_size() * 3;
    in.cache_fits = bytes <= static_cast<double>(cache_limit_bytes(f.pipeline_options()));
  }
  in.rows = f.remedies();
  in.processes = processes;
  in.step_ips = step_ips;
  return choose_remedy(in);
}

}  // namespace

void print_input_section(std::ostream& out, const BenchConfig& c, const Feeder& f, double S, double P, double D,
                         int processes) {
  const InputMeasure& m = f.measure();
  const StageTimes& st = m.stages;
  const double busy = st.busy();
  Stage top = Stage::decode;
  if (f.pipeline() && m.images > 0 && busy > 0) {
    out << fmt::format(
        "input stages: thread time per image over the input_pipeline repetitions ({} images, {} thread{}):\n", m.images,
        m.threads, m.threads == 1 ? "" : "s");
    for (Stage s : kWorkerStages) {
      if (st[s] > st[top]) top = s;
    }
    for (Stage s : {Stage::read, Stage::decode, Stage::resize, Stage::crop, Stage::flip_normalise, Stage::assembly})
      out << fmt::format("  {:<16} {:>9.3f} ms {:>6.1f}%\n", kStageNames[static_cast<std::size_t>(s)],
                         ms_per_image(m, s), 100 * st[s] / busy);
    out << fmt::format("  {:<16} {:>9.3f} ms  (on the step's side, {})\n", "copy", ms_per_image(m, Stage::copy),
                       c.decode == DecodeOn::gpu
                           ? "--decode gpu: nvJPEG's decode, the resize, crop and normalisation on the GPU, the labels"
                           : "host-to-device staging");
    // the threads' clocks cover the window between the stage snapshots, the gaps between the timed
    // iterations too: their shares and the time per image are of that window
    const double window = m.window_s > 0 ? m.window_s : m.wall_s, wall_threads = window * m.threads;
    out << fmt::format(
        "  the threads' time: stages {:.1f}%, waiting for room {:.1f}%, the rest {:+.1f}%; stages / threads = "
        "{:.3f} ms per image, the window's {:.3f} ms (the same when the threads never wait)\n",
        100 * busy / wall_threads, 100 * st.idle / wall_threads, 100 * (1 - (busy + st.open + st.idle) / wall_threads),
        1e3 * busy / m.threads / static_cast<double>(m.images), 1e3 * window / static_cast<double>(m.images));
  }
  if (!std::isnan(P) && !std::isnan(S)) {
    if (P < S) {
      std::string blame, fix;
      if (f.pipeline() && busy > 0) {
        const double device = st[Stage::copy], per_thread = busy / std::max(1, m.threads);
        if (c.decode == DecodeOn::gpu && device >= per_thread)  // the threads only read: the GPU's part is to blame
          blame = fmt::format(
              ": the GPU's decode and transforms take {:.3f} ms per image on the step's thread, reading the files "
              "{:.3f} ms per image on {} threads",
              ms_per_image(m, Stage::copy), 1e3 * per_thread / static_cast<double>(m.images), m.threads);
        else
          blame = fmt::format(": {} is {:.0f}% of the pipeline", kStageNames[static_cast<std::size_t>(top)],
                              100 * st[top] / busy);
        const Remedy r = choose_remedy(c, f, processes, S);
        const std::string how = r.measured ? "measured by --suggest"
                                : f.remedies().empty()
                                    ? "estimated from the stage times; --suggest measures it"
                                    : "estimated from the stage times; --suggest could not measure it";
        fix = r.name.empty()      ? "; none of the remedies --suggest measured beats the pipeline as run (below)"
              : std::isnan(r.ips) ? fmt::format("; `{}` would take the decode out of the step ({})", r.name, r.why)
              : r.ips >= S
                  ? fmt::format("; `{}` would make the step compute-bound ({}: {:.0f} vs {:.0f} images/s; {})", r.name,
                                how, r.ips, P, r.why)
                  : fmt::format("; `{}` would bring it to {:.0f} images/s, still below the step's {:.0f} ({}; {})",
                                r.name, r.ips, S, how, r.why);
      }
      out << fmt::format(
          "verdict: INPUT-BOUND by {:.1f}x{}{}. The input pipeline delivers {:.1f} images/s; the step could take "
          "{:.1f} images/s (synthetic data); fed by the pipeline it ran at {:.1f} images/s.\n",
          S / P, blame, fix, P, S, D);
    } else {
      out << fmt::format(
          "verdict: not input-bound. The input pipeline delivers {:.1f} images/s, {:.2f}x what the step takes "
          "({:.1f} images/s with synthetic data); fed by it the step ran at {:.1f} images/s ({:.2f}x the "
          "synthetic step time).\n",
          P, P / S, S, D, S / D);
    }
  } else {
    out << "verdict: needs both the step and input_pipeline phases\n";
  }
  if (!f.remedies().empty()) {
    // every process runs its own pipeline: the rows are this one's, the step's figure is per process too
    S /= processes;
    out << fmt::format("--suggest: the pipeline alone, a few batches each (the step takes {:.1f} images/s{}):\n", S,
                       processes > 1 ? " per process" : "");
    const double base = f.remedies().front().images_per_s;
    for (const auto& row : f.remedies()) {
      if (row.images_per_s <= 0) {
        out << fmt::format("  {:<34} {}\n", row.name, row.note);
        continue;
      }
      out << fmt::format("  {:<34} {:>9.1f} images/s {:>6.2f}x  {}{}\n", row.name, row.images_per_s,
                         row.images_per_s / base,
                         std::isnan(S)          ? ""
                         : row.images_per_s < S ? "input-bound"
                                                : "compute-bound",
                         row.note.empty() ? "" : "; " + row.note);
    }
  }
}

nlohmann::json input_stages_json(const Feeder& f) {
  const InputMeasure& m = f.measure();
  nlohmann::json j;
  j["images"] = m.images;
  j["threads"] = m.threads;
  j["wall_s"] = m.wall_s;
  j["window_s"] = m.window_s;  // the threads' times add up to threads x window_s
  j["idle_s"] = m.stages.idle;
  j["open_s"] = m.stages.open;  // in a stage at either end of a repetition (may be negative: ended inside it)
  const double busy = m.stages.busy();
  for (int i = 0; i < kStages; ++i) {
    const auto s = static_cast<Stage>(i);
    j["ms_per_image"][std::string(kStageNames[static_cast<std::size_t>(i)])] = m.images ? ms_per_image(m, s) : 0.0;
    if (s != Stage::copy)
      j["share"][std::string(kStageNames[static_cast<std::size_t>(i)])] = busy > 0 ? m.stages[s] / busy : 0.0;
  }
  if (const ImagePipeline* p = f.pipeline()) {
    j["store_size"] = p->store_size();
    j["cache_bytes"] = p->cache_bytes();
    j["cache_fill_s"] = p->cache_fill_seconds();
    j["skipped"] = p->skipped();
  }
  for (const auto& r : f.remedies())
    j["suggest"].push_back({{"remedy", r.name}, {"images_per_s", r.images_per_s}, {"note", r.note}});
  return j;
}

}  // namespace stepbench
