// Where the launch gate looks for CUPTI (patches/shared/lms_launch_gate_core.inc,
// cupti_search_paths): a pip install keeps libcupti under
// site-packages/nvidia/..., where dlopen of a bare soname may not look.  The
// search takes its roots as arguments, so it is checked here on the CPU with
// folders laid out as pip, the CUDA toolkit and LD_LIBRARY_PATH lay them out.
#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace lms_gate_test {
#include "tensorflow/core/common_runtime/gpu/gpu_lms_launch_gate_core.inc"
}  // namespace lms_gate_test

namespace {

// Makes the folders of 'path' and an empty file there.
void Touch(const std::string& path) {
  for (size_t i = 1; i < path.size(); ++i) {
    if (path[i] == '/') mkdir(path.substr(0, i).c_str(), 0755);
  }
  std::FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr) << path;
  std::fclose(f);
}

// The first candidate that is a file (what the gate dlopens first, bare
// sonames aside: those are the loader's).
std::string FirstFile(const std::vector<std::string>& paths) {
  for (const auto& p : paths) {
    struct stat st;
    if (p.find('/') != std::string::npos && stat(p.c_str(), &st) == 0) return p;
  }
  return "";
}

TEST(LmsLaunchGate, FindsCuptiWherePipAndTheToolkitPutIt) {
  char tmpl[] = "/tmp/lms_cupti_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string t = tmpl;
  using lms_gate_test::cupti_search_paths;

  // The loader's own search comes first.
  const std::vector<std::string> none = cupti_search_paths({}, {}, {});
  ASSERT_FALSE(none.empty());
  EXPECT_EQ(none[0], "libcupti.so");

  // CUDA 12 wheels: site-packages/nvidia/cuda_cupti/lib, found from
  // site-packages/tensorflow (libtensorflow_framework.so.2's folder).
  Touch(t + "/a/site-packages/nvidia/cuda_cupti/lib/libcupti.so.12");
  EXPECT_EQ(FirstFile(cupti_search_paths(
                {}, {}, {t + "/a/site-packages/tensorflow"})),
            t + "/a/site-packages/nvidia/cuda_cupti/lib/libcupti.so.12");
  // CUDA 13 wheels: site-packages/nvidia/cu13/lib, from torch/lib.
  Touch(t + "/b/site-packages/nvidia/cu13/lib/libcupti.so.13");
  EXPECT_EQ(FirstFile(cupti_search_paths(
                {}, {}, {t + "/b/site-packages/torch/lib"})),
            t + "/b/site-packages/nvidia/cu13/lib/libcupti.so.13");
  // A toolkit's extras/CUPTI (CUDA_HOME) and a folder of LD_LIBRARY_PATH.
  Touch(t + "/cuda/extras/CUPTI/lib64/libcupti.so");
  EXPECT_EQ(FirstFile(cupti_search_paths({t + "/cuda"}, {}, {})),
            t + "/cuda/extras/CUPTI/lib64/libcupti.so");
  Touch(t + "/ld/libcupti.so.12");
  EXPECT_EQ(FirstFile(cupti_search_paths({t + "/cuda"}, {"/nowhere", t + "/ld"},
                                         {})),
            t + "/ld/libcupti.so.12");
  EXPECT_EQ(lms_gate_test::split_path("/a::/b:"),
            (std::vector<std::string>{"/a", "/b"}));
  std::string rm = "rm -rf " + t;
  EXPECT_EQ(std::system(rm.c_str()), 0);
}

}  // namespace
