// The peer's plumbing without running PyTorch's benchmark: which Python it picks, and the min time it
// hands on. The interpreters are real (/usr/bin/python3, with or without Debian's torch) and a
// wrapper of it whose import path holds a stand-in torch that reports a GPU and torch.compile.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "bench/peer.hpp"

namespace stepbench {
namespace {

namespace fs = std::filesystem;

struct FakeTorch {
  fs::path dir;
  std::string python;  // runs /usr/bin/python3 with the stand-in torch and torchvision first on its path
  FakeTorch(bool cuda, bool compile) {
    dir = fs::temp_directory_path() /
          ("stepbench-peer-" + std::to_string(getpid()) + (cuda ? "c" : "n") + (compile ? "c" : "n"));
    fs::create_directories(dir / "torch");
    fs::create_directories(dir / "torchvision");
    std::ofstream(dir / "torch" / "__init__.py")
        << "__version__ = '9.9.9+fake'\n"
        << "class cuda:\n    @staticmethod\n    def is_available():\n        return " << (cuda ? "True" : "False")
        << "\nclass version:\n    cuda = '12.8'\n"
        << (compile ? "def compile(m):\n    return m\n" : "");
    std::ofstream(dir / "torchvision" / "__init__.py") << "__version__ = '0.0'\n";
    python = (dir / "python").string();
    std::ofstream(python) << "#!/bin/sh\nPYTHONPATH='" << dir.string() << "' exec /usr/bin/python3 \"$@\"\n";
    chmod(python.c_str(), 0755);
  }
  ~FakeTorch() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

TEST(Peer, FindsTheFirstPythonWhoseTorchSeesAGpuAndSaysWhyTheOthersDoNot) {
  if (!fs::exists("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
  FakeTorch gpu(true, true), nogpu(false, true);
  std::string why;
  const std::vector<std::string> c = {"/nonexistent/bin/python", nogpu.python, gpu.python};
  EXPECT_EQ(find_peer_python(c, /*need_cuda=*/true, /*need_compile=*/false, &why), gpu.python);
  // the CPU run takes the first that imports torch at all
  EXPECT_EQ(find_peer_python(c, false, false, &why), nogpu.python);
  why.clear();
  EXPECT_EQ(find_peer_python({"/nonexistent/bin/python", nogpu.python}, true, false, &why), "");
  EXPECT_NE(why.find("/nonexistent/bin/python: not found"), std::string::npos) << why;
  EXPECT_NE(why.find(nogpu.python + ": torch 9.9.9+fake is built with CUDA 12.8 but sees no GPU"), std::string::npos)
      << why;
}

TEST(Peer, AskingForTorchCompileRejectsATorchWithoutIt) {
  if (!fs::exists("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
  FakeTorch old(true, false), recent(true, true);
  std::string why;
  EXPECT_EQ(find_peer_python({old.python, recent.python}, true, true, &why), recent.python);
  EXPECT_EQ(find_peer_python({old.python}, true, true, &why), "");
  EXPECT_NE(why.find("has no torch.compile"), std::string::npos) << why;
  EXPECT_EQ(find_peer_python({old.python}, true, false, &why), old.python);
}

TEST(Peer, APythonWithoutTorchIsPassedOverWithTheImportError) {
  // torch alone is not enough: torchvision must import too (here the system one fails on the fake torch)
  FakeTorch t(true, true);
  fs::remove_all(t.dir / "torchvision");
  std::string why;
  EXPECT_EQ(find_peer_python({t.python}, false, false, &why), "");
  EXPECT_NE(why.find(t.python + ": cannot import torch and torchvision ("), std::string::npos) << why;
}

TEST(Peer, TheMinTimeIsGoogleBenchmarksOwn) {
  EXPECT_DOUBLE_EQ(benchmark_min_time({}), 0.5);
  EXPECT_DOUBLE_EQ(benchmark_min_time({"--benchmark_min_time=0.01"}), 0.01);
  EXPECT_DOUBLE_EQ(benchmark_min_time({"--benchmark_repetitions=3", "--benchmark_min_time=2s"}), 2.0);
  EXPECT_DOUBLE_EQ(benchmark_min_time({"--benchmark_min_time=abc"}), 0.5);
}

}  // namespace
}  // namespace stepbench
