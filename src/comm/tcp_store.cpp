// The TCP store: rank 0 serves the keys from a thread (poll over its connections), every process
// asks over one connection. A request is an op byte ('S' set, 'G' get, 'A' add), a key and a value,
// each string as a 4-byte length and its bytes; the reply a status byte (0 found or done, 1 absent)
// and a string.
#include "comm/tcp_store.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "tensor/error.hpp"

namespace stepbench {
namespace {

constexpr std::uint32_t kMaxString = 64u << 20;

void put_string(std::string& out, const std::string& s) {
  const auto n = static_cast<std::uint32_t>(s.size());
  out.append(reinterpret_cast<const char*>(&n), 4);
  out += s;
}

// Reads one string at `pos` of `buf`; false when the buffer does not hold it whole yet.
bool take_string(const std::string& buf, std::size_t& pos, std::string& s) {
  if (buf.size() < pos + 4) return false;
  std::uint32_t n = 0;
  std::memcpy(&n, buf.data() + pos, 4);
  if (n > kMaxString) throw Error("rendezvous store: a request larger than 64 MiB");
  if (buf.size() < pos + 4 + n) return false;
  s.assign(buf, pos + 4, n);
  pos += 4 + n;
  return true;
}

bool send_all(int fd, const std::string& s) {
  for (std::size_t done = 0; done < s.size();) {
    const ssize_t n = ::send(fd, s.data() + done, s.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

using Clock = std::chrono::steady_clock;

// Waits until fd is ready for `events` or the deadline passes (Clock::time_point::max(): never).
bool ready(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    int ms = -1;
    if (deadline != Clock::time_point::max()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return false;
      ms = static_cast<int>(std::min<long long>(left, 1000));
    }
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, ms);
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return false;
  }
}

// The client's side: every byte within the deadline (a stopped or dead server must not hang it).
bool send_within(int fd, const std::string& s, Clock::time_point deadline) {
  for (std::size_t done = 0; done < s.size();) {
    if (!ready(fd, POLLOUT, deadline)) return false;
    const ssize_t n = ::send(fd, s.data() + done, s.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}
bool recv_within(int fd, char* p, std::size_t len, Clock::time_point deadline) {
  for (std::size_t done = 0; done < len;) {
    if (!ready(fd, POLLIN, deadline)) return false;
    const ssize_t n = ::recv(fd, p + done, len - done, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

class Server {
 public:
  explicit Server(int port) {
    fd_ = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool v6 = fd_ >= 0;
    if (!v6) fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) throw Error(fmt::format("rendezvous store: socket() failed ({})", std::strerror(errno)));
    const int one = 1, zero = 0;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int rc;
    if (v6) {
      ::setsockopt(fd_, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);  // IPv4 clients too
      sockaddr_in6 a{};
      a.sin6_family = AF_INET6;
      a.sin6_addr = in6addr_any;
      a.sin6_port = htons(static_cast<std::uint16_t>(port));
      rc = ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    } else {
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_ANY);
      a.sin_port = htons(static_cast<std::uint16_t>(port));
      rc = ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    }
    if (rc != 0 || ::listen(fd_, 1024) != 0) {
      const int err = errno;
      ::close(fd_);
      throw UsageError(fmt::format(
          "rank 0 cannot listen on port {} for the rendezvous ({}){}; give --rendezvous tcp://HOST:PORT with a free "
          "port, or file:PATH on a path every process sees",
          port, std::strerror(err),
          err == EADDRINUSE ? " (under torchrun its agent holds MASTER_PORT and stepbench takes MASTER_PORT + 1)"
                            : ""));
    }
    if (::pipe2(wake_, O_CLOEXEC) != 0) throw Error("rendezvous store: pipe() failed");
    th_ = std::thread([this] { loop(); });
  }
  ~Server() {
    const char c = 0;
    [[maybe_unused]] const auto n = ::write(wake_[1], &c, 1);
    th_.join();
    for (auto& [fd, buf] : clients_) ::close(fd);
    ::close(fd_);
    ::close(wake_[0]);
    ::close(wake_[1]);
  }
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

 private:
  void loop() {
    for (;;) {
      std::vector<pollfd> p{{wake_[0], POLLIN, 0}, {fd_, POLLIN, 0}};
      for (const auto& [fd, buf] : clients_) p.push_back({fd, POLLIN, 0});
      if (::poll(p.data(), p.size(), -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (p[0].revents) return;
      if (p[1].revents & POLLIN) {
        const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c >= 0) clients_.emplace(c, std::string{});
      }
      for (std::size_t i = 2; i < p.size(); ++i) {
        if (!p[i].revents) continue;
        try {
          serve(p[i].fd);
        } catch (const std::exception&) {  // a malformed request: that client is dropped, the rest served
          ::close(p[i].fd);
          clients_.erase(p[i].fd);
        }
      }
    }
  }
  // Reads what the client sent and answers every whole request in it; closes it when it hung up.
  void serve(int fd) {
    char tmp[65536];
    const ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
    if (n <= 0 && !(n < 0 && errno == EINTR)) {
      ::close(fd);
      clients_.erase(fd);
      return;
    }
    std::string& buf = clients_[fd];
    buf.append(tmp, static_cast<std::size_t>(std::max<ssize_t>(n, 0)));
    std::size_t pos = 0;
    for (;;) {
      std::size_t at = pos + 1;
      std::string key, value;
      if (buf.size() <= pos || !take_string(buf, at, key) || !take_string(buf, at, value)) break;
      const char op = buf[pos];
      pos = at;
      std::string reply(1, '\0');
      if (op == 'S') {
        kv_[key] = value;
        put_string(reply, "");
      } else if (op == 'G') {
        const auto it = kv_.find(key);
        reply[0] = it == kv_.end() ? '\1' : '\0';
        put_string(reply, it == kv_.end() ? "" : it->second);
      } else {  // 'A'
        const auto it = kv_.find(key);
        const long long v = (it == kv_.end() ? 0 : std::stoll(it->second)) + std::stoll(value);
        kv_[key] = std::to_string(v);
        put_string(reply, kv_[key]);
      }
      if (!send_all(fd, reply)) break;
    }
    buf.erase(0, pos);
  }

  int fd_ = -1;
  int wake_[2] = {-1, -1};
  std::map<int, std::string> clients_;  // connection -> bytes received but not yet answered
  std::map<std::string, std::string> kv_;
  std::thread th_;  // last: starts once the members it uses exist
};

class TcpStore final : public Store {
 public:
  TcpStore(std::string host, int port, bool serve, double timeout_s)
      : host_(std::move(host)), port_(port), timeout_s_(timeout_s) {
    if (serve) server_ = std::make_unique<Server>(port);
    connect(timeout_s);
  }
  ~TcpStore() override {
    if (fd_ >= 0) ::close(fd_);
  }
  std::string address() const override { return fmt::format("tcp://{}:{}", host_, port_); }
  void set(const std::string& key, const std::string& value) override { ask('S', key, value); }
  std::optional<std::string> try_get(const std::string& key) override {
    auto [found, v] = ask('G', key, "");
    if (!found) return std::nullopt;
    return v;
  }
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    return std::stoll(ask('A', key, std::to_string(delta)).second);
  }

 private:
  void connect(double timeout_s) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    const auto t0 = std::chrono::steady_clock::now();
    std::string last = "no address";
    for (;;) {
      addrinfo* res = nullptr;
      const int gai = ::getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &res);
      if (gai != 0) {
        last = ::gai_strerror(gai);
      } else {
        for (addrinfo* a = res; a && fd_ < 0; a = a->ai_next) {
          // non-blocking, at most 5 s a try: a host that drops the packets must not take minutes
          const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
          if (fd < 0) continue;
          int err = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
          if (err == EINPROGRESS) {
            socklen_t len = sizeof err;
            err = ready(fd, POLLOUT, Clock::now() + std::chrono::seconds(5)) &&
                          ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0
                      ? err
                      : ETIMEDOUT;
          }
          if (err == 0) {
            const int one = 1;
            ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            fd_ = fd;
          } else {
            last = std::strerror(err);
            ::close(fd);
          }
        }
        ::freeaddrinfo(res);
      }
      if (fd_ >= 0) return;
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (timeout_s > 0 && waited > timeout_s)
        throw SyncError(fmt::format(
            "rank 0 never opened the rendezvous at {} within {:g} s ({}): it did not start, it runs on another host "
            "than {}, or a firewall is in the way. Give --rendezvous tcp://HOST:PORT with rank 0's host",
            address(), timeout_s, last, host_));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  std::pair<bool, std::string> ask(char op, const std::string& key, const std::string& value) {
    std::lock_guard<std::mutex> l(mu_);
    std::string req(1, op);
    put_string(req, key);
    put_string(req, value);
    char head[5];
    const auto deadline =
        timeout_s_ > 0
            ? Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_))
            : Clock::time_point::max();
    const auto lost = [&] {
      return SyncError(fmt::format(
          "the rendezvous store at {} did not answer within {:g} s (--sync-timeout-s): rank 0, which serves it, "
          "ended or stalled",
          address(), timeout_s_));
    };
    if (!send_within(fd_, req, deadline) || !recv_within(fd_, head, 5, deadline)) throw lost();
    std::uint32_t n = 0;
    std::memcpy(&n, head + 1, 4);
    if (n > kMaxString) throw SyncError(fmt::format("the rendezvous store at {} answered nonsense", address()));
    std::string v(n, '\0');
    if (n && !recv_within(fd_, v.data(), n, deadline)) throw lost();
    return {head[0] == 0, v};
  }

  std::string host_;
  int port_;
  double timeout_s_;
  std::unique_ptr<Server> server_;  // rank 0's; stopped after the destructor closed this connection
  int fd_ = -1;
  std::mutex mu_;
};

}  // namespace

std::unique_ptr<Store> make_tcp_store(const std::string& host, int port, bool serve, double timeout_s) {
  return std::make_unique<TcpStore>(host, port, serve, timeout_s);
}

}  // namespace stepbench
