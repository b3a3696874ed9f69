// The store (a folder, a TCP server), stepbench's meeting on it (a rank claimed twice, a rank that
// never comes, world sizes that differ), and the Gloo group over it: ranks are threads here, each
// with its own ProcessGroup, as processes would be.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <latch>
#include <thread>
#include <vector>

#include "backend/registry.hpp"
#include "comm/collective.hpp"
#include "comm/launch_env.hpp"
#include "comm/process_group.hpp"
#include "comm/rendezvous.hpp"
#include "comm/store.hpp"
#include "comm/transport.hpp"
#include "tensor/error.hpp"

namespace stepbench {
namespace {

namespace fs = std::filesystem;

std::string temp_folder() {
  char t[] = "/tmp/stepbench-store-test-XXXXXX";
  EXPECT_NE(mkdtemp(t), nullptr);
  fs::remove(t);  // the store makes it
  return t;
}

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

LaunchEnv env_of(int rank, int size, const std::string& rendezvous) {
  LaunchEnv e;
  e.launcher = Launcher::torchrun;
  e.rank = e.local_rank = rank;
  e.size = e.local_size = size;
  e.rendezvous = rendezvous;
  e.source = fmt::format("RANK={} WORLD_SIZE={}", rank, size);
  return e;
}

// f(rank) on `size` threads at once; each one's exception message, or "" when it returned.
std::vector<std::string> on_ranks(int size, const std::function<void(int)>& f) {
  std::vector<std::future<void>> runs;
  for (int r = 0; r < size; ++r) runs.push_back(std::async(std::launch::async, f, r));
  std::vector<std::string> out;
  for (auto& r : runs) {
    try {
      r.get();
      out.emplace_back();
    } catch (const std::exception& e) {
      out.emplace_back(e.what());
    }
  }
  return out;
}

void exercise(Store& s) {
  EXPECT_FALSE(s.try_get("stepbench/a/b").has_value());
  s.set("stepbench/a/b", std::string("x\0y", 3));
  EXPECT_EQ(*s.try_get("stepbench/a/b"), std::string("x\0y", 3));
  s.set("stepbench/a/b", "second");
  EXPECT_EQ(*s.try_get("stepbench/a/b"), "second");
  EXPECT_EQ(s.add("stepbench/n", 1), 1);
  EXPECT_EQ(s.add("stepbench/n", 5), 6);
  EXPECT_TRUE(s.wait({"stepbench/a/b", "stepbench/n"}, 1).empty());
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(s.wait({"stepbench/a/b", "stepbench/never"}, 0.2), std::vector<std::string>{"stepbench/never"});
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
}

TEST(Store, AFolderKeepsKeysCountersAndWaits) {
  const std::string dir = temp_folder();
  auto s = open_store("file:" + dir, true, 5);
  exercise(*s);
  auto other = open_store("file:" + dir, false, 5);  // another process's view of the same folder
  EXPECT_EQ(*other->try_get("stepbench/a/b"), "second");
  EXPECT_EQ(other->add("stepbench/n", 1), 7);
  s->clear();  // our keys only: a folder with nothing else goes
  EXPECT_FALSE(fs::exists(dir));
  // a folder of the user's keeps its own files; stepbench's keys go
  fs::create_directories(dir);
  std::ofstream(dir + "/notes.txt") << "mine";
  auto kept = open_store("file:" + dir, true, 5);
  kept->set("stepbench/x", "1");
  kept->set("gloo/rank_0", "2");
  kept->add("stepbench/claim/0", 1);
  kept->clear();
  EXPECT_TRUE(fs::exists(dir + "/notes.txt"));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator{}), 1);
  fs::remove_all(dir);
}

