// Where the step's input comes from when it is not the constant device batch: one host batch
// staged every step (synthetic-host), or the JPEG pipeline.
#pragma once
#include <memory>
#include <string>

#include "bench/config.hpp"
#include "data/data.hpp"
#include "train/towers.hpp"

namespace stepbench {

class Feeder {
 public:
  Feeder(const BenchConfig& c, Towers& t);
  bool active() const { return fixed_ || pipe_; }
  std::string name() const { return pipe_ ? "jpeg" : "synthetic-host"; }
  // Stage the next batch for every tower and make the next step read it.
  void feed();
  std::string describe() const;
  std::string skipped() const;  // "" when nothing was skipped

 private:
  const BenchConfig& c_;
  Towers& t_;
  std::unique_ptr<HostBatch> fixed_;
  std::unique_ptr<JpegPipeline> pipe_;
  std::size_t files_ = 0, classes_ = 0;
};

}  // namespace stepbench
