#include "core/cpu_topology.h"

#include <linux/mempolicy.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

namespace dsinfer {

namespace {

// Ids past this are refused, and so is a list naming more ids than this plus one (duplicates
// counted): the kernel's NR_CPUS (at most 8192) and MAX_NUMNODES (1024) are below it, and the
// bound keeps a damaged or hostile list ("0-2000000000", a range repeated a million times) to a
// fixed amount of work and memory. A fuzz run with a 2^20 bound spent 40 ms and 500 MB on some
// inputs.
constexpr int kMaxCpuId = (1 << 16) - 1;

std::string ErrnoText(int error) { return std::strerror(error); }

// The whole of a small sysfs file; nullopt when it cannot be read.
std::optional<std::string> ReadSmallFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// A non-negative decimal integer of a sysfs file (trailing newline allowed).
Result<int64_t> ReadInteger(const std::filesystem::path& path) {
  const std::optional<std::string> text = ReadSmallFile(path);
  if (!text) return IoError("cannot read " + path.string());
  int64_t value = 0;
  size_t i = 0;
  for (; i < text->size() && (*text)[i] >= '0' && (*text)[i] <= '9'; ++i) {
    if (value > (int64_t{1} << 40)) return InvalidArgument(path.string() + ": value too large");
    value = value * 10 + ((*text)[i] - '0');
  }
  if (i == 0 || text->find_first_not_of(" \n", i) != std::string::npos)
    return InvalidArgument(path.string() + ": not a number: \"" + *text + "\"");
  return value;
}

// "Node 0 MemTotal:  123456 kB" from a node's meminfo; -1 when the line is absent.
Result<int64_t> NodeMemTotal(const std::filesystem::path& path) {
  const std::optional<std::string> text = ReadSmallFile(path);
  if (!text) return int64_t{-1};
  std::istringstream lines(*text);
  for (std::string line; std::getline(lines, line);) {
    const size_t at = line.find("MemTotal:");
    if (at == std::string::npos) continue;
    std::istringstream fields(line.substr(at + 9));
    int64_t kib = -1;
    std::string unit;
    if (!(fields >> kib >> unit) || kib < 0 || unit != "kB")
      return InvalidArgument(path.string() + ": malformed MemTotal line \"" + line + "\"");
    return kib * 1024;
  }
  return int64_t{-1};
}

// "node12" -> 12; nullopt for other names.
std::optional<int> NodeDirectoryId(const std::string& name) {
  if (name.size() < 5 || name.compare(0, 4, "node") != 0) return std::nullopt;
  int id = 0;
  for (size_t i = 4; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || id > kMaxCpuId) return std::nullopt;
    id = id * 10 + (name[i] - '0');
  }
  return id;
}

// The CPUs of `cpus` with one from each physical core first, then the second SMT siblings, and
// so on; ascending within each round. A compute thread per core comes before a second one on a
// busy core (siblings share the core's multiply-add units).
std::vector<int> CoresFirst(const std::vector<int>& cpus, const std::map<int, int64_t>& core_of) {
  std::map<int64_t, int> seen_on_core;     // core key -> CPUs of it placed so far
  std::vector<std::pair<int, int>> keyed;  // (sibling rank, cpu)
  for (int cpu : cpus) {
    const auto it = core_of.find(cpu);
    // Unknown cores: a key no real core has (real keys are >= 0).
    const int64_t core = it != core_of.end() ? it->second : -1 - int64_t{cpu};
    keyed.emplace_back(seen_on_core[core]++, cpu);
  }
  std::sort(keyed.begin(), keyed.end());
  std::vector<int> order;
  for (const auto& [rank, cpu] : keyed) order.push_back(cpu);
  return order;
}

}  // namespace

