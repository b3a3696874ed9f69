// --decode gpu on the cuda backend (backend.hpp's ImageDecodeOp): nvJPEG's batched decode to RGB on
// the device, then the pipeline's resize, crop, flip and normalisation (kernels_image.cu). nvJPEG is
// loaded at run time (dlopen), declared here from NVIDIA's public nvjpeg.h (the nvidia-nvjpeg wheel
// 13.0.4's: the values and signatures below are copied from it), since the toolkit on a build machine
// need not carry it; where it is missing, --decode gpu is a usage error naming the library.
#include <dlfcn.h>

#include <fmt/format.h>

#include <algorithm>
#include <mutex>

#include "backend/cuda/common.hpp"
#include "backend/cuda/dl.hpp"
#include "tensor/error.hpp"

namespace stepbench::cuda {
namespace {

// ---- nvjpeg.h's declarations ----------------------------------------------------------------------
using nvjpegStatus_t = int;  // NVJPEG_STATUS_SUCCESS = 0
using nvjpegHandle_t = struct nvjpegHandle*;
using nvjpegJpegState_t = struct nvjpegJpegState*;
using nvjpegJpegStream_t = struct nvjpegJpegStream*;
constexpr int kBackendHardware = 3;  // NVJPEG_BACKEND_HARDWARE: the GPU's JPEG engines (A100, H100)
constexpr int kStatusBadJpeg = 3, kStatusJpegNotSupported = 4;  // one file's fault
constexpr int kOutputRgbi = 5;                                  // NVJPEG_OUTPUT_RGBI: interleaved RGB
constexpr int kMaxComponent = 4;
struct nvjpegImage_t {
  unsigned char* channel[kMaxComponent];
  std::size_t pitch[kMaxComponent];
};
constexpr const char* kStatus[] = {"success",
                                   "not initialised",
                                   "invalid parameter",
                                   "bad JPEG",
                                   "JPEG not supported",
                                   "allocator failure",
                                   "execution failed",
                                   "architecture mismatch",
                                   "internal error",
                                   "implementation not supported",
                                   "incomplete bitstream"};
std::string status_name(nvjpegStatus_t s) {
  return s >= 0 && s < static_cast<int>(std::size(kStatus)) ? fmt::format("{} ({})", kStatus[s], s)
                                                            : fmt::format("status {}", s);
}

struct NvJpeg {
  void* lib = nullptr;
  nvjpegStatus_t (*create_simple)(nvjpegHandle_t*) = nullptr;
  nvjpegStatus_t (*destroy)(nvjpegHandle_t) = nullptr;
  nvjpegStatus_t (*state_create)(nvjpegHandle_t, nvjpegJpegState_t*) = nullptr;
  nvjpegStatus_t (*state_destroy)(nvjpegJpegState_t) = nullptr;
  nvjpegStatus_t (*image_info)(nvjpegHandle_t, const unsigned char*, std::size_t, int*, int*, int*, int*) = nullptr;
  nvjpegStatus_t (*decode)(nvjpegHandle_t, nvjpegJpegState_t, const unsigned char*, std::size_t, int, nvjpegImage_t*,
                           cudaStream_t) = nullptr;
  nvjpegStatus_t (*batched_init)(nvjpegHandle_t, nvjpegJpegState_t, int, int, int) = nullptr;
  nvjpegStatus_t (*batched)(nvjpegHandle_t, nvjpegJpegState_t, const unsigned char* const*, const std::size_t*,
                            nvjpegImage_t*, cudaStream_t) = nullptr;
  nvjpegStatus_t (*property)(int, int*) = nullptr;  // libraryPropertyType: 0 major, 1 minor, 2 patch
  // the hardware decoder's (optional: without them, the hybrid backend decodes everything)
  nvjpegStatus_t (*create_ex)(int, void*, void*, unsigned, nvjpegHandle_t*) = nullptr;
  nvjpegStatus_t (*stream_create)(nvjpegHandle_t, nvjpegJpegStream_t*) = nullptr;
  nvjpegStatus_t (*stream_destroy)(nvjpegJpegStream_t) = nullptr;
  nvjpegStatus_t (*parse_header)(nvjpegHandle_t, const unsigned char*, std::size_t, nvjpegJpegStream_t) = nullptr;
  nvjpegStatus_t (*batched_supported)(nvjpegHandle_t, nvjpegJpegStream_t, int*) = nullptr;  // 0: supported
  nvjpegStatus_t (*hw_info)(nvjpegHandle_t, unsigned*, unsigned*) = nullptr;                // engines, cores per engine
  std::string why;                                                                          // "" when loaded
};

const NvJpeg& nvjpeg() {
  static NvJpeg api;
  static std::once_flag once;
  std::call_once(once, [] {
    for (const char* name : {"libnvjpeg.so.13", "libnvjpeg.so"})
      if ((api.lib = dlopen(name, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
    if (api.lib == nullptr) {
      api.why =
          "libnvjpeg.so.13 (CUDA's nvJPEG) was not found: put the CUDA toolkit's lib64 or the nvidia-nvjpeg "
          "wheel's lib on LD_LIBRARY_PATH, or drop --decode gpu";
      return;
    }
    resolve(api.lib, "nvjpegCreateSimple", api.create_simple);
    resolve(api.lib, "nvjpegDestroy", api.destroy);
    resolve(api.lib, "nvjpegJpegStateCreate", api.state_create);
    resolve(api.lib, "nvjpegJpegStateDestroy", api.state_destroy);
    resolve(api.lib, "nvjpegGetImageInfo", api.image_info);
    resolve(api.lib, "nvjpegDecode", api.decode);
    resolve(api.lib, "nvjpegDecodeBatchedInitialize", api.batched_init);
    resolve(api.lib, "nvjpegDecodeBatched", api.batched);
    resolve(api.lib, "nvjpegGetProperty", api.property);
    resolve(api.lib, "nvjpegCreateEx", api.create_ex);
    resolve(api.lib, "nvjpegJpegStreamCreate", api.stream_create);
    resolve(api.lib, "nvjpegJpegStreamDestroy", api.stream_destroy);
    resolve(api.lib, "nvjpegJpegStreamParseHeader", api.parse_header);
    resolve(api.lib, "nvjpegDecodeBatchedSupported", api.batched_supported);
    resolve(api.lib, "nvjpegGetHardwareDecoderInfo", api.hw_info);
    if (!api.create_simple || !api.destroy || !api.state_create || !api.state_destroy || !api.image_info ||
        !api.decode || !api.batched_init || !api.batched)
      api.why = "the libnvjpeg found lacks the decode API's entry points";
  });
  return api;
}

constexpr std::size_t kAlign = 256;
std::size_t aligned(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

class NvJpegDecode final : public ImageDecodeOp {
 public:
  NvJpegDecode(int device, const ImageDecodeParams& p) : dev_(device), p_(p) {
    const NvJpeg& a = nvjpeg();
    if (!a.why.empty()) throw UnsupportedError("--decode gpu: " + a.why);
    if (p.batch < 1 || p.size < 1 || p.store < p.size)
      throw UsageError(fmt::format("--decode gpu: a batch of {} crops of {} from {}x{} images cannot be decoded",
                                   p.batch, p.size, p.store, p.store));
    SB_CUDA(cudaSetDevice(dev_));
    try {  // the buffers free themselves; the handles, states and stream are released here
      check(a.create_simple(&h_), "nvjpegCreateSimple");
      check(a.state_create(h_, &st_), "nvjpegJpegStateCreate");
      check(a.state_create(h_, &one_), "nvjpegJpegStateCreate");
      int v[3] = {0, 0, 0};
      for (int k = 0; k < 3 && a.property; ++k) a.property(k, &v[k]);
      library_ = fmt::format("nvJPEG {}.{}.{}, batched", v[0], v[1], v[2]);
      if (p.hardware) library_ += ", " + open_hardware();
      for (int k = 0; k < 3; ++k) {
        nrm_.scale[k] = 1.0f / (255.0f * p.stddev[k]);  // augment.cpp's flip_normalise, in float
        nrm_.shift[k] = -p.mean[k] / p.stddev[k];
      }
      stored_ = alloc(static_cast<std::size_t>(p.batch) * p.store * p.store * 3);
      in_dev_ = alloc(sizeof(ImageIn) * static_cast<std::size_t>(p.batch));
      crop_dev_ = alloc(sizeof(CropIn) * static_cast<std::size_t>(p.batch));
      void* h = nullptr;
      SB_CUDA(cudaMallocHost(&h, sizeof(ImageIn) * p.batch + sizeof(CropIn) * p.batch));
      host_ = PinnedBuffer(h);
    } catch (...) {
      release();
      throw;
    }
  }
  ~NvJpegDecode() override { release(); }
  NvJpegDecode(const NvJpegDecode&) = delete;
  NvJpegDecode& operator=(const NvJpegDecode&) = delete;

  // what decodes, and how many batches nvJPEG refused whole (each then decoded file by file)
  std::string library() const override {
    std::string s = library_;
    if (hw_opened_) s += fmt::format(" ({} of {} images on the hardware decoder)", hw_images_, images_);
    if (hw_fallbacks_ > 0)
      s += fmt::format(" ({} hardware batch{} went to the hybrid backend, the last: {})", hw_fallbacks_,
                       hw_fallbacks_ == 1 ? "" : "es", status_name(hw_last_status_));
    if (!hw_closed_.empty()) s += " (" + hw_closed_ + ")";
    if (fallbacks_ > 0)
      s += fmt::format(" ({} of {} batches fell back to one file at a time, the last: {})", fallbacks_, batches_,
                       status_name(last_batch_status_));
    return s;
  }

  std::vector<std::string> decode(Stream& s, const std::vector<std::pair<const unsigned char*, std::size_t>>& files,
                                  const std::vector<ImageCrop>& crops, const Tensor& out) override {
    SB_CHECK(files.size() == crops.size() && files.size() <= static_cast<std::size_t>(p_.batch),
             "decode: one crop per file, at most the batch");
    const NvJpeg& a = nvjpeg();
    SB_CUDA(cudaSetDevice(dev_));
    std::vector<std::string> why(files.size());
    std::vector<int> ok;  // the files whose headers nvJPEG reads, as RGB
    std::vector<ImageIn> im;
    std::size_t bytes = 0;
    for (std::size_t i = 0; i < files.size(); ++i) {
      int comps = 0, sub = 0, w[kMaxComponent] = {}, h[kMaxComponent] = {};
      const nvjpegStatus_t r = a.image_info(h_, files[i].first, files[i].second, &comps, &sub, w, h);
      if (r != 0 || w[0] <= 0 || h[0] <= 0) {
        why[i] = fmt::format("nvJPEG cannot read its header: {}", status_name(r));
        continue;
      }
      if (comps != 1 && comps != 3) {
        why[i] = fmt::format("has {} colour components; nvJPEG decodes grey and YCbCr", comps);
        continue;
      }
      ok.push_back(static_cast<int>(i));
      im.push_back({nullptr, w[0], h[0], static_cast<std::size_t>(w[0]) * 3});
      bytes += aligned(im.back().pitch * static_cast<std::size_t>(h[0]));
    }
    if (ok.empty()) return why;
    grow(bytes);
    std::vector<nvjpegImage_t> dst(ok.size());
    std::vector<const unsigned char*> data(ok.size());
    std::vector<std::size_t> len(ok.size());
    std::size_t off = 0;
    for (std::size_t k = 0; k < ok.size(); ++k) {
      im[k].px = static_cast<unsigned char*>(decoded_.get()) + off;
      off += aligned(im[k].pitch * static_cast<std::size_t>(im[k].h));
      dst[k] = nvjpegImage_t{};
      dst[k].channel[0] = const_cast<unsigned char*>(im[k].px);
      dst[k].pitch[0] = im[k].pitch;
      data[k] = files[static_cast<std::size_t>(ok[k])].first;
      len[k] = files[static_cast<std::size_t>(ok[k])].second;
    }
    std::vector<CropIn> crop(ok.size());  // checked before anything is queued
    for (std::size_t k = 0; k < ok.size(); ++k) crop[k] = crop_in(crops[static_cast<std::size_t>(ok[k])], ok[k]);
    const cudaStream_t cs = S(s);
    std::vector<int> done;    // positions in ok that decoded
    std::vector<int> hybrid;  // positions in ok for the hybrid backend: what the hardware decoder does not take
    // positions ks of ok decoded as one batch by handle h on state st (initialised for n files)
    const auto batch = [&](nvjpegHandle_t h, nvjpegJpegState_t st, int& n, const std::vector<int>& ks) {
      std::vector<const unsigned char*> bd;
      std::vector<std::size_t> bl;
      std::vector<nvjpegImage_t> bo;
      for (int k : ks) {
        bd.push_back(data[static_cast<std::size_t>(k)]);
        bl.push_back(len[static_cast<std::size_t>(k)]);
        bo.push_back(dst[static_cast<std::size_t>(k)]);
      }
      nvjpegStatus_t r = 0;
      if (n != static_cast<int>(ks.size())) {
        r = a.batched_init(h, st, static_cast<int>(ks.size()), 1, kOutputRgbi);
        n = r == 0 ? static_cast<int>(ks.size()) : 0;
      }
      if (r == 0) r = a.batched(h, st, bd.data(), bl.data(), bo.data(), cs);
      if (r != 0) n = 0;  // initialised again next time
      return r;
    };
    images_ += static_cast<long>(ok.size());
    ++batches_;
    for (std::size_t k = 0; k < ok.size(); ++k) {
      int unsupported = 1;
      if (hw_ && a.parse_header(hw_, data[k], len[k], hw_js_) == 0 &&
          a.batched_supported(hw_, hw_js_, &unsupported) != 0)
        unsupported = 1;
      (unsupported == 0 ? done : hybrid).push_back(static_cast<int>(k));
    }
    if (!done.empty()) {
      int fresh = 0;  // initialised before every batch, as NVIDIA's samples do
      const nvjpegStatus_t r = batch(hw_, hw_st_, fresh, done);
      if (r == 0) {
        hw_images_ += static_cast<long>(done.size());
      } else {               // the hybrid backend takes them too
        cudaGetLastError();  // not left for the next launch's check to find
        ++hw_fallbacks_;
        hw_last_status_ = r;
        hybrid.insert(hybrid.end(), done.begin(), done.end());
        done.clear();
        if (r != kStatusBadJpeg && r != kStatusJpegNotSupported) {  // not one file's fault: no more batches to it
          hw_closed_ = fmt::format("the hardware decoder closed after a batch failed with {}", status_name(r));
          cudaStreamSynchronize(cs);  // nothing of its own left queued when its state goes
          cudaGetLastError();
          close_hardware();
        }
      }
    }
    nvjpegStatus_t r = hybrid.empty() ? 0 : batch(h_, st_, initialised_, hybrid);
    if (r == 0) {
      done.insert(done.end(), hybrid.begin(), hybrid.end());
    } else {  // one file spoils the batch: each alone, on a state of its own (the batch's is reset next time)
      ++fallbacks_;
      last_batch_status_ = r;
      for (int k : hybrid) {
        const auto ku = static_cast<std::size_t>(k);
        const nvjpegStatus_t one = a.decode(h_, one_, data[ku], len[ku], kOutputRgbi, &dst[ku], cs);
        if (one == 0)
          done.push_back(k);
        else
          why[static_cast<std::size_t>(ok[ku])] = fmt::format("nvJPEG could not decode it: {}", status_name(one));
      }
    }
    std::vector<ImageIn> ins;
    std::vector<CropIn> cr;
    for (int k : done) {
      ins.push_back(im[static_cast<std::size_t>(k)]);
      cr.push_back(crop[static_cast<std::size_t>(k)]);
    }
    run(cs, ins, cr, out);
    return why;
  }

  void transform(Stream& s, const std::vector<HostRgb>& images, const std::vector<ImageCrop>& crops,
                 const std::vector<int>& slots, const Tensor& out) override {
    SB_CHECK(images.size() == crops.size() && images.size() == slots.size() &&
                 images.size() <= static_cast<std::size_t>(p_.batch),
             "transform: one crop and slot per image, at most the batch");
    SB_CUDA(cudaSetDevice(dev_));
    std::size_t bytes = 0;
    for (const auto& i : images) bytes += aligned(static_cast<std::size_t>(i.w) * i.h * 3);
    grow(bytes);
    const cudaStream_t cs = S(s);
    std::vector<ImageIn> ins;
    std::vector<CropIn> cr;
    std::size_t off = 0;
    for (std::size_t k = 0; k < images.size(); ++k) {
      const HostRgb& i = images[k];
      auto* p = static_cast<unsigned char*>(decoded_.get()) + off;
      const std::size_t n = static_cast<std::size_t>(i.w) * i.h * 3;
      SB_CUDA(cudaMemcpyAsync(p, i.px, n, cudaMemcpyHostToDevice, cs));
      off += aligned(n);
      ins.push_back({p, i.w, i.h, static_cast<std::size_t>(i.w) * 3});
      cr.push_back(crop_in(crops[k], slots[k]));
    }
    run(cs, ins, cr, out);
  }

 private:
  void check(nvjpegStatus_t r, const char* what) {
    if (r != 0) throw Error(fmt::format("--decode gpu: {} failed: {}", what, status_name(r)));
  }
  DeviceBuffer alloc(std::size_t bytes) {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, std::max<std::size_t>(bytes, 1));
    if (e != cudaSuccess) {
      cudaGetLastError();  // not left for the next launch's check to find
      throw Error(fmt::format("--decode gpu: {:.1f} MiB of GPU memory for the decoded images: {}",
                              static_cast<double>(bytes) / (1 << 20), cudaGetErrorString(e)));
    }
    return DeviceBuffer(p);
  }
  void grow(std::size_t bytes) {  // the decoded images' buffer, for the largest batch seen
    if (bytes <= decoded_bytes_) return;
    decoded_ = DeviceBuffer();
    decoded_ = alloc(bytes + bytes / 4);
    decoded_bytes_ = bytes + bytes / 4;
  }
  // The GPU's JPEG engines where it has them: a handle of their own, the batches' state, and a stream
  // to ask per file whether they take it. Says what decodes; without them the hybrid backend does all.
  std::string open_hardware() {
    const NvJpeg& a = nvjpeg();
    if (!a.create_ex || !a.stream_create || !a.stream_destroy || !a.parse_header || !a.batched_supported)
      return "the hybrid backend (this nvJPEG has no hardware decoder's API)";
    const nvjpegStatus_t r = a.create_ex(kBackendHardware, nullptr, nullptr, 0, &hw_);
    if (r != 0) {
      hw_ = nullptr;
      cudaGetLastError();  // not left for the next launch's check to find
      return fmt::format("the hybrid backend (no hardware decoder: {})", status_name(r));
    }
    unsigned engines = 0, cores = 0;
    const bool info = a.hw_info && a.hw_info(hw_, &engines, &cores) == 0;
    if (info && engines == 0) {  // e.g. a MIG slice without the engines
      close_hardware();
      return "the hybrid backend (the hardware decoder has no engines here)";
    }
    if (a.state_create(hw_, &hw_st_) != 0 || a.stream_create(hw_, &hw_js_) != 0) {
      close_hardware();
      cudaGetLastError();
      return "the hybrid backend (the hardware decoder's state could not be made)";
    }
    hw_opened_ = true;
    return fmt::format("the hardware decoder{}, the hybrid backend for files it does not take",
                       info ? fmt::format(" ({} engine{} x {} cores)", engines, engines == 1 ? "" : "s", cores) : "");
  }
  void release() {
    cudaSetDevice(dev_);  // nvJPEG's handles and states belong to the device that made them
    close_hardware();
    const NvJpeg& a = nvjpeg();
    if (one_) a.state_destroy(one_);
    if (st_) a.state_destroy(st_);
    if (h_) a.destroy(h_);
    one_ = nullptr, st_ = nullptr, h_ = nullptr;
  }
  void close_hardware() {
    const NvJpeg& a = nvjpeg();
    if (hw_js_) a.stream_destroy(hw_js_);
    if (hw_st_) a.state_destroy(hw_st_);
    if (hw_) a.destroy(hw_);
    hw_js_ = nullptr, hw_st_ = nullptr, hw_ = nullptr;
  }
  CropIn crop_in(const ImageCrop& c, int slot) const {
    SB_CHECK(c.x >= 0 && c.y >= 0 && c.w > 0 && c.h > 0 && c.x + c.w <= p_.store && c.y + c.h <= p_.store,
             "a crop box outside the stored image");
    return CropIn{c.x, c.y, c.w, c.h, c.flip ? 1 : 0, slot};
  }
  // The resize and the crop of the images decoded (device memory) into out's slots; synchronises.
  void run(cudaStream_t cs, const std::vector<ImageIn>& ins, const std::vector<CropIn>& cr, const Tensor& out) {
    SB_CHECK(out.desc.dtype == DType::f32 && out.desc.shape.c == 3 && out.desc.shape.h == p_.size &&
                 out.desc.shape.w == p_.size && out.desc.shape.n >= static_cast<std::int64_t>(ins.size()),
             "decode: the batch tensor is N x 3 x S x S in f32");
    SB_CUDA(cudaStreamSynchronize(cs));  // the decodes queued; the pinned arrays of the last call are free again
    if (ins.empty()) return;
    auto* hi = static_cast<ImageIn*>(host_.get());
    auto* hc = reinterpret_cast<CropIn*>(hi + p_.batch);
    std::copy(ins.begin(), ins.end(), hi);
    std::copy(cr.begin(), cr.end(), hc);
    SB_CUDA(cudaMemcpyAsync(in_dev_.get(), hi, sizeof(ImageIn) * ins.size(), cudaMemcpyHostToDevice, cs));
    SB_CUDA(cudaMemcpyAsync(crop_dev_.get(), hc, sizeof(CropIn) * cr.size(), cudaMemcpyHostToDevice, cs));
    const int n = static_cast<int>(ins.size());
    auto* stored = static_cast<unsigned char*>(stored_.get());
    SB_CUDA(launch_resize_store(static_cast<const ImageIn*>(in_dev_.get()), n, p_.store, stored, cs));
    SB_CUDA(launch_crop_normalise(stored, p_.store, static_cast<const CropIn*>(crop_dev_.get()), n, p_.size, nrm_,
                                  view(out), cs));
    SB_CUDA(cudaStreamSynchronize(cs));
  }

  int dev_;
  ImageDecodeParams p_;
  nvjpegHandle_t h_ = nullptr;
  nvjpegJpegState_t st_ = nullptr;   // the batched decode's
  nvjpegJpegState_t one_ = nullptr;  // single files' (after a batch failed)
  std::string library_;
  NormIn nrm_{};
  DeviceBuffer stored_, in_dev_, crop_dev_, decoded_;
  std::size_t decoded_bytes_ = 0;
  PinnedBuffer host_;
  int initialised_ = 0;          // the batch size nvjpegDecodeBatchedInitialize was last called with
  nvjpegHandle_t hw_ = nullptr;  // the hardware decoder's, where the GPU has one (p.hardware)
  nvjpegJpegState_t hw_st_ = nullptr;
  nvjpegJpegStream_t hw_js_ = nullptr;
  bool hw_opened_ = false;  // at the start (the images counted even after a close)
  std::string hw_closed_;   // why it was closed after a batch, "" while open
  long batches_ = 0, fallbacks_ = 0, images_ = 0, hw_images_ = 0, hw_fallbacks_ = 0;
  nvjpegStatus_t hw_last_status_ = 0;
  nvjpegStatus_t last_batch_status_ = 0;
};

}  // namespace

std::unique_ptr<ImageDecodeOp> make_cuda_image_decoder(int device, const ImageDecodeParams& p) {
  return std::make_unique<NvJpegDecode>(device, p);
}

}  // namespace stepbench::cuda
