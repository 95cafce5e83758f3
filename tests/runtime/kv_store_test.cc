// The persistent KV tiers (runtime/kv_store.h) through the engine: a restart on the same
// directory restores shared prefixes from disk with outputs bit-identical to a cold run; every
// fault (truncated, flipped, foreign, mislabelled entries, read-only or full directory, two
// writers at once) is detected, counted and recomputed without failing a request; the disk
// budget holds under churn; write-back and the RAM tier alone.
#include "runtime/kv_store.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "../backend/test_models.h"
#include "../engine_test_util.h"
#include "model/state_layout.h"
#include "runtime/engine.h"

namespace dsinfer::runtime {
namespace {

namespace fs = std::filesystem;
using dsinfer::testing::Collect;
using dsinfer::testing::Greedy;
using dsinfer::testing::Ids;
using dsinfer::testing::Outcome;

constexpr int kPrefix = 1024;  // 8 pages of the tiny model's 128-token pages
constexpr int kSuffix = 24;
constexpr int kMaxTokens = 4;

// A fresh directory under the test temp dir, removed at scope exit.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name) {
    path = fs::path(dsinfer::testing::TestTempDir()) / ("kv-" + name);
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::unique_ptr<Engine> MakeEngine(std::optional<KvStoreOptions> store, uint64_t seed = 1) {
  EngineOptions o;
  o.n_threads = 2;
  o.kv_cache_bytes = int64_t{256} << 20;
  o.kv_store = std::move(store);
  auto e = Engine::Create(dsinfer::testing::PresetWeights("tiny-a", seed), o);
  DSINFER_CHECK_MSG(e.ok(), e.status().ToString());
  return std::move(e).value();
}

KvStoreOptions Disk(const fs::path& dir, int64_t disk_bytes = int64_t{1} << 30,
                    int64_t ram_bytes = 0) {
  KvStoreOptions o;
  o.dir = dir.string();
  o.disk_bytes = disk_bytes;
  o.ram_bytes = ram_bytes;
  return o;
}

// Request i of a workload of `n` requests over `n_prefixes` shared prefixes: prefix i %
// n_prefixes, then a suffix of its own.
RequestParams Request(int i, int n_prefixes = 4, int prefix = kPrefix) {
  std::vector<int32_t> ids = Ids(prefix, 1000 + static_cast<uint32_t>(i % n_prefixes));
  const std::vector<int32_t> tail = Ids(kSuffix, 5000 + static_cast<uint32_t>(i));
  ids.insert(ids.end(), tail.begin(), tail.end());
  return Greedy(std::move(ids), kMaxTokens);
}

// Runs requests [first, last) one after another (so later ones can reuse earlier prefixes).
std::vector<Outcome> RunRequests(Engine& engine, int first, int last, int n_prefixes = 4) {
  std::vector<Outcome> out;
  for (int i = first; i < last; ++i) {
    auto s = engine.Submit(Request(i, n_prefixes));
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (!s.ok()) break;
    out.push_back(Collect(**s)[0]);
  }
  return out;
}

// The outputs of requests [0, n) on an engine without any cache tier but the hot one.
const std::vector<Outcome>& Cold(int n = 20) {
  static std::map<int, std::vector<Outcome>>* cold = new std::map<int, std::vector<Outcome>>();
  auto it = cold->find(n);
  if (it != cold->end()) return it->second;
  std::vector<Outcome> out;
  for (int i = 0; i < n; ++i) {  // a fresh engine per request: nothing is reused
    auto engine = MakeEngine(std::nullopt);
    auto r = RunRequests(*engine, i, i + 1);
    out.push_back(r.at(0));
  }
  return (*cold)[n] = std::move(out);
}

void ExpectSameAsCold(const std::vector<Outcome>& got, int first = 0) {
  const auto& cold = Cold();
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].tokens, cold.at(first + i).tokens) << "request " << first + i;
    EXPECT_EQ(got[i].logprobs, cold.at(first + i).logprobs) << "request " << first + i;
    EXPECT_EQ(got[i].reason, FinishReason::kLength);
  }
}