Result<std::vector<int>> ParseCpuList(std::string_view text) {
  const auto bad = [&](const char* why) {
    return InvalidArgument("malformed CPU list \"" + std::string(text.substr(0, 80)) +
                           "\": " + why);
  };
  std::string_view rest = text;
  while (!rest.empty() && (rest.back() == '\n' || rest.back() == ' ')) rest.remove_suffix(1);
  if (rest.empty()) return std::vector<int>{};
  std::vector<bool> listed(kMaxCpuId + 1, false);
  int64_t named = 0;  // ids the items name, duplicates counted
  // One number of an item; advances `s`.
  const auto number = [](std::string_view& s) -> std::optional<int> {
    size_t i = 0;
    int value = 0;
    for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i) {
      value = value * 10 + (s[i] - '0');
      if (value > kMaxCpuId) return std::nullopt;
    }
    if (i == 0) return std::nullopt;
    s.remove_prefix(i);
    return value;
  };
  while (true) {
    const std::optional<int> first = number(rest);
    if (!first) return bad("expected a CPU id");
    int last = *first;
    if (!rest.empty() && rest.front() == '-') {
      rest.remove_prefix(1);
      const std::optional<int> end = number(rest);
      if (!end) return bad("expected the end of a range");
      if (*end < *first) return bad("a range ends before it starts");
      last = *end;
    }
    named += last - *first + 1;
    if (named > kMaxCpuId + 1) return bad("too many CPUs");
    for (int id = *first; id <= last; ++id) listed[id] = true;
    if (rest.empty()) break;
    if (rest.front() != ',') return bad("expected ',' between items");
    rest.remove_prefix(1);
  }
  std::vector<int> ids;
  for (int id = 0; id <= kMaxCpuId; ++id)
    if (listed[id]) ids.push_back(id);
  return ids;
}

std::string FormatCpuList(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) out += '-' + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

int CpuTopology::NodesWithCpus() const {
  return static_cast<int>(
      std::count_if(nodes.begin(), nodes.end(), [](const NumaNode& n) { return !n.cpus.empty(); }));
}

int CpuTopology::NodeOfCpu(int cpu) const {
  for (const NumaNode& node : nodes)
    if (std::binary_search(node.cpus.begin(), node.cpus.end(), cpu)) return node.id;
  return -1;
}

std::vector<int> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
      if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  if (cpus.empty()) {
    const int n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    for (int cpu = 0; cpu < n; ++cpu) cpus.push_back(cpu);
  }
  return cpus;
}

Result<CpuTopology> ReadCpuTopology(const std::string& sysfs_root,
                                    const std::vector<int>& allowed) {
  namespace fs = std::filesystem;
  if (allowed.empty()) return InvalidArgument("no CPU is allowed to this process");
  const std::set<int> allowed_set(allowed.begin(), allowed.end());
  CpuTopology topology;
  const fs::path node_root = fs::path(sysfs_root) / "devices/system/node";
  std::error_code ec;
  if (fs::is_directory(node_root, ec)) {
    for (const fs::directory_entry& entry : fs::directory_iterator(node_root, ec)) {
      const std::optional<int> id = NodeDirectoryId(entry.path().filename().string());
      if (!id) continue;
      const fs::path cpulist = entry.path() / "cpulist";
      const std::optional<std::string> text = ReadSmallFile(cpulist);
      if (!text) return IoError("cannot read " + cpulist.string());
      Result<std::vector<int>> cpus = ParseCpuList(*text);
      if (!cpus.ok()) return InvalidArgument(cpulist.string() + ": " + cpus.status().message());
      NumaNode node;
      node.id = *id;
      for (int cpu : *cpus)
        if (allowed_set.count(cpu)) node.cpus.push_back(cpu);
      DSINFER_ASSIGN_OR_RETURN(node.memory_bytes, NodeMemTotal(entry.path() / "meminfo"));
      topology.nodes.push_back(std::move(node));
    }
    if (ec) return IoError("cannot list " + node_root.string() + ": " + ec.message());
  }
  std::sort(topology.nodes.begin(), topology.nodes.end(),
            [](const NumaNode& a, const NumaNode& b) { return a.id < b.id; });
  if (topology.nodes.empty()) topology.nodes.push_back(NumaNode{});  // no NUMA: one node 0
  for (int cpu : allowed) {
    if (topology.NodeOfCpu(cpu) >= 0) continue;
    std::vector<int>& first = topology.nodes.front().cpus;
    first.insert(std::upper_bound(first.begin(), first.end(), cpu), cpu);
  }
  for (int cpu : allowed) {
    const fs::path dir =
        fs::path(sysfs_root) / "devices/system/cpu" / ("cpu" + std::to_string(cpu)) / "topology";
    if (!fs::is_directory(dir, ec)) continue;
    Result<int64_t> package = ReadInteger(dir / "physical_package_id");
    Result<int64_t> core = ReadInteger(dir / "core_id");
    // Some kernels say -1 for an unknown package: ReadInteger refuses it, and the CPU is then a
    // core of its own, which is the safe reading.
    if (package.ok() && core.ok()) topology.core_of_cpu[cpu] = (*package << 20) + *core;
  }
  return topology;
}

