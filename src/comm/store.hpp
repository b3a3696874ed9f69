// A key-value store where processes started without MPI find each other, as torchrun's and
// PyTorch c10d's stores serve Gloo: a folder on a path every process sees ("file:PATH"), or a TCP
// server that rank 0 hosts ("tcp://HOST:PORT"). Gloo's rendezvous runs over it (comm/gloo_group.cpp),
// and stepbench's own checks before it (comm/rendezvous.hpp): one process per rank, one world size.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace stepbench {

class Store {
 public:
  virtual ~Store() = default;
  virtual std::string address() const = 0;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // The value, or nullopt when the key is not set (yet); never waits.
  virtual std::optional<std::string> try_get(const std::string& key) = 0;
  // Adds delta to the number stored at key (0 when absent) in one step for every process; the new value.
  virtual std::int64_t add(const std::string& key, std::int64_t delta) = 0;
  // Removes what this store holds (the rank that hosts it, once every rank has met); a folder's
  // other files stay.
  virtual void clear() {}

  // Waits until every key is set or timeout_s has passed (0: forever), calling poll() between
  // looks (it may throw to stop the wait); returns the keys still missing.
  std::vector<std::string> wait(const std::vector<std::string>& keys, double timeout_s,
                                const std::function<void()>& poll = {});
};

// Opens the store at `address` ("file:PATH" or "tcp://HOST:PORT"). For tcp, `host` makes this
// process run the server on PORT (rank 0; UsageError when the port is taken); every process, the
// host too, then connects to HOST:PORT, retrying for up to timeout_s (0: forever) while the server
// is not up. A file store makes its folder.
std::unique_ptr<Store> open_store(const std::string& address, bool host, double timeout_s);

}  // namespace stepbench
