// --suggest: the input pipeline run alone for a few batches as the run configured it and with each
// remedy that applies (--cache memory, a record file, twice the --data-threads, --decode gpu or,
// from --decode gpu, the CPU's decode), on a sample of the folder, so the verdict can quote
// measured images/s instead of estimates.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "bench/feeder.hpp"

namespace stepbench {

// What --suggest's --decode gpu rows decode with: the backend's decoder (Backend::make_image_decoder;
// UnsupportedError where it has none, and the row says why).
using ImageDecoderMaker = std::function<std::unique_ptr<ImageDecodeOp>(const ImageDecodeParams&)>;

// The pipeline as run (po, po.encoded for --decode gpu) over a folder or a record file (records
// non-null). `device` allocates the --decode gpu rows' batch and runs their stream. Runs on this
// process; the step is not running meanwhile. A remedy that cannot run here gets a row saying why.
std::vector<RemedyRow> run_suggest(const PipelineOptions& po, const ImageFolder& folder,
                                   const std::shared_ptr<const RecordFile>& records, Backend& device,
                                   const ImageDecoderMaker& make_decoder);
inline std::vector<RemedyRow> run_suggest(const Feeder& f, Backend& device) {
  return run_suggest(f.pipeline_options(), f.folder(), f.records(), device,
                     [&device](const ImageDecodeParams& p) { return device.make_image_decoder(p); });
}

}  // namespace stepbench