std::vector<fs::path> EntryFiles(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".kv") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<uint8_t> ReadBytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

void WriteBytes(const fs::path& p, const std::vector<uint8_t>& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

int64_t DirBytes(const fs::path& dir) {
  int64_t total = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    // The store's writer renames and deletes files meanwhile: one that vanished counts nothing.
    std::error_code ec;
    const auto bytes = fs::file_size(e.path(), ec);
    if (!ec && fs::is_regular_file(e.path(), ec)) total += static_cast<int64_t>(bytes);
  }
  return total;
}

// The published entries (*.kv) of `dir`: their bytes, the largest one, and each size (for
// failure messages). A store publishes one entry at a time and evicts for it right after, so a
// directory over its budget by at most one entry is under it once the largest is taken off. An
// entry's size is not fixed: one whose parent's write failed, or whose parent was evicted
// first, holds every page since its nearest stored ancestor (up to a whole prompt: 25 KB a page
// of the tiny model, 100 KB measured for four).
struct Entries {
  int64_t total = 0, largest = 0;
  std::string sizes;
};

Entries PublishedEntries(const fs::path& dir) {
  Entries out;
  for (const fs::path& f : EntryFiles(dir)) {
    std::error_code ec;  // evicted meanwhile: counts nothing
    const auto bytes = fs::file_size(f, ec);
    if (ec) continue;
    out.total += static_cast<int64_t>(bytes);
    out.largest = std::max(out.largest, static_cast<int64_t>(bytes));
    out.sizes += " " + std::to_string(bytes);
  }
  return out;
}

// Populates `dir` with the entries of requests [0, 4): one per prefix.
void Populate(const fs::path& dir, uint64_t seed = 1) {
  auto engine = MakeEngine(Disk(dir), seed);
  (void)RunRequests(*engine, 0, 4);
}  // the engine's destructor waits for the store's writes

TEST(KvTier, RestartServesSharedPrefixesFromDiskBitIdenticalToCold) {
  TempDir dir("restart");
  {
    auto engine = MakeEngine(Disk(dir.path));
    ExpectSameAsCold(RunRequests(*engine, 0, 10));
  }
  ASSERT_FALSE(EntryFiles(dir.path).empty());
  auto engine = MakeEngine(Disk(dir.path));
  const std::vector<Outcome> second = RunRequests(*engine, 10, 20);
  ExpectSameAsCold(second, 10);
  // The first request of each prefix after the restart: >= 90 % of its prefix from disk.
  for (int i = 0; i < 4; ++i)
    EXPECT_GE(second[i].usage.cached_prompt_tokens, kPrefix * 9 / 10) << "request " << 10 + i;
  const KvStoreStats k = engine->Stats().kv_store;
  EXPECT_GT(k.disk_hits, 0);
  EXPECT_GE(k.hit_tokens, 4 * kPrefix * 9 / 10);
  EXPECT_EQ(k.checksum_failures, 0);
}

TEST(KvTier, RamTierServesWhatTheHotCacheDropped) {
  KvStoreOptions ram;
  ram.ram_bytes = int64_t{64} << 20;
  auto engine = MakeEngine(ram);
  ExpectSameAsCold(RunRequests(*engine, 0, 4));
  ASSERT_TRUE(engine->FlushPrefixCache().ok());  // the hot tier is empty now
  const std::vector<Outcome> again = RunRequests(*engine, 4, 8);
  ExpectSameAsCold(again, 4);
  for (const Outcome& o : again) EXPECT_GE(o.usage.cached_prompt_tokens, kPrefix);
  const KvStoreStats k = engine->Stats().kv_store;
  EXPECT_GT(k.ram_hits, 0);
  EXPECT_EQ(k.disk_hits, 0);
}

