// The op tests' one instantiation: every TEST_P(Ops, ...) of tests/backend/*_test.cpp over every
// backend x layout x precision configuration (those this machine cannot run skip with the reason).
#include "backend/ops_common.hpp"

namespace stepbench {
namespace {

INSTANTIATE_TEST_SUITE_P(AllBackends, Ops, testing::ValuesIn(test::all_configs()), test::config_name);

}  // namespace
}  // namespace stepbench
