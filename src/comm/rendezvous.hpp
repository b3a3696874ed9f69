// stepbench's own meeting on a store, before Gloo's: every process claims its rank and says what it
// was told, so that a rank given to two processes, a world size that differs between processes and
// a rank that never starts each end the run with a message naming the rank, instead of a hang or a
// mismatched collective. Internal to src/comm.
#pragma once
#include <string>
#include <vector>

#include "comm/launch_env.hpp"
#include "comm/process_group.hpp"
#include "comm/store.hpp"

namespace stepbench {

// Meets every rank of `env` on `store` within timeout_s (0: forever). Returns each rank's host and
// process id (in rank order). Throws UsageError when the ranks' variables disagree (after posting
// the reason, so that the other processes end with it too), SyncError naming the ranks that did
// not arrive in time.
std::vector<PeerInfo> meet(Store& store, const LaunchEnv& env, const std::string& host, double timeout_s);

}  // namespace stepbench