TEST(KvTier, WriteBackPublishesOnExitAndTheRestartUsesIt) {
  TempDir dir("write-back");
  {
    KvStoreOptions o = Disk(dir.path, int64_t{1} << 30, int64_t{64} << 20);
    o.write_back = true;
    auto engine = MakeEngine(o);
    ExpectSameAsCold(RunRequests(*engine, 0, 4));
    EXPECT_EQ(engine->Stats().kv_store.stores, 0);  // all of it fits the RAM tier: no disk yet
  }
  EXPECT_FALSE(EntryFiles(dir.path).empty());
  auto engine = MakeEngine(Disk(dir.path));
  const std::vector<Outcome> again = RunRequests(*engine, 4, 8);
  ExpectSameAsCold(again, 4);
  for (const Outcome& o : again) EXPECT_GE(o.usage.cached_prompt_tokens, kPrefix);
}

// Damages the directory's entries with `damage`, restarts, and checks every request still gives
// the cold outputs, the damage was counted, and the prefixes were stored again.
void ExpectRecovers(const fs::path& dir, const std::function<void(const fs::path&)>& damage) {
  Populate(dir);
  damage(dir);
  {
    auto engine = MakeEngine(Disk(dir));
    ExpectSameAsCold(RunRequests(*engine, 4, 8), 4);
    EXPECT_GT(engine->Stats().kv_store.checksum_failures, 0);
  }
  // What was recomputed was stored again: a second restart restores all of it.
  auto engine = MakeEngine(Disk(dir));
  const std::vector<Outcome> again = RunRequests(*engine, 8, 12);
  ExpectSameAsCold(again, 8);
  for (const Outcome& o : again) EXPECT_GE(o.usage.cached_prompt_tokens, kPrefix);
  EXPECT_EQ(engine->Stats().kv_store.checksum_failures, 0);
}

TEST(KvTier, TruncatedEntriesAreDetectedAndRecomputed) {
  TempDir dir("truncated");
  ExpectRecovers(dir.path, [](const fs::path& d) {
    for (const fs::path& f : EntryFiles(d)) fs::resize_file(f, fs::file_size(f) / 2);
  });
}

TEST(KvTier, AFlippedByteIsDetectedAndRecomputed) {
  TempDir dir("flipped");
  ExpectRecovers(dir.path, [](const fs::path& d) {
    for (const fs::path& f : EntryFiles(d)) {
      std::vector<uint8_t> bytes = ReadBytes(f);
      bytes[bytes.size() * 2 / 3] ^= 0x10;  // inside the state's payload
      WriteBytes(f, bytes);
    }
  });
}

// The entries another model (same shapes, other weights) wrote for the same prompts, put under
// this model's keys: with their own salt in the header, and with the salt forged to this
// store's (then only the blob's model fingerprint tells).
void PlantForeign(const fs::path& d, bool forge_salt) {
  TempDir other("other-model");
  Populate(other.path, /*seed=*/2);
  std::map<std::vector<int32_t>, std::vector<uint8_t>> foreign;  // by the tokens they hold
  for (const fs::path& f : EntryFiles(other.path)) {
    std::vector<uint8_t> bytes = ReadBytes(f);
    auto blob =
        model::DecodeStateBlob(std::span<const uint8_t>(bytes).subspan(EntryFileHeader::kBytes));
    ASSERT_TRUE(blob.ok());
    foreign[blob->header.tokens] = bytes;
  }
  int planted = 0;
  for (const fs::path& f : EntryFiles(d)) {
    const std::vector<uint8_t> mine = ReadBytes(f);
    auto h = DecodeEntryFileHeader(mine);
    auto blob =
        model::DecodeStateBlob(std::span<const uint8_t>(mine).subspan(EntryFileHeader::kBytes));
    ASSERT_TRUE(h.ok() && blob.ok());
    auto it = foreign.find(blob->header.tokens);
    if (it == foreign.end()) continue;
    auto theirs = DecodeEntryFileHeader(it->second);
    ASSERT_TRUE(theirs.ok());
    EXPECT_NE(theirs->salt, h->salt);
    EntryFileHeader planted_header = *theirs;
    planted_header.key = h->key;
    if (forge_salt) planted_header.salt = h->salt;
    WriteBytes(
        f, EncodeEntryFile(planted_header,
                           std::span<const uint8_t>(it->second).subspan(EntryFileHeader::kBytes)));
    ++planted;
  }
  EXPECT_GT(planted, 0);
}