std::optional<NumaPolicy> ParseNumaPolicy(std::string_view name) {
  if (name == "off") return NumaPolicy::kOff;
  if (name == "distribute") return NumaPolicy::kDistribute;
  if (name == "isolate") return NumaPolicy::kIsolate;
  if (name == "numactl") return NumaPolicy::kNumactl;
  return std::nullopt;
}

std::string_view NumaPolicyName(NumaPolicy policy) {
  switch (policy) {
    case NumaPolicy::kOff:
      return "off";
    case NumaPolicy::kDistribute:
      return "distribute";
    case NumaPolicy::kIsolate:
      return "isolate";
    case NumaPolicy::kNumactl:
      return "numactl";
  }
  return "?";
}

Result<CpuPlacement> PlanCpuPlacement(const CpuTopology& topology, NumaPolicy policy, int n_threads,
                                      int start_cpu) {
  if (n_threads < 0) return InvalidArgument("the thread count must be >= 0");
  if (topology.NodesWithCpus() == 0) return InvalidArgument("the topology has no allowed CPU");
  // The CPUs the policy uses, in the order threads take them.
  std::vector<int> order;
  std::vector<int> nodes_used;
  switch (policy) {
    case NumaPolicy::kOff:
    case NumaPolicy::kNumactl:
      for (const NumaNode& node : topology.nodes) {
        const std::vector<int> cpus = CoresFirst(node.cpus, topology.core_of_cpu);
        order.insert(order.end(), cpus.begin(), cpus.end());
      }
      break;
    case NumaPolicy::kIsolate: {
      int node_id = topology.NodeOfCpu(start_cpu);
      if (node_id < 0)  // the start CPU is not allowed (affinity changed since): the first node
        for (const NumaNode& node : topology.nodes)
          if (!node.cpus.empty()) {
            node_id = node.id;
            break;
          }
      for (const NumaNode& node : topology.nodes)
        if (node.id == node_id) order = CoresFirst(node.cpus, topology.core_of_cpu);
      break;
    }
    case NumaPolicy::kDistribute: {
      std::vector<std::vector<int>> per_node;
      for (const NumaNode& node : topology.nodes)
        if (!node.cpus.empty()) per_node.push_back(CoresFirst(node.cpus, topology.core_of_cpu));
      // Round robin over the nodes: thread i on node i mod (nodes), so any thread count
      // spreads evenly.
      for (size_t round = 0;; ++round) {
        bool any = false;
        for (const std::vector<int>& cpus : per_node)
          if (round < cpus.size()) {
            order.push_back(cpus[round]);
            any = true;
          }
        if (!any) break;
      }
      break;
    }
  }
  CpuPlacement plan;
  plan.numa_nodes = static_cast<int>(topology.nodes.size());
  plan.n_threads = n_threads > 0 ? n_threads : static_cast<int>(order.size());
  const bool pinned = policy != NumaPolicy::kOff;
  if (pinned)
    for (int i = 0; i < plan.n_threads; ++i) plan.cpus.push_back(order[i % order.size()]);
  const int threads_placed = std::min<int>(plan.n_threads, static_cast<int>(order.size()));
  for (int i = 0; i < threads_placed; ++i) nodes_used.push_back(topology.NodeOfCpu(order[i]));
  std::sort(nodes_used.begin(), nodes_used.end());
  nodes_used.erase(std::unique(nodes_used.begin(), nodes_used.end()), nodes_used.end());
  if (policy == NumaPolicy::kDistribute)
    plan.weights = {MemoryPlacement::Mode::kInterleave, nodes_used};
  else if (policy == NumaPolicy::kIsolate)
    plan.weights = {MemoryPlacement::Mode::kPreferred, nodes_used};

  std::string summary = "numa " + std::string(NumaPolicyName(policy)) + ": " +
                        std::to_string(plan.n_threads) + " threads";
  if (pinned) {
    summary += " pinned to CPUs " + FormatCpuList([&] {
                 std::vector<int> sorted(plan.cpus);
                 std::sort(sorted.begin(), sorted.end());
                 sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
                 return sorted;
               }()) +
               " on node" + (nodes_used.size() > 1 ? "s " : " ") + FormatCpuList(nodes_used);
    if (plan.n_threads > static_cast<int>(order.size()))
      summary +=
          " (more threads than its " + std::to_string(order.size()) + " CPUs: some share one)";
  } else {
    summary += ", not pinned";
  }
  summary += "; weights: ";
  switch (plan.weights.mode) {
    case MemoryPlacement::Mode::kDefault:
      summary += policy == NumaPolicy::kNumactl ? "the process's memory policy" : "first touch";
      break;
    case MemoryPlacement::Mode::kInterleave:
      summary += "interleaved over node" + std::string(nodes_used.size() > 1 ? "s " : " ") +
                 FormatCpuList(nodes_used);
      break;
    case MemoryPlacement::Mode::kPreferred:
      summary += "on node " + FormatCpuList(nodes_used);
      break;
  }
  summary += " (" + std::to_string(topology.nodes.size()) + " NUMA node" +
             (topology.nodes.size() > 1 ? "s" : "") + " here)";
  plan.summary = std::move(summary);
  return plan;
}

