// The CPUs and NUMA nodes this process may use (Linux sysfs and its affinity mask), and where the
// CPU kernels' threads and the weights' pages go on them: the --numa policies.
//
// Why: on a multi-socket host a thread reading weights from the other socket's memory gets a
// fraction of its own socket's bandwidth, and decode is bandwidth-bound. The policies follow the
// ones llama.cpp's users know (--numa distribute|isolate|numactl) so that a deployment moves over
// unchanged; what each does is in docs/ARCHITECTURE.md ("CPU placement").
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace dsinfer {

// The kernel's list format (sysfs cpulist files, node lists, taskset -c): "0-3,8,10-11" ->
// {0, 1, 2, 3, 8, 10, 11}, ascending and distinct. Blank text (a node without CPUs) -> {}.
// Anything else (a reversed range, a stray character, an id past 65535, more than 65536 ids named
// with duplicates counted) -> InvalidArgument quoting the text.
Result<std::vector<int>> ParseCpuList(std::string_view text);

// Back to the list format, ranges collapsed ({0, 1, 2, 5} -> "0-2,5").
std::string FormatCpuList(const std::vector<int>& cpus);

struct NumaNode {
  int id = 0;
  std::vector<int> cpus;      // the node's CPUs this process may run on, ascending
  int64_t memory_bytes = -1;  // the node's MemTotal; -1 when sysfs does not say
};

struct CpuTopology {
  // Ascending by id. Nodes without an allowed CPU are kept (their memory can still hold pages).
  std::vector<NumaNode> nodes;
  // Physical core of each allowed CPU: package id * 2^20 + core id (SMT siblings share it);
  // absent where sysfs does not say (the CPU then counts as a core of its own).
  std::map<int, int64_t> core_of_cpu;

  // Nodes that have at least one allowed CPU.
  int NodesWithCpus() const;
  // The node a CPU belongs to, -1 if none lists it.
  int NodeOfCpu(int cpu) const;
};

// The CPUs this process may run on (sched_getaffinity: taskset, numactl, a container's cpuset),
// ascending. Falls back to 0 .. hardware_concurrency - 1 when the call fails.
std::vector<int> AllowedCpus();

// Reads `sysfs_root`/devices/system/node/node<N>/{cpulist,meminfo} and
// `sysfs_root`/devices/system/cpu/cpu<N>/topology/{physical_package_id,core_id} (sysfs_root is
// "/sys"; tests pass a tree of their own), keeping only the CPUs in `allowed`. A kernel built
// without NUMA has no node directory: every allowed CPU is then on node 0. Malformed files ->
// InvalidArgument naming the file; an allowed CPU that no node lists -> node 0's too (the kernel
// lists every online CPU, so this only happens with a damaged tree).
Result<CpuTopology> ReadCpuTopology(const std::string& sysfs_root, const std::vector<int>& allowed);

// --numa: where the CPU backend's threads and the copied weights go.
enum class NumaPolicy {
  kOff,         // the scheduler places threads, first touch places pages (the default)
  kDistribute,  // threads spread evenly over the nodes, each pinned to one CPU; the weights'
                // pages interleaved over those nodes, so every node's memory serves reads
  kIsolate,     // threads only on the node the process started on, pinned; the weights'
                // pages preferred on that node
  kNumactl,     // threads pinned to the CPUs the affinity mask allows (numactl --cpunodebind,
                // taskset), memory as the process's own policy says (numactl --membind / -i)
};
// "off", "distribute", "isolate", "numactl"; nullopt otherwise.
std::optional<NumaPolicy> ParseNumaPolicy(std::string_view name);
std::string_view NumaPolicyName(NumaPolicy policy);

// How a memory range's pages are placed (mbind).
struct MemoryPlacement {
  enum class Mode {
    kDefault,     // the process's policy (first touch unless numactl set one)
    kInterleave,  // page by page over `nodes`
    kPreferred,   // on nodes[0] while it has room, else elsewhere (never an allocation failure)
  };
  Mode mode = Mode::kDefault;
  std::vector<int> nodes;
};

// Where the CPU backend's threads and the weights go: the result of PlanCpuPlacement.
struct CpuPlacement {
  int n_threads = 0;  // PlanCpuPlacement sets it; 0 (a default-made one): one per allowed CPU
  // cpus[i]: the CPU thread i is pinned to (thread 0 is the pool's caller, see ThreadPool);
  // empty: no thread is pinned.
  std::vector<int> cpus;
  MemoryPlacement weights;
  int numa_nodes = 1;   // NUMA nodes on this machine (CpuTopology::nodes)
  std::string summary;  // one line for logs and `doctor`: policy, nodes, threads
};

// The plan for `policy` on `topology` with `n_threads` threads (0: one per CPU the policy uses).
// `start_cpu` is the CPU the process runs on now (sched_getcpu), which picks kIsolate's node.
// CPUs are taken one physical core at a time before any SMT sibling, and under kDistribute in
// turn from each node; more threads than CPUs wrap around (stated in the summary). Pure.
Result<CpuPlacement> PlanCpuPlacement(const CpuTopology& topology, NumaPolicy policy, int n_threads,
                                      int start_cpu);

// The plan for this machine: AllowedCpus, ReadCpuTopology("/sys"), sched_getcpu.
Result<CpuPlacement> PlanCpuPlacementHere(NumaPolicy policy, int n_threads);

// Pins the calling thread to one CPU (sched_setaffinity).
Status PinCurrentThread(int cpu);

// Applies `placement` to the pages of [addr, addr + bytes) not yet touched (mbind; addr is page
// aligned). kDefault does nothing. Fails with the errno when the kernel refuses (no NUMA
// support, a node outside the process's cpuset).
Status PlaceMemory(void* addr, size_t bytes, const MemoryPlacement& placement);

// The node each of `pages` (page-aligned addresses, touched) is on now (move_pages' query form),
// -1 for a page the kernel cannot say for. For tests and `doctor`.
Result<std::vector<int>> NodesOfPages(const std::vector<const void*>& pages);

// The mbind policy mode of the mapping holding `addr` (get_mempolicy MPOL_F_ADDR): the
// MemoryPlacement mode it corresponds to, or nullopt for a mode dsinfer does not set. For tests.
Result<std::optional<MemoryPlacement::Mode>> MemoryPlacementAt(const void* addr);

}  // namespace dsinfer