TEST(KvTier, EntriesOfAnotherModelAreNeverUsed) {
  TempDir dir("foreign");
  ExpectRecovers(dir.path, [](const fs::path& d) { PlantForeign(d, /*forge_salt=*/false); });
}

TEST(KvTier, EntriesOfAnotherModelWithAForgedSaltAreRefusedByTheStateCheck) {
  TempDir dir("foreign-forged");
  ExpectRecovers(dir.path, [](const fs::path& d) { PlantForeign(d, /*forge_salt=*/true); });
}

TEST(KvTier, AnEntryNamingOtherTokensIsDetected) {
  TempDir dir("other-tokens");
  ExpectRecovers(dir.path, [](const fs::path& d) {
    // Swap the states of entries of equal length between prefixes, keys kept: each file's
    // header then names the right prefix and its state holds another one's tokens.
    std::map<int64_t, std::vector<fs::path>> by_length;
    for (const fs::path& f : EntryFiles(d)) {
      auto h = DecodeEntryFileHeader(ReadBytes(f));
      ASSERT_TRUE(h.ok());
      by_length[h->n_tokens].push_back(f);
    }
    int swapped = 0;
    for (auto& [n, files] : by_length) {
      for (size_t i = 0; i + 1 < files.size(); i += 2) {
        std::vector<uint8_t> a = ReadBytes(files[i]), b = ReadBytes(files[i + 1]);
        auto ha = DecodeEntryFileHeader(a), hb = DecodeEntryFileHeader(b);
        ASSERT_TRUE(ha.ok() && hb.ok());
        std::swap(ha->key, hb->key);
        WriteBytes(
            files[i],
            EncodeEntryFile(*hb, std::span<const uint8_t>(b).subspan(EntryFileHeader::kBytes)));
        WriteBytes(
            files[i + 1],
            EncodeEntryFile(*ha, std::span<const uint8_t>(a).subspan(EntryFileHeader::kBytes)));
        ++swapped;
      }
    }
    EXPECT_GT(swapped, 0);
  });
}

// A directory that refuses writes (`err` from the file system, injected: the tests may run as
// root, which a read-only mode does not stop): every request still gives the cold outputs, the
// failed writes are counted, and nothing is published.
void ExpectWritesFailCleanly(int err, int64_t allowed_bytes) {
  TempDir dir("refusing-" + std::to_string(err));
  KvStoreOptions o = Disk(dir.path);
  const fs::path path = dir.path;  // a file system that is full past allowed_bytes
  o.write_fault = [err, allowed_bytes, path] { return DirBytes(path) >= allowed_bytes ? err : 0; };
  {
    auto engine = MakeEngine(o);
    ExpectSameAsCold(RunRequests(*engine, 0, 8), 0);
  }
  auto engine = MakeEngine(o);
  ExpectSameAsCold(RunRequests(*engine, 8, 12), 8);
  const KvStoreStats k = engine->Stats().kv_store;
  EXPECT_GT(k.store_errors, 0);
  EXPECT_EQ(k.checksum_failures, 0);
  // Every write is refused once the directory holds allowed_bytes and nothing is evicted (the
  // budget is far above), so at most one write straddles the limit.
  const Entries entries = PublishedEntries(dir.path);
  if (allowed_bytes == 0)
    EXPECT_EQ(DirBytes(dir.path), 0) << "entry sizes:" << entries.sizes;
  else
    EXPECT_LT(entries.total - entries.largest, allowed_bytes) << "entry sizes:" << entries.sizes;
  for (const auto& e : fs::directory_iterator(dir.path))
    EXPECT_EQ(e.path().extension(), ".kv") << "a temporary file was left: " << e.path();
}

