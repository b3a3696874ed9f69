// Which launcher started a process and where it stands, from each launcher's variables; and the
// refusals when they are malformed or disagree.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "comm/collective.hpp"
#include "comm/launch_env.hpp"
#include "tensor/error.hpp"

namespace stepbench {
namespace {

using Vars = std::map<std::string, std::string>;

LaunchEnv discover(const Vars& v, const std::string& flag = "", bool with_mpi = true) {
  return discover_launch(
      [&v](const char* name) -> const char* {
        const auto it = v.find(name);
        return it == v.end() ? nullptr : it->second.c_str();
      },
      flag, with_mpi);
}

std::string refusal(const Vars& v, const std::string& flag = "", bool with_mpi = true) {
  try {
    discover(v, flag, with_mpi);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(LaunchEnv, NoLauncherIsOneProcess) {
  const LaunchEnv e = discover({{"HOME", "/root"}});
  EXPECT_EQ(e.launcher, Launcher::none);
  EXPECT_EQ(e.size, 1);
  EXPECT_FALSE(e.multi());
  EXPECT_NE(refusal({}, "file:/tmp/x").find("set RANK and WORLD_SIZE"), std::string::npos);
}

TEST(LaunchEnv, TorchrunsVariables) {
  const Vars v = {{"RANK", "3"},
                  {"WORLD_SIZE", "8"},
                  {"LOCAL_RANK", "1"},
                  {"LOCAL_WORLD_SIZE", "2"},
                  {"MASTER_ADDR", "node7"},
                  {"MASTER_PORT", "29500"}};
  LaunchEnv e = discover(v);
  EXPECT_EQ(e.launcher, Launcher::torchrun);
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_size, 2);
  EXPECT_EQ(e.rendezvous, "tcp://node7:29500");  // set by hand: the port is stepbench's
  Vars agent = v;
  agent["TORCHELASTIC_RUN_ID"] = "none";  // torchrun's agent holds MASTER_PORT with its own store
  EXPECT_EQ(discover(agent).rendezvous, "tcp://node7:29501");
  EXPECT_EQ(discover(agent, "file:/shared/rdv").rendezvous, "file:/shared/rdv");  // the flag wins
  // srun -N2 torchrun --nproc-per-node 8: the workers also see srun's variables (one task per node)
  Vars under_srun = agent;
  for (const auto& [k, val] : Vars{{"SLURM_PROCID", "1"},
                                   {"SLURM_STEP_NUM_TASKS", "2"},
                                   {"SLURM_LOCALID", "0"},
                                   {"SLURM_NODEID", "1"},
                                   {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"}})
    under_srun[k] = val;
  const LaunchEnv inner = discover(under_srun);
  EXPECT_EQ(inner.launcher, Launcher::torchrun);
  EXPECT_EQ(inner.rank, 3);
  EXPECT_EQ(inner.size, 8);
}

TEST(LaunchEnv, StepbenchLaunchUsesItsFolder) {
  const Vars v = {{"STEPBENCH_LAUNCHER", "stepbench"},
                  {"RANK", "1"},
                  {"WORLD_SIZE", "2"},
                  {"LOCAL_RANK", "1"},
                  {"LOCAL_WORLD_SIZE", "2"},
                  {"STEPBENCH_RENDEZVOUS", "file:/tmp/stepbench-launch-x"}};
  const LaunchEnv e = discover(v);
  EXPECT_EQ(e.launcher, Launcher::stepbench);
  EXPECT_EQ(e.rendezvous, "file:/tmp/stepbench-launch-x");
  EXPECT_EQ(e.rank, 1);
  Vars other = v;
  other["STEPBENCH_LAUNCHER"] = "someone";
  EXPECT_NE(refusal(other).find("only stepbench launch sets it"), std::string::npos);
}

TEST(LaunchEnv, OpenMpisVariables) {
  const Vars v = {{"OMPI_COMM_WORLD_RANK", "1"},
                  {"OMPI_COMM_WORLD_SIZE", "4"},
                  {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                  {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}};
  LaunchEnv e = discover(v);
  EXPECT_EQ(e.launcher, Launcher::mpi);
  EXPECT_EQ(e.rendezvous, "mpi");
  EXPECT_EQ(e.local_size, 2);
  // built without MPI: the ranks meet through a store, given with --rendezvous
  EXPECT_NE(refusal(v, "", false).find("--rendezvous file:PATH"), std::string::npos);
  e = discover(v, "file:/tmp/r", false);
  EXPECT_EQ(e.rendezvous, "file:/tmp/r");
  EXPECT_EQ(e.rank, 1);
  // PMIx alone names a rank but no world size: MPI must say it, or RANK and WORLD_SIZE
  EXPECT_EQ(discover({{"PMIX_RANK", "1"}}).rendezvous, "mpi");
  EXPECT_NE(refusal({{"PMIX_RANK", "1"}}, "file:/tmp/r", false).find("says no world size"), std::string::npos);
}

TEST(LaunchEnv, SrunsVariables) {
  Vars v = {{"SLURM_PROCID", "5"},
            {"SLURM_STEP_NUM_TASKS", "6"},
            {"SLURM_LOCALID", "1"},
            {"SLURM_NODEID", "2"},
            {"SLURM_STEP_TASKS_PER_NODE", "2(x3)"},
            {"SLURM_STEP_NODELIST", "gpu[07-09]"},
            {"SLURM_JOB_ID", "1234"},
            {"SLURM_STEP_ID", "2"}};
  LaunchEnv e = discover(v);
  EXPECT_EQ(e.launcher, Launcher::slurm);
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.size, 6);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_size, 2);
  EXPECT_EQ(e.rendezvous, fmt::format("tcp://gpu07:{}", 15000 + (1234 * 16 + 2) % 20000));
  v["MASTER_ADDR"] = "gpu07";  // exported by the job script: taken as torchrun's
  v["MASTER_PORT"] = "6000";
  EXPECT_EQ(discover(v).rendezvous, "tcp://gpu07:6000");
  // srun with PMI into an MPI build: MPI's ranks
  v["PMIX_RANK"] = "5";
  EXPECT_EQ(discover(v).launcher, Launcher::mpi);
  EXPECT_EQ(discover(v, "", false).launcher, Launcher::slurm);
}

// The node a process is on, of how many: each launcher's way, and the refusals where they disagree.
TEST(LaunchEnv, EachLaunchersNodeAndNodeCount) {
  const Vars torchrun = {{"RANK", "3"},         {"WORLD_SIZE", "8"},     {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
                         {"MASTER_ADDR", "n0"}, {"MASTER_PORT", "29500"}};
  LaunchEnv e = discover(torchrun);  // no GROUP_RANK: the rank over the processes per node
  EXPECT_EQ(e.node, 1);
  EXPECT_EQ(e.nodes, 4);
  Vars g = torchrun;
  g["GROUP_RANK"] = "2";  // torchrun's (and stepbench launch --nodes'): taken as it is
  e = discover(g);
  EXPECT_EQ(e.node, 2);
  EXPECT_EQ(e.nodes, 4);
  g["GROUP_RANK"] = "4";
  EXPECT_NE(refusal(g).find("node 4 is outside the 4 nodes"), std::string::npos) << refusal(g);
  g["GROUP_RANK"] = "1";
  g["LOCAL_WORLD_SIZE"] = "3";  // 8 processes in nodes of 3
  EXPECT_NE(refusal(g).find("8 processes do not fill nodes of 3"), std::string::npos) << refusal(g);
  const Vars mpi = {{"OMPI_COMM_WORLD_RANK", "3"},
                    {"OMPI_COMM_WORLD_SIZE", "4"},
                    {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                    {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}};
  e = discover(mpi);
  EXPECT_EQ(e.node, 1);
  EXPECT_EQ(e.nodes, 2);
  const Vars srun = {{"SLURM_PROCID", "5"},
                     {"SLURM_STEP_NUM_TASKS", "6"},
                     {"SLURM_LOCALID", "1"},
                     {"SLURM_NODEID", "2"},
                     {"SLURM_NNODES", "3"},
                     {"SLURM_STEP_TASKS_PER_NODE", "2(x3)"},
                     {"SLURM_STEP_NODELIST", "g[1-3]"}};
  e = discover(srun);
  EXPECT_EQ(e.node, 2);
  EXPECT_EQ(e.nodes, 3);
  e = discover({{"RANK", "0"}, {"WORLD_SIZE", "2"}}, "file:/tmp/x");  // no local variables: one node
  EXPECT_EQ(e.node, 0);
  EXPECT_EQ(e.nodes, 1);
}

TEST(LaunchEnv, SlurmsForms) {
  EXPECT_EQ(slurm_first_host("node[07-09,12],gpu1"), "node07");
  EXPECT_EQ(slurm_first_host("a1,a2"), "a1");
  EXPECT_EQ(slurm_first_host("solo"), "solo");
  EXPECT_EQ(slurm_first_host("n[3,5]"), "n3");
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 0), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 2), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 3), 1);
  EXPECT_EQ(slurm_tasks_on_node("4", 0), 4);
  EXPECT_THROW(slurm_tasks_on_node("2(x3),1", 4), UsageError);
  EXPECT_THROW(slurm_tasks_on_node("x", 0), UsageError);
}

TEST(LaunchEnv, MalformedOrDisagreeingVariablesAreRefusedNamingThem) {
  const Vars base = {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}};
  auto with = [&](const std::string& k, const std::string& val) {
    Vars v = base;
    if (val.empty())
      v.erase(k);
    else
      v[k] = val;
    return refusal(v);
  };
  EXPECT_NE(with("RANK", "2").find("outside the world"), std::string::npos);
  EXPECT_NE(with("RANK", "one").find("RANK=one is not a whole number"), std::string::npos);
  EXPECT_NE(with("RANK", "-1").find("RANK=-1"), std::string::npos);
  EXPECT_NE(with("WORLD_SIZE", "").find("RANK is set but WORLD_SIZE is not"), std::string::npos);
  EXPECT_NE(with("WORLD_SIZE", "0").find("at least 1"), std::string::npos);
  EXPECT_NE(with("MASTER_ADDR", "").find("MASTER_ADDR is not set"), std::string::npos);
  EXPECT_NE(with("MASTER_PORT", "").find("MASTER_PORT is not"), std::string::npos);
  EXPECT_NE(with("MASTER_PORT", "70000").find("not a TCP port"), std::string::npos);
  EXPECT_NE(with("LOCAL_RANK", "0").find("LOCAL_RANK is set but LOCAL_WORLD_SIZE is not"), std::string::npos);
  Vars v = base;
  v["LOCAL_RANK"] = "2";
  v["LOCAL_WORLD_SIZE"] = "2";
  EXPECT_NE(refusal(v).find("local rank 2 is outside"), std::string::npos);
  v["LOCAL_RANK"] = "0";
  v["LOCAL_WORLD_SIZE"] = "3";
  EXPECT_NE(refusal(v).find("must be 1 to the world size"), std::string::npos);
  EXPECT_NE(refusal(base, "ftp://x").find("give file:PATH"), std::string::npos);
  EXPECT_NE(refusal(base, "tcp://host").find("give file:PATH"), std::string::npos);
  EXPECT_NE(refusal(base, "tcp://host:0").find("give file:PATH"), std::string::npos);
  EXPECT_EQ(refusal(base, "tcp://host:29500"), "(accepted)");
}

// What NCCL is told when ranks share a GPU, by the version loaded.
TEST(GpuSharing, WhatEachNcclVersionNeeds) {
  EXPECT_TRUE(nccl_gpu_sharing(23003, 2, 1, 1, 0, "h", false).env.empty());  // one rank in all: nothing at all
  const auto own = nccl_gpu_sharing(22807, 1, 1, 8, 3, "h", false);          // a GPU each: connect at initialisation
  ASSERT_EQ(own.env.size(), 1u);
  EXPECT_EQ(own.env[0].name, "NCCL_RUNTIME_CONNECT");
  EXPECT_EQ(own.env[0].value, "0");
  EXPECT_TRUE(own.how.empty());
  const auto multi = nccl_gpu_sharing(23003, 2, 1, 2, 1, "h", false);
  ASSERT_GE(multi.env.size(), 2u);
  EXPECT_EQ(multi.env[1].name, "NCCL_MULTI_RANK_GPU_ENABLE");
  EXPECT_FALSE(multi.env[1].overwrite);  // the user's own setting wins
  EXPECT_NE(multi.how.find("NCCL 2.30.3 with NCCL_MULTI_RANK_GPU_ENABLE=1"), std::string::npos) << multi.how;
  const auto host = nccl_gpu_sharing(22807, 2, 1, 2, 1, "node7", false);  // ranks on several hosts
  ASSERT_EQ(host.env.size(), 3u);
  EXPECT_EQ(host.env[1].name, "NCCL_HOSTID");
  EXPECT_EQ(host.env[1].value, "node7-stepbench-rank1");
  EXPECT_TRUE(host.env[1].overwrite);
  EXPECT_EQ(host.env[2].name, "NCCL_NET");  // sockets, not an InfiniBand loopback
  EXPECT_NE(nccl_gpu_sharing(22807, 2, 1, 2, 0, "node7", false).env[1].value, host.env[1].value);
  EXPECT_NE(host.how.find("sockets"), std::string::npos);
  // every rank on this host: the sockets on loopback, unless the user picked an interface
  const auto local = nccl_gpu_sharing(22807, 2, 1, 2, 1, "node7", true);
  ASSERT_EQ(local.env.size(), 4u);
  EXPECT_EQ(local.env[3].name, "NCCL_SOCKET_IFNAME");
  EXPECT_EQ(local.env[3].value, "lo");
  EXPECT_FALSE(local.env[3].overwrite);
  EXPECT_EQ(nccl_gpu_sharing(23003, 2, 1, 2, 1, "h", true).env.size(), multi.env.size());  // 2.30: no sockets
  const auto one = nccl_gpu_sharing(22807, 2, 2, 1, 0, "h", false);  // two towers of one process on one GPU
  EXPECT_TRUE(one.refused);
  EXPECT_NE(one.how.find("refuses before 2.30"), std::string::npos) << one.how;
  EXPECT_NE(one.how.find("stepbench launch --nproc 2 -- --gpus 1"), std::string::npos) << one.how;
  EXPECT_FALSE(nccl_gpu_sharing(23003, 2, 2, 1, 0, "h", false).refused);  // 2.30 takes it
}

}  // namespace
}  // namespace stepbench
