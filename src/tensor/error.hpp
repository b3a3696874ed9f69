// Errors: the library throws, never exits. UsageError is what a bad flag or an impossible
// configuration raises; the binary maps it to exit code 2.
#pragma once
#include <stdexcept>
#include <string>

namespace stepbench {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct UsageError : Error {
  using Error::Error;
};
// The requested precision, layout or op is not available on this backend / machine.
struct UnsupportedError : UsageError {
  using UsageError::UsageError;
};

// A gradient sync failed or did not complete within --sync-timeout-s (a peer process died or stalled,
// or the communicator reported an error). The run cannot go on; the binary ends every process.
struct SyncError : Error {
  using Error::Error;
};

[[noreturn]] void throw_error(const char* file, int line, const std::string& what);

}  // namespace stepbench

#define SB_CHECK(cond, msg)                                                                                      \
  do {                                                                                                           \
    if (!(cond)) ::stepbench::throw_error(__FILE__, __LINE__, std::string("check failed: " #cond ": ") + (msg)); \
  } while (0)
