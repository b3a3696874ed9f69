// Where the step's input comes from when it is not the constant device batch: one host batch
// staged every step (synthetic-host), an image folder (optionally cached in memory) or a record
// file, through the image pipeline. The feeder also times the staging copies and keeps the stage
// times the input_pipeline benchmark measured, for the summary's breakdown and verdict.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "bench/config.hpp"
#include "data/data.hpp"
#include "train/towers.hpp"

namespace stepbench {

// What the input_pipeline benchmark measured, over all its repetitions.
struct InputMeasure {
  StageTimes stages;    // thread time per stage (copy: the step's side), idle, images, batches
  double wall_s = 0;    // the benchmark's own time: its timed iterations
  double window_s = 0;  // from the first stage snapshot to the last: what the threads' times add up to
  std::uint64_t images = 0;
  int threads = 0;
};

// One row of --suggest: the pipeline as run or with a remedy, run alone for a few batches.
struct RemedyRow {
  std::string name;  // "as run", "--cache memory", "make-records, --data OUT.records", "--data-threads 4"
  double images_per_s = 0;
  std::string note;        // e.g. the cache's fill time; "" when none
  bool applies = true;     // false: measured, but the run would refuse it (a cache that does not fit)
  bool on_device = false;  // timed on the GPU without the step, which shares it in the run
};

// --decode gpu: a batch's files (an encoded pipeline's) decoded and transformed by `dec` into out,
// on s; a file the device refuses is decoded on the CPU and transformed on the device alike, and one
// neither can decode is counted as skipped in p, its slot zeroed. Returns when out is written.
void decode_on_device(ImageDecodeOp& dec, Backend& be, Stream& s, const HostBatch& b, const Tensor& out,
                      ImagePipeline& p);

class Feeder {
 public:
  Feeder(const BenchConfig& c, Towers& t);
  bool active() const { return fixed_ || pipe_; }
  // the benchmark row's suffix: synthetic-host, images, images+cache or records
  std::string name() const;
  // Stage the next batch for every tower and make the next step read it.
  void feed();
  std::string describe() const;
  // --trace: the staging's device times and the pipeline's stages per thread, from now on (or no more)
  void trace(bool on);
  std::vector<std::vector<StageSpan>> take_stage_spans();  // [thread], since the last take
  std::string skipped() const;                             // "" when nothing was skipped

  // The pipeline's stage times so far, with the staging copies' host time (zeros for synthetic-host).
  StageTimes stage_times() const;
  void add_measure(const StageTimes& delta, double wall_s, double window_s, std::uint64_t images);
  const InputMeasure& measure() const { return measure_; }
  const ImagePipeline* pipeline() const { return pipe_.get(); }
  // The folder behind the pipeline (empty for records or synthetic-host): --suggest samples it.
  const ImageFolder& folder() const { return folder_; }
  const PipelineOptions& pipeline_options() const { return po_; }
  std::shared_ptr<const RecordFile> records() const { return records_; }
  // --suggest's rows, once run (bench/suggest.hpp)
  void set_remedies(std::vector<RemedyRow> r) { remedies_ = std::move(r); }
  const std::vector<RemedyRow>& remedies() const { return remedies_; }

 private:
  const BenchConfig& c_;
  Towers& t_;
  std::unique_ptr<HostBatch> fixed_;
  std::unique_ptr<ImagePipeline> pipe_;
  std::shared_ptr<const RecordFile> records_;
  ImageFolder folder_;
  PipelineOptions po_;
  double copy_s_ = 0;
  // --decode gpu: one decoder per tower; the host time of the device's part (decode, transforms,
  // the labels' copy), which stage_times() reports as the copy stage (the step's side)
  std::vector<std::unique_ptr<ImageDecodeOp>> decoders_;
  void feed_decoded(int tower, HostBatch& b);
  InputMeasure measure_;
  std::vector<RemedyRow> remedies_;
};

}  // namespace stepbench
