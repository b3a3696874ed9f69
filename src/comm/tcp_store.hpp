// The store's TCP form (comm/store.hpp): a small server that rank 0 runs on a thread of its own, and
// a client in every process. Internal to src/comm.
#pragma once
#include <memory>
#include <string>

#include "comm/store.hpp"

namespace stepbench {

// serve: run the server on `port` in this process (all addresses; UsageError when the port is in
// use), then connect to host:port like every other process, retrying up to timeout_s (0: forever).
std::unique_ptr<Store> make_tcp_store(const std::string& host, int port, bool serve, double timeout_s);

}  // namespace stepbench