Result<CpuPlacement> PlanCpuPlacementHere(NumaPolicy policy, int n_threads) {
  const std::vector<int> allowed = AllowedCpus();
  DSINFER_ASSIGN_OR_RETURN(const CpuTopology topology, ReadCpuTopology("/sys", allowed));
  const int start_cpu = sched_getcpu();
  return PlanCpuPlacement(topology, policy, n_threads, start_cpu >= 0 ? start_cpu : allowed[0]);
}

Status PinCurrentThread(int cpu) {
  if (cpu < 0 || cpu >= CPU_SETSIZE) return InvalidArgument("no CPU " + std::to_string(cpu));
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0)
    return FailedPrecondition("cannot pin a thread to CPU " + std::to_string(cpu) + ": " +
                              ErrnoText(errno));
  return Status::Ok();
}

Status PlaceMemory(void* addr, size_t bytes, const MemoryPlacement& placement) {
  if (placement.mode == MemoryPlacement::Mode::kDefault || bytes == 0) return Status::Ok();
  if (placement.nodes.empty()) return InvalidArgument("a memory placement without nodes");
  constexpr int kMaskBits = 1024;  // MAX_NUMNODES is at most 1024 in the kernel's configs
  unsigned long mask[kMaskBits / (8 * sizeof(unsigned long))] = {};
  constexpr int kWordBits = 8 * sizeof(unsigned long);
  for (int node : placement.nodes) {
    if (node < 0 || node >= kMaskBits)
      return InvalidArgument("no NUMA node " + std::to_string(node));
    mask[node / kWordBits] |= 1ul << (node % kWordBits);
  }
  const int mode =
      placement.mode == MemoryPlacement::Mode::kInterleave ? MPOL_INTERLEAVE : MPOL_PREFERRED;
  // maxnode is one more than the mask's bits: the kernel reads maxnode - 1 of them.
  if (syscall(SYS_mbind, addr, bytes, mode, mask, kMaskBits + 1, 0) != 0)
    return FailedPrecondition("cannot place memory on NUMA node" +
                              std::string(placement.nodes.size() > 1 ? "s " : " ") +
                              FormatCpuList(placement.nodes) + " (mbind: " + ErrnoText(errno) + ")");
  return Status::Ok();
}

Result<std::vector<int>> NodesOfPages(const std::vector<const void*>& pages) {
  std::vector<int> status(pages.size(), -1);
  if (pages.empty()) return status;
  std::vector<void*> addresses;
  for (const void* page : pages) addresses.push_back(const_cast<void*>(page));
  // nodes == nullptr: the query form, which moves nothing and fills status with each page's node.
  if (syscall(SYS_move_pages, 0, addresses.size(), addresses.data(), nullptr, status.data(), 0) !=
      0)
    return FailedPrecondition(std::string("cannot query the pages' nodes (move_pages: ") +
                              ErrnoText(errno) + ")");
  for (int& node : status)
    if (node < 0) node = -1;
  return status;
}

Result<std::optional<MemoryPlacement::Mode>> MemoryPlacementAt(const void* addr) {
  int mode = 0;
  if (syscall(SYS_get_mempolicy, &mode, nullptr, 0, addr, MPOL_F_ADDR) != 0)
    return FailedPrecondition(std::string("cannot read the memory policy (get_mempolicy: ") +
                              ErrnoText(errno) + ")");
  switch (mode & ~MPOL_MODE_FLAGS) {
    case MPOL_DEFAULT:
      return std::optional<MemoryPlacement::Mode>(MemoryPlacement::Mode::kDefault);
    case MPOL_INTERLEAVE:
      return std::optional<MemoryPlacement::Mode>(MemoryPlacement::Mode::kInterleave);
    case MPOL_PREFERRED:
      return std::optional<MemoryPlacement::Mode>(MemoryPlacement::Mode::kPreferred);
    default:
      return std::optional<MemoryPlacement::Mode>();
  }
}

}  // namespace dsinfer