TEST(KvTier, AReadOnlyDirectoryFailsWritesWithoutFailingRequests) {
  ExpectWritesFailCleanly(EROFS, 0);
}

TEST(KvTier, AFullDiskFailsWritesWithoutFailingRequests) {
  ExpectWritesFailCleanly(ENOSPC, int64_t{256} << 10);  // a tenth of what the run stores
}

TEST(KvTier, TwoReplicasWritingTheSamePagesAtOnce) {
  TempDir dir("two-writers");
  {
    auto a = MakeEngine(Disk(dir.path));
    auto b = MakeEngine(Disk(dir.path));
    std::vector<Outcome> out_a, out_b;
    std::thread ta([&] { out_a = RunRequests(*a, 0, 8); });
    std::thread tb([&] { out_b = RunRequests(*b, 0, 8); });
    ta.join();
    tb.join();
    ExpectSameAsCold(out_a);
    ExpectSameAsCold(out_b);
    EXPECT_EQ(a->Stats().kv_store.checksum_failures + b->Stats().kv_store.checksum_failures, 0);
  }
  for (const auto& e : fs::directory_iterator(dir.path))
    EXPECT_EQ(e.path().extension(), ".kv") << "a temporary file was left: " << e.path();
  auto engine = MakeEngine(Disk(dir.path));
  const std::vector<Outcome> again = RunRequests(*engine, 8, 12);
  ExpectSameAsCold(again, 8);
  for (const Outcome& o : again) EXPECT_GE(o.usage.cached_prompt_tokens, kPrefix);
  EXPECT_EQ(engine->Stats().kv_store.checksum_failures, 0);
}

int64_t MaxRssKb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

TEST(KvTier, EvictionKeepsTheDirectoryUnderBudgetWhileTheWorkingSetChurns) {
  TempDir dir("churn");
  // The run stores about 3.5 MB (entries of a page, ~25 KB, or more): a third of it fits the disk,
  // a sixth the RAM tier.
  const int64_t budget = int64_t{1} << 20;
  auto engine = MakeEngine(Disk(dir.path, budget, int64_t{512} << 10));
  // 24 distinct prefixes, the hot tier flushed after each; the RSS after 8 is the baseline.
  // DSINFER_KV_CHURN_SECONDS (the `soak` ctest entry: 600) keeps churning new prefixes that long.
  const char* seconds_env = std::getenv("DSINFER_KV_CHURN_SECONDS");
  const double seconds = seconds_env != nullptr ? std::atof(seconds_env) : 0;
  const auto t0 = std::chrono::steady_clock::now();
  auto more = [&](int round) {
    return round < 24 ||
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < seconds;
  };
  int64_t rss_after_warmup = 0;
  for (int round = 0; more(round); ++round) {
    auto s1 = engine->Submit(Request(round, 1000, 512));
    ASSERT_TRUE(s1.ok());
    (void)Collect(**s1);
    ASSERT_TRUE(engine->FlushPrefixCache().ok());  // make the RAM and disk tiers do the work
    if (round == 8) rss_after_warmup = MaxRssKb();
    // The writer may be between publishing an entry and evicting for it (its temporary file,
    // not yet published, is not counted).
    const Entries entries = PublishedEntries(dir.path);
    EXPECT_LE(entries.total - entries.largest, budget)
        << "round " << round << ", entry sizes:" << entries.sizes;
  }
  EXPECT_GT(engine->Stats().kv_store.disk_evictions, 0);
  EXPECT_GT(engine->Stats().kv_store.ram_evictions, 0);
  engine.reset();  // every write done
  EXPECT_LE(DirBytes(dir.path), budget);
  EXPECT_LE(MaxRssKb(), rss_after_warmup + 64 * 1024) << "RSS grew by more than 64 MiB";
}

}  // namespace
}  // namespace dsinfer::runtime
