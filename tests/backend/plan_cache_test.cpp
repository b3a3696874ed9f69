// The convolution plan cache (src/backend/plan_cache.*): what its key tells apart, how towers
// searching at once agree, and its file (round trip, a missing file, damaged files as usage errors).
#include "backend/plan_cache.hpp"
#include "support/temp_dir.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace stepbench {
namespace {

namespace fs = std::filesystem;

struct KeyParts {
  std::string machine = "NVIDIA H100 80GB HBM3 cc9.0 132 SMs, driver 570.86.15, cuDNN 91900";
  ConvDirection d = ConvDirection::forward;
  TensorDesc x = TensorDesc::dense({8, 64, 35, 35}, DType::bf16, Layout::nhwc);
  TensorDesc y = TensorDesc::dense({8, 96, 35, 35}, DType::bf16, Layout::nhwc);
  ConvParams p{3, 3, 1, 1, 1, 1};
  std::string math = "tensor_op";
  std::size_t limit = std::size_t{512} << 20;
  std::string key() const { return conv_plan_key(machine, d, x, y, p, math, limit); }
};

TEST(PlanCache, EveryPartOfTheKeyTellsConvolutionsApart) {
  const KeyParts base;
  std::vector<KeyParts> v(13, base);
  v[0].machine = "NVIDIA H100 80GB HBM3 cc9.0 132 SMs, driver 575.51.03, cuDNN 91900";  // driver update
  v[1].machine = "NVIDIA H100 80GB HBM3 cc9.0 132 SMs, driver 570.86.15, cuDNN 91000";  // cuDNN version
  v[2].d = ConvDirection::backward_data;
  v[3].d = ConvDirection::backward_filter;
  v[4].x.shape.n = 16;  // batch
  v[4].y.shape.n = 16;
  v[5].y = Tensor{nullptr, TensorDesc::dense({8, 288, 35, 35}, DType::bf16, Layout::nhwc)}.channel_slice(64, 96).desc;
  v[6].x.dtype = v[6].y.dtype = DType::f16;
  v[7].x = TensorDesc::dense(base.x.shape, DType::bf16, Layout::nchw);
  v[7].y = TensorDesc::dense(base.y.shape, DType::bf16, Layout::nchw);
  v[8].p = ConvParams{1, 3, 1, 1, 0, 1};
  v[9].p.stride_h = v[9].p.stride_w = 2;
  v[10].p.pad_h = 0;
  v[11].math = "fma";
  v[12].limit = std::size_t{64} << 20;
  std::set<std::string> keys{base.key()};
  for (std::size_t i = 0; i < v.size(); ++i) EXPECT_TRUE(keys.insert(v[i].key()).second) << "variant " << i;
  EXPECT_EQ(KeyParts{}.key(), base.key());  // and the same convolution gets the same key
}

TEST(PlanCache, FindCountsReusesAndInsertKeepsTheFirstPlan) {
  ConvPlanCache c;
  const std::string k = KeyParts{}.key();
  EXPECT_FALSE(c.find(k));
  EXPECT_EQ(c.insert(k, ConvPlan{1, 1, 4096, 0.5}), (ConvPlan{1, 1, 4096, 0.5}));
  // a second tower that searched at the same time and found another algorithm runs the first one's
  EXPECT_EQ(c.insert(k, ConvPlan{6, 2, 0, 0.4}), (ConvPlan{1, 1, 4096, 0.5}));
  ASSERT_TRUE(c.find(k));
  EXPECT_EQ(c.find(k)->algo, 1);
  EXPECT_EQ(c.searched(), 2u);
  EXPECT_EQ(c.reused(), 2u);
  EXPECT_EQ(c.size(), 1u);
}

TEST(PlanCache, TowersPlanningAtOnceAllRunOnePlan) {
  ConvPlanCache c;
  const std::string k = KeyParts{}.key();
  std::vector<ConvPlan> got(8);
  std::vector<std::thread> th;
  for (int i = 0; i < 8; ++i)
    th.emplace_back([&, i] {
      const auto hit = c.find(k);
      got[static_cast<std::size_t>(i)] = hit ? *hit : c.insert(k, ConvPlan{i, 1, 0, 0});
    });
  for (auto& t : th) t.join();
  for (const auto& g : got) EXPECT_EQ(g, got[0]);
}

TEST(PlanCache, AFileKeepsEveryPlanBetweenRuns) {
  test::TempDir d("plans");
  const std::string f = d.file("plans.json");
  ConvPlanCache first;
  first.load(f);  // not there yet: empty, and this run writes it
  EXPECT_EQ(first.size(), 0u);
  EXPECT_EQ(first.path(), f);
  KeyParts a, b;
  b.d = ConvDirection::backward_filter;
  first.insert(a.key(), ConvPlan{1, 1, 123456789012ULL, 0.25});
  first.insert(b.key(), ConvPlan{3, 2, 0, 1.5});
  first.save(f);
  for (const auto& e : fs::directory_iterator(d.p)) EXPECT_EQ(e.path().string(), f) << "a temporary file was left";

  ConvPlanCache second;
  second.load(f);
  EXPECT_EQ(second.loaded(), 2u);
  ASSERT_TRUE(second.find(a.key()));
  EXPECT_EQ(*second.find(a.key()), (ConvPlan{1, 1, 123456789012ULL, 0.25}));
  EXPECT_EQ(*second.find(b.key()), (ConvPlan{3, 2, 0, 1.5}));
  EXPECT_EQ(second.searched(), 0u);
  // another machine's plans are kept in the file, never looked up here
  KeyParts other;
  other.machine = "NVIDIA H200 cc9.0 132 SMs, driver 570.86.15, cuDNN 91900";
  EXPECT_FALSE(second.find(other.key()));
  second.insert(other.key(), ConvPlan{0, 0, 0, 2});
  second.save(f);
  ConvPlanCache third;
  third.load(f);
  EXPECT_EQ(third.loaded(), 3u);
}

TEST(PlanCache, ADamagedFileIsAUsageErrorNamingIt) {
  test::TempDir d("plans");
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"not json", "{\"format\": "},
      {"an array", "[1, 2]"},
      {"another format", R"({"format": "something-else", "version": 1, "plans": {}})"},
      {"another version", R"({"format": "stepbench-conv-plan-cache", "version": 2, "plans": {}})"},
      {"no plans", R"({"format": "stepbench-conv-plan-cache", "version": 1})"},
      {"a negative algorithm",
       R"({"format": "stepbench-conv-plan-cache", "version": 1, "plans": {"k": {"algo": -1, "math": 0, "workspace": 0}}})"},
      {"a workspace as text",
       R"({"format": "stepbench-conv-plan-cache", "version": 1, "plans": {"k": {"algo": 1, "math": 0, "workspace": "0"}}})"},
      {"a format that is a number", R"({"format": 1, "version": 1, "plans": {}})"},
      {"a version that wraps to 1", R"({"format": "stepbench-conv-plan-cache", "version": 4294967297, "plans": {}})"},
      {"an algorithm that wraps to 1",
       R"({"format": "stepbench-conv-plan-cache", "version": 1, "plans": {"k": {"algo": 4294967297, "math": 0, "workspace": 0}}})"},
      {"a math type cuDNN does not have",
       R"({"format": "stepbench-conv-plan-cache", "version": 1, "plans": {"k": {"algo": 1, "math": 7, "workspace": 0}}})"},
      {"a time as text",
       R"({"format": "stepbench-conv-plan-cache", "version": 1, "plans": {"k": {"algo": 1, "math": 0, "workspace": 0, "ms": "1"}}})"},
      {"an entry that is a number", R"({"format": "stepbench-conv-plan-cache", "version": 1, "plans": {"k": 3}})"},
      {"no math",
       R"({"format": "stepbench-conv-plan-cache", "version": 1, "plans": {"k": {"algo": 1, "workspace": 0}}})"},
  };
  for (const auto& [what, text] : bad) {
    SCOPED_TRACE(what);
    const std::string f = d.file("bad.json", text);
    ConvPlanCache c;
    try {
      c.load(f);
      ADD_FAILURE() << "accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("--plan-cache " + f), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("delete the file"), std::string::npos) << e.what();
    }
    EXPECT_EQ(c.size(), 0u);
  }
}

TEST(PlanCache, AFileThatCannotBeReadIsAUsageErrorNotAnEmptyCache) {
  test::TempDir d("plans");
  ConvPlanCache c;
  EXPECT_THROW(c.load(d.p.string()), UsageError);  // a directory: there, but not readable as a file
}

TEST(PlanCache, AnUnwritableFileIsAnError) {
  ConvPlanCache c;
  c.insert(KeyParts{}.key(), ConvPlan{});
  EXPECT_THROW(c.save("/nonexistent-dir/plans.json"), Error);
}

}  // namespace
}  // namespace stepbench
