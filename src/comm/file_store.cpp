// The store's shared parts (wait, open_store) and its folder form: one file per key, written to a
// temporary name and renamed into place (a reader sees a whole value or none); counters updated
// under an advisory lock (flock) on the folder's lock file.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "comm/store.hpp"
#include "comm/tcp_store.hpp"
#include "tensor/error.hpp"

namespace stepbench {

std::vector<std::string> Store::wait(const std::vector<std::string>& keys, double timeout_s,
                                     const std::function<void()>& poll) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> missing = keys;
  for (auto pause = std::chrono::milliseconds(1);; pause = std::min(pause * 2, std::chrono::milliseconds(50))) {
    std::erase_if(missing, [this](const std::string& k) { return try_get(k).has_value(); });
    if (missing.empty()) return missing;
    if (poll) poll();
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (timeout_s > 0 && waited > timeout_s) return missing;
    std::this_thread::sleep_for(pause);
  }
}

namespace {

namespace fs = std::filesystem;

class FileStore final : public Store {
 public:
  explicit FileStore(std::string path) : dir_(std::move(path)) {
    char h[128] = {};
    gethostname(h, sizeof h - 1);
    host_ = h;
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (!fs::is_directory(dir_))
      throw UsageError(
          fmt::format("--rendezvous file:{}: cannot make the folder ({}); give a path every process "
                      "can write",
                      dir_.string(), ec ? ec.message() : "not a folder"));
  }
  std::string address() const override { return "file:" + dir_.string(); }

  void set(const std::string& key, const std::string& value) override {
    const fs::path f = file(key);
    const fs::path tmp = f.string() + fmt::format(".tmp.{}.{}", host_, getpid());  // unique on a shared folder
    {
      std::ofstream o(tmp, std::ios::binary | std::ios::trunc);
      o << value;
      if (!o.flush()) throw Error(fmt::format("rendezvous: cannot write {} ({})", tmp.string(), std::strerror(errno)));
    }
    std::error_code ec;
    fs::rename(tmp, f, ec);
    if (ec) throw Error(fmt::format("rendezvous: cannot rename {} into place ({})", tmp.string(), ec.message()));
  }
  std::optional<std::string> try_get(const std::string& key) override {
    std::ifstream in(file(key), std::ios::binary);
    if (!in) return std::nullopt;
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  }
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    const int fd = ::open((dir_ / "lock").c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    if (fd < 0) throw Error(fmt::format("rendezvous: cannot open {}/lock ({})", dir_.string(), std::strerror(errno)));
    while (::flock(fd, LOCK_EX) != 0 && errno == EINTR) {
    }
    std::int64_t v = 0;
    try {
      if (const auto old = try_get(key)) v = std::stoll(*old);
      v += delta;
      set(key, std::to_string(v));
    } catch (...) {
      ::close(fd);  // releases the lock
      throw;
    }
    ::close(fd);
    return v;
  }
  // Removes what stepbench put in the folder (its keys, their temporary files, the lock), and the
  // folder when that leaves it empty: whatever else a user keeps there stays.
  void clear() override {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir_, ec)) {
      const std::string n = e.path().filename().string();
      if (n == "lock" || n.rfind("stepbench%2F", 0) == 0 ||
          (n.rfind("gloo", 0) == 0 && n.find("%2F") != std::string::npos))
        fs::remove(e.path(), ec);
    }
    fs::remove(dir_, ec);  // only when empty
  }

 private:
  // A key as one file name: '/' and '%' escaped, nothing else is special to the folder.
  fs::path file(const std::string& key) const {
    std::string n;
    for (char c : key) {
      if (c == '/' || c == '%')
        n += fmt::format("%{:02X}", static_cast<unsigned char>(c));
      else
        n += c;
    }
    return dir_ / n;
  }
  fs::path dir_;
  std::string host_;
};

}  // namespace

std::unique_ptr<Store> open_store(const std::string& address, bool host, double timeout_s) {
  if (address.rfind("file:", 0) == 0) return std::make_unique<FileStore>(address.substr(5));
  if (address.rfind("tcp://", 0) == 0) {
    const auto colon = address.rfind(':');
    return make_tcp_store(address.substr(6, colon - 6), std::stoi(address.substr(colon + 1)), host, timeout_s);
  }
  throw UsageError(fmt::format("rendezvous '{}': give file:PATH or tcp://HOST:PORT", address));
}

}  // namespace stepbench
