// CPU topology and placement (--numa): the cpulist parser, the sysfs reader on trees of several
// nodes with SMT siblings and a restricted affinity mask, the plans of every policy, and, on this
// machine, that threads really run on the CPUs they were pinned to and that memory really gets
// the policy asked for (mbind) before its pages are touched.
#include "core/cpu_topology.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "core/thread_pool.h"

namespace dsinfer {
namespace {

namespace fs = std::filesystem;
using Mode = MemoryPlacement::Mode;

TEST(CpuList, ParsesTheKernelFormat) {
  EXPECT_EQ(*ParseCpuList("0"), (std::vector<int>{0}));
  EXPECT_EQ(*ParseCpuList("0-3,8,10-11\n"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(*ParseCpuList("3,1,1-2"), (std::vector<int>{1, 2, 3}));  // sorted, distinct
  EXPECT_TRUE(ParseCpuList("")->empty());                            // a memory-only node
  EXPECT_TRUE(ParseCpuList("\n")->empty());
  EXPECT_EQ(*ParseCpuList("5-5"), (std::vector<int>{5}));
  EXPECT_EQ(ParseCpuList("0-65535")->size(), 65536u);  // the most ids a list may name
}

TEST(CpuList, RefusesMalformedLists) {
  for (const char* bad : {"a", "1-", "-1", "3-1", "1,,2", "1 2", ",1", "1,", "0-65536", "65536",
                          "99999999999", "1-2-3", "0x1", "1\n2", "0-65535,0"}) {
    const Result<std::vector<int>> parsed = ParseCpuList(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(parsed.status().message().find("malformed CPU list"), std::string::npos) << bad;
  }
}

TEST(CpuList, FormatsRangesAndRoundTrips) {
  EXPECT_EQ(FormatCpuList({}), "");
  EXPECT_EQ(FormatCpuList({0, 1, 2, 5}), "0-2,5");
  EXPECT_EQ(FormatCpuList({1, 3, 4, 5, 7}), "1,3-5,7");
  for (const char* text : {"0", "0-3,8,10-11", "2,4,6", "0-127"})
    EXPECT_EQ(FormatCpuList(*ParseCpuList(text)), text);
}

// A sysfs tree under a temporary directory.
class FakeSysfs {
 public:
  FakeSysfs() {
    root_ = fs::temp_directory_path() /
            ("dsinfer_sysfs_" + std::to_string(getpid()) + "_" + std::to_string(counter_++));
    fs::create_directories(root_);
  }
  ~FakeSysfs() { fs::remove_all(root_); }
  void Write(const std::string& path, const std::string& text) {
    fs::create_directories((root_ / path).parent_path());
    std::ofstream(root_ / path) << text;
  }
  void Node(int id, const std::string& cpulist, int64_t mem_kib) {
    const std::string dir = "devices/system/node/node" + std::to_string(id);
    Write(dir + "/cpulist", cpulist + "\n");
    Write(dir + "/meminfo", "Node " + std::to_string(id) +
                                " MemTotal:       " + std::to_string(mem_kib) + " kB\nNode " +
                                std::to_string(id) + " MemFree:        1 kB\n");
  }
  void Core(int cpu, int package, int core) {
    const std::string dir = "devices/system/cpu/cpu" + std::to_string(cpu) + "/topology";
    Write(dir + "/physical_package_id", std::to_string(package) + "\n");
    Write(dir + "/core_id", std::to_string(core) + "\n");
  }
  std::string root() const { return root_.string(); }

 private:
  static inline int counter_ = 0;  // distinct trees within one test process
  fs::path root_;
};

// Two sockets of two cores with two SMT siblings each, numbered the way AMD does (siblings
// adjacent): node 0 = CPUs 0-3 (cores 0, 0, 1, 1), node 1 = CPUs 4-7; plus a memory-only node 2.
void TwoSocketsWithSmt(FakeSysfs& sys) {
  sys.Node(0, "0-3", 1024);
  sys.Node(1, "4-7", 2048);
  sys.Node(2, "", 4096);
  for (int cpu = 0; cpu < 8; ++cpu) sys.Core(cpu, cpu / 4, cpu % 4 / 2);
  sys.Write("devices/system/node/possible", "0-2\n");  // not a node directory: ignored
}

const std::vector<int> kAllEight = {0, 1, 2, 3, 4, 5, 6, 7};

TEST(CpuTopologyRead, NodesCpusMemoryAndCores) {
  FakeSysfs sys;
  TwoSocketsWithSmt(sys);
  const Result<CpuTopology> topo = ReadCpuTopology(sys.root(), kAllEight);
  ASSERT_TRUE(topo.ok()) << topo.status().ToString();
  ASSERT_EQ(topo->nodes.size(), 3u);
  EXPECT_EQ(topo->nodes[0].cpus, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(topo->nodes[1].cpus, (std::vector<int>{4, 5, 6, 7}));
  EXPECT_TRUE(topo->nodes[2].cpus.empty());
  EXPECT_EQ(topo->nodes[1].memory_bytes, 2048 * 1024);
  EXPECT_EQ(topo->NodesWithCpus(), 2);
  EXPECT_EQ(topo->NodeOfCpu(6), 1);
  EXPECT_EQ(topo->NodeOfCpu(9), -1);
  EXPECT_EQ(topo->core_of_cpu.at(0), topo->core_of_cpu.at(1));  // siblings
  EXPECT_NE(topo->core_of_cpu.at(1), topo->core_of_cpu.at(2));
  EXPECT_NE(topo->core_of_cpu.at(0), topo->core_of_cpu.at(4));  // same core id, other package
}

TEST(CpuTopologyRead, KeepsOnlyTheAllowedCpus) {
  FakeSysfs sys;
  TwoSocketsWithSmt(sys);
  const Result<CpuTopology> topo = ReadCpuTopology(sys.root(), {1, 5, 6});  // taskset -c 1,5,6
  ASSERT_TRUE(topo.ok());
  EXPECT_EQ(topo->nodes[0].cpus, (std::vector<int>{1}));
  EXPECT_EQ(topo->nodes[1].cpus, (std::vector<int>{5, 6}));
  EXPECT_EQ(topo->core_of_cpu.size(), 3u);
}

TEST(CpuTopologyRead, WithoutNumaEveryCpuIsOnNodeZero) {
  FakeSysfs sys;  // no devices/system/node: a kernel built without NUMA
  const Result<CpuTopology> topo = ReadCpuTopology(sys.root(), {0, 1, 2});
  ASSERT_TRUE(topo.ok());
  ASSERT_EQ(topo->nodes.size(), 1u);
  EXPECT_EQ(topo->nodes[0].id, 0);
  EXPECT_EQ(topo->nodes[0].cpus, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(topo->nodes[0].memory_bytes, -1);
  EXPECT_TRUE(topo->core_of_cpu.empty());
}

TEST(CpuTopologyRead, AnUnlistedAllowedCpuJoinsTheFirstNode) {
  FakeSysfs sys;
  sys.Node(0, "0-1", 1);
  sys.Node(1, "2-3", 1);
  const Result<CpuTopology> topo = ReadCpuTopology(sys.root(), {0, 2, 9});
  ASSERT_TRUE(topo.ok());
  EXPECT_EQ(topo->nodes[0].cpus, (std::vector<int>{0, 9}));
  EXPECT_EQ(topo->nodes[1].cpus, (std::vector<int>{2}));
}

TEST(CpuTopologyRead, MalformedFilesAreNamed) {
  {
    FakeSysfs sys;
    sys.Node(0, "0-1", 1);
    sys.Write("devices/system/node/node1/cpulist", "2-x\n");
    const Result<CpuTopology> topo = ReadCpuTopology(sys.root(), {0});
    ASSERT_FALSE(topo.ok());
    EXPECT_NE(topo.status().message().find("node1/cpulist"), std::string::npos)
        << topo.status().ToString();
  }
  {
    FakeSysfs sys;
    sys.Node(0, "0-1", 1);
    sys.Write("devices/system/node/node0/meminfo", "Node 0 MemTotal: lots\n");
    const Result<CpuTopology> topo = ReadCpuTopology(sys.root(), {0});
    ASSERT_FALSE(topo.ok());
    EXPECT_NE(topo.status().message().find("node0/meminfo"), std::string::npos);
  }
  {
    FakeSysfs sys;
    sys.Node(0, "0-1", 1);
    sys.Core(0, -1, 3);  // an unknown package: the CPU counts as a core of its own, no error
    const Result<CpuTopology> topo = ReadCpuTopology(sys.root(), {0, 1});
    ASSERT_TRUE(topo.ok());
    EXPECT_EQ(topo->core_of_cpu.count(0), 0u);
  }
  EXPECT_FALSE(ReadCpuTopology("/nonexistent", {}).ok());
}

CpuTopology TwoSocketTopology() {
  FakeSysfs sys;
  TwoSocketsWithSmt(sys);
  return *ReadCpuTopology(sys.root(), kAllEight);
}

TEST(CpuPlacementPlan, DistributeAlternatesNodesOneCoreBeforeItsSibling) {
  const CpuTopology topo = TwoSocketTopology();
  const Result<CpuPlacement> all = PlanCpuPlacement(topo, NumaPolicy::kDistribute, 0, 0);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->n_threads, 8);
  // Node 0 in cores-first order is 0, 2, 1, 3 (0 and 1 share a core); node 1's 4, 6, 5, 7.
  EXPECT_EQ(all->cpus, (std::vector<int>{0, 4, 2, 6, 1, 5, 3, 7}));
  EXPECT_EQ(all->weights.mode, Mode::kInterleave);
  EXPECT_EQ(all->weights.nodes, (std::vector<int>{0, 1}));  // not the memory-only node 2
  EXPECT_EQ(all->numa_nodes, 3);
  EXPECT_NE(all->summary.find("numa distribute: 8 threads pinned to CPUs 0-7 on nodes 0-1"),
            std::string::npos)
      << all->summary;
  EXPECT_NE(all->summary.find("interleaved over nodes 0-1"), std::string::npos) << all->summary;

  const Result<CpuPlacement> two = PlanCpuPlacement(topo, NumaPolicy::kDistribute, 2, 0);
  EXPECT_EQ(two->cpus, (std::vector<int>{0, 4}));
  EXPECT_EQ(two->weights.nodes, (std::vector<int>{0, 1}));
  const Result<CpuPlacement> one = PlanCpuPlacement(topo, NumaPolicy::kDistribute, 1, 0);
  EXPECT_EQ(one->cpus, (std::vector<int>{0}));
  EXPECT_EQ(one->weights.nodes, (std::vector<int>{0}));  // no pages where no thread reads
}

TEST(CpuPlacementPlan, IsolateStaysOnTheStartingNode) {
  const CpuTopology topo = TwoSocketTopology();
  const Result<CpuPlacement> plan = PlanCpuPlacement(topo, NumaPolicy::kIsolate, 0, 5);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->cpus, (std::vector<int>{4, 6, 5, 7}));
  EXPECT_EQ(plan->weights.mode, Mode::kPreferred);
  EXPECT_EQ(plan->weights.nodes, (std::vector<int>{1}));
  // More threads than the node has CPUs: they wrap around, and the summary says so.
  const Result<CpuPlacement> wide = PlanCpuPlacement(topo, NumaPolicy::kIsolate, 6, 5);
  EXPECT_EQ(wide->cpus, (std::vector<int>{4, 6, 5, 7, 4, 6}));
  EXPECT_NE(wide->summary.find("more threads than its 4 CPUs"), std::string::npos);
  // A start CPU outside the mask (the affinity changed since): the first node with CPUs.
  EXPECT_EQ(PlanCpuPlacement(topo, NumaPolicy::kIsolate, 0, 42)->weights.nodes,
            (std::vector<int>{0}));
}

TEST(CpuPlacementPlan, NumactlPinsTheMaskAndLeavesMemoryToTheProcess) {
  FakeSysfs sys;
  TwoSocketsWithSmt(sys);
  const CpuTopology topo = *ReadCpuTopology(sys.root(), {4, 5, 6, 7});  // --cpunodebind=1
  const Result<CpuPlacement> plan = PlanCpuPlacement(topo, NumaPolicy::kNumactl, 0, 4);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->cpus, (std::vector<int>{4, 6, 5, 7}));
  EXPECT_EQ(plan->weights.mode, Mode::kDefault);
  EXPECT_NE(plan->summary.find("the process's memory policy"), std::string::npos);
}

TEST(CpuPlacementPlan, OffPinsNothing) {
  const CpuTopology topo = TwoSocketTopology();
  const Result<CpuPlacement> plan = PlanCpuPlacement(topo, NumaPolicy::kOff, 0, 0);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->n_threads, 8);
  EXPECT_TRUE(plan->cpus.empty());
  EXPECT_EQ(plan->weights.mode, Mode::kDefault);
  EXPECT_EQ(PlanCpuPlacement(topo, NumaPolicy::kOff, 3, 0)->n_threads, 3);
  EXPECT_FALSE(PlanCpuPlacement(topo, NumaPolicy::kOff, -1, 0).ok());
  EXPECT_FALSE(PlanCpuPlacement(CpuTopology{}, NumaPolicy::kDistribute, 0, 0).ok());
}

TEST(NumaPolicyName, RoundTrips) {
  for (NumaPolicy p :
       {NumaPolicy::kOff, NumaPolicy::kDistribute, NumaPolicy::kIsolate, NumaPolicy::kNumactl})
    EXPECT_EQ(ParseNumaPolicy(NumaPolicyName(p)), p);
  EXPECT_FALSE(ParseNumaPolicy("interleave").has_value());
  EXPECT_FALSE(ParseNumaPolicy("").has_value());
}

TEST(CpuPlacementHere, PlansOnThisMachine) {
  const Result<CpuPlacement> plan = PlanCpuPlacementHere(NumaPolicy::kDistribute, 0);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->n_threads, static_cast<int>(AllowedCpus().size()));
  for (int cpu : plan->cpus) {
    const std::vector<int> allowed = AllowedCpus();
    EXPECT_TRUE(std::count(allowed.begin(), allowed.end(), cpu)) << cpu;
  }
}

// Runs fn on a thread of its own, so that affinity changes never reach the test runner's thread.
template <typename Fn>
void OnFreshThread(Fn fn) {
  std::thread(fn).join();
}

TEST(ThreadPoolPlacement, ThreadsRunOnTheCpusTheyWerePinnedTo) {
  const std::vector<int> allowed = AllowedCpus();
  if (allowed.size() < 2) GTEST_SKIP() << "needs two CPUs";
  // Reversed, so that the pins cannot match what the scheduler would have done anyway.
  const std::vector<int> cpus = {allowed[1], allowed[0]};
  OnFreshThread([&] {
    ThreadPool pool(2, cpus);
    ASSERT_TRUE(pool.placement_status().ok()) << pool.placement_status().ToString();
    EXPECT_EQ(pool.size(), 2);
    EXPECT_EQ(pool.cpus(), cpus);
    std::mutex mu;
    std::map<std::thread::id, std::set<int>> seen;  // thread -> the CPUs its tasks ran on
    for (int call = 0; call < 20; ++call)
      pool.ParallelFor(8, [&](int64_t) {
        std::this_thread::sleep_for(std::chrono::microseconds(300));  // let both threads take some
        std::lock_guard<std::mutex> lock(mu);
        seen[std::this_thread::get_id()].insert(sched_getcpu());
      });
    ASSERT_EQ(seen.size(), 2u);
    for (const auto& [id, on] : seen) {
      const int expected = id == std::this_thread::get_id() ? cpus[0] : cpus[1];
      EXPECT_EQ(on, std::set<int>{expected});
    }
  });
}

TEST(ThreadPoolPlacement, AFailedPinIsReported) {
  OnFreshThread([] {
    ThreadPool pool(2, {AllowedCpus()[0], CPU_SETSIZE - 1});  // no such CPU here
    const Status status = pool.placement_status();
    ASSERT_FALSE(status.ok());
    EXPECT_NE(status.message().find("cannot pin a thread to CPU"), std::string::npos)
        << status.ToString();
    std::atomic<int> ran = 0;
    pool.ParallelFor(10, [&](int64_t) { ran.fetch_add(1); });  // still a working pool
    EXPECT_EQ(ran.load(), 10);
  });
}

// The default thread count follows the affinity mask (taskset, numactl, a container's cpuset),
// not the machine's CPU count: one allowed CPU gives one thread.
TEST(ThreadPoolPlacement, DefaultThreadsFollowTheAffinityMask) {
  OnFreshThread([] {
    EXPECT_EQ(ThreadPool(0).size(), static_cast<int>(AllowedCpus().size()));
    ASSERT_TRUE(PinCurrentThread(AllowedCpus()[0]).ok());
    EXPECT_EQ(AllowedCpus().size(), 1u);
    EXPECT_EQ(ThreadPool(0).size(), 1);
  });
}

// mbind: the policy is set on the mapping before any page exists, and the pages land on the
// nodes asked for once touched. On a one-node machine that is node 0 for every policy, but the
// policy itself is visible (get_mempolicy) and a node that does not exist is refused.
TEST(MemoryPlacement, PolicyIsSetAndPagesLandOnTheNodes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t bytes = 64 * page;
  const Result<CpuPlacement> here = PlanCpuPlacementHere(NumaPolicy::kDistribute, 0);
  ASSERT_TRUE(here.ok());
  const std::vector<int> nodes = here->weights.nodes;
  for (const Mode mode : {Mode::kInterleave, Mode::kPreferred}) {
    void* region = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(region, MAP_FAILED);
    MemoryPlacement placement{mode, mode == Mode::kPreferred ? std::vector<int>{nodes[0]} : nodes};
    const Status placed = PlaceMemory(region, bytes, placement);
    if (!placed.ok() && placed.message().find("Function not implemented") != std::string::npos) {
      munmap(region, bytes);
      GTEST_SKIP() << "this kernel has no NUMA support: " << placed.ToString();
    }
    ASSERT_TRUE(placed.ok()) << placed.ToString();
    const auto at = MemoryPlacementAt(region);
    ASSERT_TRUE(at.ok()) << at.status().ToString();
    EXPECT_EQ(*at, mode);
    std::vector<const void*> pages;
    for (size_t off = 0; off < bytes; off += page) {
      static_cast<char*>(region)[off] = 1;  // first touch: allocated under the policy
      pages.push_back(static_cast<char*>(region) + off);
    }
    const Result<std::vector<int>> on = NodesOfPages(pages);
    ASSERT_TRUE(on.ok()) << on.status().ToString();
    for (int node : *on)
      EXPECT_TRUE(std::count(placement.nodes.begin(), placement.nodes.end(), node)) << node;
    munmap(region, bytes);
  }
  void* region = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(region, MAP_FAILED);
  EXPECT_TRUE(PlaceMemory(region, bytes, {}).ok());  // kDefault: nothing to do
  EXPECT_EQ(*MemoryPlacementAt(region), Mode::kDefault);
  const Status absent = PlaceMemory(region, bytes, {Mode::kInterleave, {1000}});
  EXPECT_FALSE(absent.ok());
  EXPECT_NE(absent.message().find("NUMA node 1000"), std::string::npos) << absent.ToString();
  EXPECT_FALSE(PlaceMemory(region, bytes, {Mode::kInterleave, {}}).ok());
  munmap(region, bytes);
}

}  // namespace
}  // namespace dsinfer
