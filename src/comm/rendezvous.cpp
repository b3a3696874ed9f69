// meet(): claims, what each process was told, and the wait for every rank, on the store.
#include "comm/rendezvous.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <sstream>

#include "tensor/error.hpp"

namespace stepbench {

std::vector<PeerInfo> meet(Store& store, const LaunchEnv& env, const std::string& host, double timeout_s) {
  const std::string where = store.address();
  const std::string stale = where.rfind("file:", 0) == 0
                                ? fmt::format(" (or {} holds an earlier run's files: remove it)", where.substr(5))
                                : "";
  auto fail = [&](const std::string& why) {
    store.set("stepbench/error", why);
    throw UsageError(why);
  };
  if (const auto err = store.try_get("stepbench/error")) throw UsageError(fmt::format("{}{}", *err, stale));
  if (store.add(fmt::format("stepbench/claim/{}", env.rank), 1) > 1)
    fail(
        fmt::format("two processes were given rank {} ({}; this one is pid {} on {}): give each process its own "
                    "rank{}",
                    env.rank, env.source, getpid(), host, stale));
  store.set(fmt::format("stepbench/info/{}", env.rank),
            fmt::format("{} {} {} {} {}", env.size, env.local_rank, env.local_size, getpid(), host));

  std::vector<std::string> keys;
  keys.reserve(static_cast<std::size_t>(env.size));
  for (int r = 0; r < env.size; ++r) keys.push_back(fmt::format("stepbench/info/{}", r));
  const auto missing = store.wait(keys, timeout_s, [&] {
    if (const auto err = store.try_get("stepbench/error")) throw UsageError(*err);
  });
  if (!missing.empty()) {
    std::string ranks;
    for (const auto& k : missing) ranks += (ranks.empty() ? "" : ", ") + k.substr(k.rfind('/') + 1);
    throw SyncError(fmt::format(
        "rank{} {} of {} never joined the rendezvous at {} within {:g} s (--sync-timeout-s): {} did not start, "
        "failed before joining, or was given another --rendezvous",
        missing.size() > 1 ? "s" : "", ranks, env.size, where, timeout_s, missing.size() > 1 ? "they" : "it"));
  }
  std::vector<PeerInfo> peers;
  for (int r = 0; r < env.size; ++r) {
    std::istringstream in(*store.try_get(keys[static_cast<std::size_t>(r)]));
    int size = 0, local_rank = 0, local_size = 0;
    PeerInfo p;
    in >> size >> local_rank >> local_size >> p.pid >> p.host;
    if (size != env.size)
      fail(
          fmt::format("rank {} was told the world has {} processes and rank {} that it has {} ({}): start every "
                      "process with the same world size",
                      r, size, env.rank, env.size, env.source));
    peers.push_back(p);
  }
  return peers;
}

}  // namespace stepbench
