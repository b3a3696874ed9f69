#include "test_util.hpp"

#include "stepbench/graph.hpp"

namespace stepbench::test {
namespace {
ParamEntry filter_entry(const Backend& be, Layout l, std::int64_t O, std::int64_t I, std::int64_t KH, std::int64_t KW) {
  ParamEntry e{"w", {O, I, KH, KW}};
  e.count = static_cast<std::size_t>(O * I * KH * KW);
  e.is_filter = true;
  e.format = be.filter_format(l);
  return e;
}
}  // namespace

std::vector<double> filter_for(const Backend& be, Layout l, const std::vector<double>& oihw, std::int64_t O,
                               std::int64_t I, std::int64_t KH, std::int64_t KW) {
  const auto e = filter_entry(be, l, O, I, KH, KW);
  std::vector<float> src(oihw.begin(), oihw.end()), dst(src.size());
  filter_to_storage(src.data(), dst.data(), e);
  return {dst.begin(), dst.end()};
}

std::vector<double> filter_back(const Backend& be, Layout l, const std::vector<double>& stored, std::int64_t O,
                                std::int64_t I, std::int64_t KH, std::int64_t KW) {
  const auto e = filter_entry(be, l, O, I, KH, KW);
  std::vector<float> src(stored.begin(), stored.end()), dst(src.size());
  filter_from_storage(src.data(), dst.data(), e);
  return {dst.begin(), dst.end()};
}

}  // namespace stepbench::test