TEST(Store, TcpServesEveryClientAndRefusesATakenPort) {
  const int port = free_port();
  auto host = open_store(fmt::format("tcp://127.0.0.1:{}", port), true, 5);
  exercise(*host);
  auto client = open_store(fmt::format("tcp://localhost:{}", port), false, 5);
  EXPECT_EQ(*client->try_get("stepbench/a/b"), "second");
  EXPECT_EQ(client->add("stepbench/n", 1), 7);
  const std::string big(3 << 20, 'z');  // longer than one read of the server
  client->set("big", big);
  EXPECT_EQ(*host->try_get("big"), big);
  try {
    open_store(fmt::format("tcp://127.0.0.1:{}", port), true, 1);
    ADD_FAILURE() << "a second server on the same port";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot listen on port"), std::string::npos) << e.what();
  }
  // nobody serves: the client gives up after its timeout, saying where it looked
  try {
    open_store(fmt::format("tcp://127.0.0.1:{}", free_port()), false, 0.3);
    ADD_FAILURE() << "connected to nothing";
  } catch (const SyncError& e) {
    EXPECT_NE(std::string(e.what()).find("never opened the rendezvous"), std::string::npos) << e.what();
  }
}

TEST(Meet, EveryRankMeetsAndLearnsTheOthersHosts) {
  const std::string where = "file:" + temp_folder();
  std::vector<std::vector<PeerInfo>> peers(3);
  const auto errors = on_ranks(3, [&](int r) {
    auto s = open_store(where, r == 0, 10);
    peers[static_cast<std::size_t>(r)] = meet(*s, env_of(r, 3, where), fmt::format("host{}", r), 10);
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  for (const auto& p : peers) {
    ASSERT_EQ(p.size(), 3u);
    EXPECT_EQ(p[2].host, "host2");
    EXPECT_EQ(p[1].pid, getpid());
  }
  fs::remove_all(where.substr(5));
}

TEST(Meet, ARankGivenTwiceEndsEveryProcessSayingWhich) {
  const std::string where = "file:" + temp_folder();
  const auto errors = on_ranks(2, [&](int) {
    auto s = open_store(where, false, 10);
    meet(*s, env_of(0, 2, where), "h", 10);  // both were told rank 0
  });
  for (const auto& e : errors) EXPECT_NE(e.find("two processes were given rank 0"), std::string::npos) << e;
  fs::remove_all(where.substr(5));
}

TEST(Meet, ARankThatNeverComesIsNamedAfterTheTimeout) {
  const int port = free_port();
  const std::string where = fmt::format("tcp://127.0.0.1:{}", port);
  const auto t0 = std::chrono::steady_clock::now();
  auto s = open_store(where, true, 5);
  try {
    meet(*s, env_of(0, 3, where), "h", 0.5);  // ranks 1 and 2 never start
    ADD_FAILURE() << "met nobody";
  } catch (const SyncError& e) {
    EXPECT_NE(std::string(e.what()).find("ranks 1, 2 of 3 never joined the rendezvous"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
}

TEST(Meet, WorldSizesThatDifferEndEveryProcessSayingWhich) {
  const std::string where = "file:" + temp_folder();
  const auto errors = on_ranks(2, [&](int r) {
    auto s = open_store(where, false, 10);
    meet(*s, env_of(r, r == 0 ? 2 : 3, where), "h", 10);
  });
  for (const auto& e : errors)
    EXPECT_NE(e.find("was told the world has 3 processes and rank 0 that it has 2"), std::string::npos) << e;
  fs::remove_all(where.substr(5));
}

// ---- the Gloo group ------------------------------------------------------------------------------

TEST(GlooGroup, CollectivesGiveEveryRankTheAnswer) {
  if (!built_with_gloo()) GTEST_SKIP() << "built without Gloo";
  for (const std::string& where : {"file:" + temp_folder(), fmt::format("tcp://127.0.0.1:{}", free_port())}) {
    SCOPED_TRACE(where);
    const int n = 3;
    const auto errors = on_ranks(n, [&](int r) {
      auto g = ProcessGroup::create(env_of(r, n, where), 20);
      ASSERT_EQ(g->rank(), r);
      ASSERT_EQ(g->size(), n);
      EXPECT_EQ(g->transport_name(), "Gloo");
      EXPECT_EQ(g->peers().size(), static_cast<std::size_t>(n));
      EXPECT_EQ(g->allreduce_max(static_cast<double>(r) * 1.5), 3.0);
      std::vector<double> m = {static_cast<double>(r), -static_cast<double>(r)};
      g->allreduce_max(m);
      EXPECT_EQ(m, (std::vector<double>{2.0, 0.0}));
      // every element its own value on every rank, each checked: a reduction that dropped a rank, an
      // element, or a chunk of a large buffer (Gloo's ring splits it), or mixed up offsets, fails
      const auto value = [](int rank, std::size_t i) { return static_cast<float>((rank + 1) * 100000 + i); };
      const auto summed = [&](std::size_t i) { return value(0, i) + value(1, i) + value(2, i); };
      std::vector<float> v(100003);
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = value(r, i);
      g->allreduce_sum(v.data(), v.size());
      for (std::size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], summed(i)) << "element " << i;
      std::vector<float> red(1001);
      for (std::size_t i = 0; i < red.size(); ++i) red[i] = value(r, i);
      g->reduce_sum_to_root(red.data(), red.size());
      if (r == 0) {  // the root holds the sum (what the others hold afterwards is not defined)
        for (std::size_t i = 0; i < red.size(); ++i) ASSERT_EQ(red[i], summed(i)) << "element " << i;
      }
      std::vector<float> b(777);
      for (std::size_t i = 0; i < b.size(); ++i) b[i] = value(r, i);
      g->broadcast_from_root(b.data(), b.size());
      for (std::size_t i = 0; i < b.size(); ++i) ASSERT_EQ(b[i], value(0, i)) << "element " << i;
      EXPECT_EQ(g->allgather(std::vector<double>{static_cast<double>(r), 0.5}),
                (std::vector<double>{0, 0.5, 1, 0.5, 2, 0.5}));
      EXPECT_EQ(g->allgather(std::string(static_cast<std::size_t>(r), 'a')), (std::vector<std::string>{"", "a", "aa"}));
    });
    for (const auto& e : errors) EXPECT_EQ(e, "");
    if (where.rfind("file:", 0) == 0) {
      EXPECT_FALSE(fs::exists(where.substr(5))) << "rank 0 clears the store";
    }
  }
}

TEST(GlooGroup, AStalledPeerTimesOut) {
  if (!built_with_gloo()) GTEST_SKIP() << "built without Gloo";
  const std::string where = "file:" + temp_folder();
  std::promise<void> rank1_gone;
  auto gone = rank1_gone.get_future().share();
  const auto errors = on_ranks(2, [&](int r) {
    auto g = ProcessGroup::create(env_of(r, 2, where), 20);
    g->set_sync_timeout(0.5);
    if (r == 1) {  // stalls through rank 0's first collective and its asks, then leaves
      std::this_thread::sleep_for(std::chrono::seconds(5));
      g.reset();
      rank1_gone.set_value();
      return;
    }
    std::vector<float> v(100, 1.0f);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      g->allreduce_sum(v.data(), v.size());
      ADD_FAILURE() << "an all-reduce with a stalled peer completed";
    } catch (const SyncError& e) {
      // the silent rank is named, by its pid: the healthy one (rank 0) is not
      const std::string pid = std::to_string(getpid());
      EXPECT_NE(
          std::string(e.what()).find("did not complete within 0.5 s on process 0 of 2: rank 1 (pid " + pid + " on "),
          std::string::npos)
          << e.what();
      // it is there (its thread answers), but in its own work, not in the all-reduce
      EXPECT_NE(std::string(e.what()).find("answered from outside the group's calls"), std::string::npos) << e.what();
    }
    // the timeout, then the answer (at most the window for it, 2 s), not rank 1's 5 s
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 4.5);
    gone.wait();
    EXPECT_THROW(g->allreduce_sum(v.data(), v.size()), SyncError);  // ended after the failure, says so
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

// Three ranks, the last stalled in a collective: both healthy ranks time out and name it, and
// neither names the other (a message that named its own rank, or every rank, fails). Each keeps its
// group until both have their message: one that ended first would be gone when the other asks.
TEST(GlooGroup, TheWellRanksNameTheStalledOneNotEachOther) {
  if (!built_with_gloo()) GTEST_SKIP() << "built without Gloo";
  const std::string where = "file:" + temp_folder();
  std::vector<std::string> said(3);
  std::latch both(2);
  const auto errors = on_ranks(3, [&](int r) {
    auto g = ProcessGroup::create(env_of(r, 3, where), 20);
    g->set_sync_timeout(0.5);
    if (r == 2) {
      std::this_thread::sleep_for(std::chrono::seconds(5));
      return;
    }
    std::vector<float> v(1000, 1.0f);
    try {
      g->allreduce_sum(v.data(), v.size());
      ADD_FAILURE() << "an all-reduce with a stalled peer completed";
    } catch (const SyncError& e) {
      said[static_cast<std::size_t>(r)] = e.what();
    }
    both.arrive_and_wait();
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  for (int r : {0, 1}) {
    const std::string& m = said[static_cast<std::size_t>(r)];
    EXPECT_NE(m.find(fmt::format("on process {} of 3: rank 2 (pid {} on ", r, getpid())), std::string::npos) << m;
    EXPECT_EQ(m.find("ranks "), std::string::npos) << m;
  }
}

TEST(GlooGroup, ALostPeerFailsTheNextCollectiveAtOnce) {
  if (!built_with_gloo()) GTEST_SKIP() << "built without Gloo";
  const std::string where = "file:" + temp_folder();
  std::promise<void> rank1_gone;
  auto gone = rank1_gone.get_future().share();
  const auto errors = on_ranks(2, [&](int r) {
    auto g = ProcessGroup::create(env_of(r, 2, where), 30);
    if (r == 1) {  // leaves with nothing pending: its connections close
      g.reset();
      rank1_gone.set_value();
      return;
    }
    gone.wait();
    std::vector<float> v(100, 1.0f);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      g->allreduce_sum(v.data(), v.size());
      ADD_FAILURE() << "an all-reduce with a peer gone completed";
    } catch (const SyncError& e) {
      EXPECT_NE(std::string(e.what()).find("on process 0 of 2: rank 1 (pid "), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("did not answer within 7.5 s (stalled or ended)"), std::string::npos)
          << e.what();
    }
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0)
        << "a lost peer waited for the 30 s timeout";
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

// Four ranks: 0 asks who is silent, twice; 1 waits on the group meanwhile (ProcessGroup::Waiting, as
// a GPU collective's poll does), then asks too; 2 is in its own work; 3 has gone. Every ask names 3
// as gone, and neither 0 nor 1: the mesh answers every time (one that answered once would say "" the
// second time), and a rank waiting on the group, or failed in it, is not blamed. Rank 2 is named as
// stalled only once it has been outside the calls for the asks' stalled_s (1 s): the first ask, made
// at once with 5 s, leaves it out, as a well rank between two calls is left out when a peer dropped.
TEST(GlooGroup, EveryLivenessAskIsAnsweredAndNamesWhoIsOutsideTheGroup) {
  if (!built_with_gloo()) GTEST_SKIP() << "built without Gloo";
  const std::string where = "file:" + temp_folder();
  std::promise<void> three_gone, zero_asked, one_asked;
  auto gone = three_gone.get_future().share();
  auto zero = zero_asked.get_future().share();
  auto one = one_asked.get_future().share();
  std::vector<std::string> named;
  const auto errors = on_ranks(4, [&](int r) {
    auto g = ProcessGroup::create(env_of(r, 4, where), 30);
    if (r == 3) {
      g.reset();
      three_gone.set_value();
      return;
    }
    if (r == 2) {  // in its own work: answers, from outside every call
      one.wait();
      return;
    }
    if (r == 1) {
      {
        const auto w = g->waiting();
        zero.wait();
      }
      named.push_back(g->silent_ranks(2.0, 1.0));
      one_asked.set_value();
      return;
    }
    gone.wait();
    named.push_back(g->silent_ranks(2.0, 5.0));
    std::this_thread::sleep_for(std::chrono::milliseconds(1200));
    named.push_back(g->silent_ranks(2.0, 1.0));
    zero_asked.set_value();
    one.wait();
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  ASSERT_EQ(named.size(), 3u);
  const std::string pid = std::to_string(getpid());
  for (std::size_t i = 0; i < named.size(); ++i) {
    const std::string& m = named[i];
    EXPECT_EQ(m.rfind("rank 3 (pid " + pid + " on ", 0), 0u) << m;
    EXPECT_EQ(m.find(i < 2 ? "rank 1 " : "rank 0 "), std::string::npos) << "names a rank waiting or failed: " << m;
    if (i == 0) {
      EXPECT_EQ(m.find("rank 2 "), std::string::npos) << "named a rank outside the calls for less than 5 s: " << m;
      EXPECT_NE(m.find(") did not answer within 2 s (stalled or ended)"), std::string::npos) << m;
      continue;
    }
    EXPECT_NE(m.find(") did not answer within 2 s (stalled or ended); rank 2 (pid " + pid), std::string::npos) << m;
    EXPECT_NE(m.find(") answered from outside the group's calls, where it had been for "), std::string::npos) << m;
  }
}

// An abort from another thread does not wait for the collective in flight (which holds the group's
// lock until it fails at its timeout): it returns long before that timeout, and the peer's next
// call fails at once on the closed connection instead of at its own timeout.
TEST(GlooGroup, AnAbortDoesNotWaitForTheCollectiveInFlight) {
  if (!built_with_gloo()) GTEST_SKIP() << "built without Gloo";
  const std::string where = "file:" + temp_folder();
  constexpr double kTimeout = 5;
  std::promise<void> aborted;
  auto after = aborted.get_future().share();
  const auto errors = on_ranks(2, [&](int r) {
    auto g = ProcessGroup::create(env_of(r, 2, where), 30);
    g->set_sync_timeout(kTimeout);
    std::vector<float> v(1000, 1.0f);
    if (r == 1) {  // joins nothing until rank 0 aborted, then finds its connection gone
      after.wait();
      const auto t0 = std::chrono::steady_clock::now();
      EXPECT_THROW(g->allreduce_sum(v.data(), v.size()), SyncError);
      EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), kTimeout)
          << "the peer's call waited for its timeout: the aborting process's connections stayed up";
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto in_flight = std::async(std::launch::async, [&] { g->allreduce_sum(v.data(), v.size()); });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    g->abort(1);
    const double at = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    aborted.set_value();
    EXPECT_LT(at, kTimeout) << "abort waited for the collective in flight to time out";
    EXPECT_THROW(in_flight.get(), SyncError);
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

// Point to point (distributed_replicated's pushes and pulls): a receive that times out names the
// peer it waited for, after asking it (it answers: running, slow), and closes that peer's connection
// alone. This process's other connections carry on (a Gloo timeout would close every pair of the
// mesh, this process's server threads' too, and every other worker would then blame this process);
// the slow peer's next message to it fails and names it as the one that closed the connection.
TEST(GlooGroup, AMessageThatTimesOutClosesOnlyItsPeersConnection) {
  if (!built_with_gloo()) GTEST_SKIP() << "built without Gloo";
  const std::string where = "file:" + temp_folder();
  std::promise<void> failed;
  auto zero_failed = failed.get_future().share();
  std::string said, slow_said;
  const auto errors = on_ranks(3, [&](int r) {
    auto g = ProcessGroup::create(env_of(r, 3, where), 30, true);
    g->set_sync_timeout(0.5);
    int x = 0;
    if (r == 0) {
      try {
        g->recv({1}, &x, sizeof x, 7, false);  // rank 1 is slow: it sends nothing in time
        ADD_FAILURE() << "a receive from a silent peer completed";
      } catch (const SyncError& e) {
        said = e.what();
      }
      failed.set_value();
      x = 0;
      EXPECT_EQ(g->recv({2}, &x, sizeof x, 8, false), 2);  // the other connection still works
      EXPECT_EQ(x, 42);
      x = 43;
      g->send(2, &x, sizeof x, 9);
      return;
    }
    zero_failed.wait();
    if (r == 2) {
      x = 42;
      g->send(0, &x, sizeof x, 8);
      EXPECT_EQ(g->recv({0}, &x, sizeof x, 9, false), 0);
      EXPECT_EQ(x, 43);
      EXPECT_EQ(g->recv({1}, &x, sizeof x, 10, false), 1);
      EXPECT_EQ(x, 44);
      return;
    }
    x = 44;
    g->send(2, &x, sizeof x, 10);  // the slow rank's other connections work too
    try {
      g->send(0, &x, sizeof x, 7);  // too late: rank 0 closed this connection
      ADD_FAILURE() << "a message on a connection the peer closed went";
    } catch (const SyncError& e) {
      slow_said = e.what();
    }
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  const std::string pid = std::to_string(getpid());
  EXPECT_NE(said.find("a message from rank 1 (pid " + pid + " on "), std::string::npos) << said;
  EXPECT_NE(said.find("did not complete within 0.5 s on process 0 of 3: rank 1 (pid " + pid), std::string::npos)
      << said;
  // it answered, from its own work (outside every call since before the receive began): named as such
  EXPECT_NE(said.find(") answered from outside the group's calls, where it had been for "), std::string::npos) << said;
  EXPECT_NE(slow_said.find("a message to rank 0 (pid " + pid), std::string::npos) << slow_said;
  EXPECT_NE(slow_said.find("on process 1 of 3: rank 0 (pid " + pid), std::string::npos) << slow_said;
}

// ---- the two levels (distributed_all_reduce) -----------------------------------------------------

TEST(Levels, MembersComeFromEachRanksNodeAndLocalRank) {
  // 4 ranks dealt to 2 nodes in turn (srun's cyclic distribution): rank r is local rank r / 2 of node r % 2
  const std::vector<int> pairs = {0, 0, 1, 0, 0, 1, 1, 1};
  std::string why;
  auto [within, across] = level_members(pairs, 1, 1, 2, 2, why);  // rank 3
  EXPECT_EQ(within, (std::vector<int>{1, 3}));
  EXPECT_EQ(across, (std::vector<int>{2, 3}));
  EXPECT_EQ(why, "");
  std::tie(within, across) = level_members({0, 0, 0, 1, 1, 0, 0, 1}, 0, 0, 2, 2, why);
  EXPECT_TRUE(within.empty());
  EXPECT_EQ(why, "ranks 1 and 3 are both local rank 1 of node 0");
  std::tie(within, across) = level_members({0, 0, 0, 1, 1, 0}, 0, 0, 2, 2, why);
  EXPECT_TRUE(within.empty());
  EXPECT_EQ(why, "3 processes do not fill 2 nodes of 2");
}

// Across hosts each host is a node: its place in the order of the hosts' first ranks; the local rank
// the rank's place on its host; not on one host (the launcher's nodes stay) nor where
// --procs-per-node posed nodes.
TEST(Levels, NodesComeFromTheHostsAcrossHosts) {
  const auto peers = [](std::vector<std::string> hosts) {
    std::vector<PeerInfo> p;
    for (auto& h : hosts) p.push_back({h, 1});
    return p;
  };
  LaunchEnv e;
  e.size = 4;
  e.rank = 2;
  e.local_size = 4;  // what a launcher without local variables says: all on this node
  e.local_rank = 2;
  const auto cyclic = peers({"b", "a", "b", "a"});  // dealt in turn; b comes first
  ASSERT_TRUE(place_by_host(cyclic, e));
  EXPECT_EQ(e.node, 0);
  EXPECT_EQ(e.nodes, 2);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_size, 2);
  e.rank = 1;
  ASSERT_TRUE(place_by_host(cyclic, e));
  EXPECT_EQ(e.node, 1);
  EXPECT_EQ(e.local_rank, 0);
  // three on one host, one on another: this host's size (no two levels: level_members refuses them)
  e.rank = 3;
  ASSERT_TRUE(place_by_host(peers({"a", "a", "b", "a"}), e));
  EXPECT_EQ(e.node, 0);
  EXPECT_EQ(e.local_rank, 2);
  EXPECT_EQ(e.local_size, 3);
  // one host: the launcher's placement (posing as nodes, --nodes) is kept
  LaunchEnv one;
  one.size = 4;
  one.rank = 3;
  one.node = 1;
  one.nodes = 2;
  one.local_rank = 1;
  one.local_size = 2;
  EXPECT_FALSE(place_by_host(peers({"a", "a", "a", "a"}), one));
  EXPECT_EQ(one.node, 1);
  EXPECT_EQ(one.local_size, 2);
  // --procs-per-node: its nodes stay, across hosts too
  one.nodes_given = true;
  EXPECT_TRUE(place_by_host(cyclic, one));
  EXPECT_EQ(one.node, 1);
  EXPECT_EQ(one.local_rank, 1);
}

// A process's levels share what it is doing: a rank waiting in a within-node call is in a call to an
// across-nodes ask too (each level's transport with its own state would call it idle there, and
// name it as stalled); once it leaves the call, the same ask names it.
TEST(GlooGroup, ARankWaitingInOneLevelIsInACallToTheOther) {
  if (!built_with_gloo()) GTEST_SKIP() << "built without Gloo";
  const std::string where = "file:" + temp_folder();
  std::promise<void> asked_once, left_call, finished;
  auto once = asked_once.get_future().share();
  auto left = left_call.get_future().share();
  auto done = finished.get_future().share();
  std::string while_waiting, after;
  const auto errors = on_ranks(4, [&](int r) {
    LaunchEnv e = env_of(r, 4, where);
    e.node = r % 2;
    e.nodes = 2;
    e.local_rank = r / 2;
    e.local_size = 2;
    auto g = ProcessGroup::create(e, 20);
    ASSERT_TRUE(g->has_levels()) << g->levels_why();
    if (r == 1) {  // node 1's first rank: in a call of its node's level, then outside every call
      {
        const auto w = g->within_node().waiting();
        once.wait();
      }
      left_call.set_value();
    } else if (r == 0) {  // node 0's: asks across the nodes, rank 1 its only peer there
      std::this_thread::sleep_for(std::chrono::milliseconds(600));
      while_waiting = g->across_nodes().silent_ranks(2.0, 0.3);
      asked_once.set_value();
      left.wait();
      std::this_thread::sleep_for(std::chrono::milliseconds(600));
      after = g->across_nodes().silent_ranks(2.0, 0.3);
      finished.set_value();
    }
    done.wait();  // no group goes before the asks are done
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(while_waiting, "") << "a rank in a within-node call was named from across the nodes";
  EXPECT_EQ(after.rfind(fmt::format("rank 1 (pid {} on ", getpid()), 0), 0u) << after;
  EXPECT_NE(after.find(") answered from outside the group's calls"), std::string::npos) << after;
}

TEST(GlooGroup, TwoLevelsSumEveryElementAsTheFlatAllReduceDoes) {
  if (!built_with_gloo()) GTEST_SKIP() << "built without Gloo";
  const std::string where = "file:" + temp_folder();
  const auto value = [](int rank, std::size_t i) { return static_cast<float>((rank + 1) * 100000 + i); };
  const auto errors = on_ranks(4, [&](int r) {
    LaunchEnv e = env_of(r, 4, where);
    e.node = r % 2;  // dealt in turn: each level's members are not consecutive ranks
    e.nodes = 2;
    e.local_rank = r / 2;
    e.local_size = 2;
    auto g = ProcessGroup::create(e, 20);
    ASSERT_TRUE(g->has_levels()) << g->levels_why();
    const ProcessGroup& in = g->within_node();
    const ProcessGroup& across = g->across_nodes();
    ASSERT_EQ(in.size(), 2);
    ASSERT_EQ(across.size(), 2);
    EXPECT_EQ(in.rank(), r / 2);
    EXPECT_EQ(across.rank(), r % 2);
    EXPECT_EQ(in.world_rank(), r);
    EXPECT_EQ(in.world_size(), 4);
    // a level names its members by their ranks in the whole group
    EXPECT_EQ(in.name_ranks({1 - r / 2}).substr(0, 7), fmt::format("rank {} ", r % 2 + 2 * (1 - r / 2)));
    // every element its own value: a shard summed twice, skipped or sent to the wrong owner fails
    auto cpu = make_backend(BackendKind::cpu);
    std::vector<float> v(100003);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = value(r, i);
    auto coll = make_host_collective(*cpu, 1, *g, true);
    std::vector<float*> bufs = {v.data()};
    coll->allreduce_average(bufs, 1, v.size() - 1);  // at an offset: the shards start within it
    for (std::size_t i = 1; i < v.size(); ++i) {
      const float sum = value(0, i) + value(1, i) + value(2, i) + value(3, i);
      ASSERT_EQ(v[i], sum / 4) << "element " << i;
    }
    ASSERT_EQ(v[0], value(r, 0)) << "outside the range";
    const auto levels = coll->levels();
    ASSERT_EQ(levels.size(), 3u);
    for (const auto& l : levels) EXPECT_EQ(l.calls, 1) << l.name;
    EXPECT_EQ(levels[0].bytes, 100002.0 * 4);
    EXPECT_EQ(levels[1].bytes, 50001.0 * 4);  // this process's half
    EXPECT_EQ(levels[2].bus_factor, 0.5);
    EXPECT_EQ(levels[1].bus_factor, 1.0);
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  EXPECT_FALSE(fs::exists(where.substr(5))) << "rank 0 clears the store, the levels' keys too";
}

}  // namespace
}  // namespace stepbench
