// The persistent, tiered KV store behind the engine's prefix cache (the hot tier): a host-RAM tier
// with its own byte budget and a disk tier in a directory that survives restarts and may be shared
// by replicas of the same model.
//
// Unit: an entry is the exported state (model/state_layout.h's StateBlob) of a prompt prefix at a
// page boundary (or one token before a prompt's end), holding the pages since its parent entry
// (the entry one page boundary below it, when that one is stored; Export's first_page) and the
// boundary part, so a chain of entries restores exactly the state a cold prefill reaches.
//
// Keys are chained SHA-256 (core/sha256.h, OpenSSL): key(0) = SHA-256 of a salt naming the model
// fingerprint, the numerics, the state-blob version and the layout (page size, row formats);
// key(k * page) = SHA-256(key((k - 1) * page) || page k's ids as u32 LE); a prefix ending inside a
// page extends the last full page's key by its tail. A cache written by another model, numerics
// or layout is therefore never even looked at.
//
// Disk format: one file per entry, `<dir>/<64 hex of the key>.kv`: EntryFileHeader, then the
// StateBlob (its own header names model, numerics, layout and every token id; a SHA-256 over it
// all closes it). Loading checks the file header (magic, version, key, salt, length), the blob's
// checksum and that its ids are the prefix asked for; an entry failing any check is deleted and
// counted, and the prefix is recomputed. Files are published by writing `.tmp-*` and renaming, so
// readers (other replicas included) see a complete file or none.
//
// Threads: Prefetch may run on any thread (Engine::Submit's caller); Lookup / Put / Contains /
// ParentPages on the engine thread; disk writes and disk-budget eviction on the store's own IO
// thread. A mutex guards the indexes; no lock is held across file IO.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/sha256.h"
#include "core/status.h"

namespace dsinfer::runtime {

struct KvStoreOptions {
  std::string dir;          // the disk tier's directory (created if missing); empty: RAM only
  int64_t disk_bytes = 0;   // the disk tier's budget (files deleted, lowest score first)
  int64_t ram_bytes = 0;    // the host-RAM tier's budget; 0: no RAM tier
  bool write_back = false;  // false: write-through (disk at once); true: on RAM eviction/exit
  // Test hook (fault injection): called before each file write; a non-zero errno fails that
  // write as the file system would (ENOSPC: full, EROFS: read-only).
  std::function<int()> write_fault;
};

// What makes keys and entries of this store foreign to any other model, numerics or layout.
struct KvStoreSalt {
  Sha256Digest model{};
  std::string numerics;
  uint32_t blob_version = 0;
  int page_tokens = 0;
  std::string layout;  // StateLayout::Describe()
};

struct KvStoreStats {
  int64_t ram_entries = 0, ram_bytes = 0;    // held now
  int64_t disk_entries = 0, disk_bytes = 0;  // this store's view of the directory
  int64_t ram_hits = 0, disk_hits = 0;       // entries served from each tier
  int64_t ram_hit_bytes = 0, disk_read_bytes = 0;
  int64_t lookups = 0, misses = 0;  // Lookup calls, and those that found nothing to add
  int64_t hit_tokens = 0;           // prompt tokens restored from the store
  int64_t stores = 0, store_bytes = 0, store_errors = 0;  // disk writes done / failed
  int64_t checksum_failures = 0;  // entries found damaged or foreign, deleted, recomputed
  int64_t ram_evictions = 0, disk_evictions = 0;
  double load_seconds = 0, store_seconds = 0;  // summed over disk reads / writes
};

// The header of an entry file (little-endian, 104 bytes), followed by `blob_bytes` of StateBlob.
struct EntryFileHeader {
  static constexpr char kMagic[8] = {'D', 'S', 'K', 'V', 'T', 'I', 'E', 'R'};
  static constexpr uint32_t kVersion = 1;
  static constexpr size_t kBytes = 8 + 4 + 4 + 32 + 32 + 8 + 8 + 8;
  Sha256Digest key{};
  Sha256Digest salt{};  // SHA-256 of the salt fields (KvStore::SaltDigest)
  int64_t n_tokens = 0;
  int64_t first_page = 0;
  int64_t blob_bytes = 0;
};
std::vector<uint8_t> EncodeEntryFile(const EntryFileHeader& header, std::span<const uint8_t> blob);
// The header of a file's bytes (InvalidArgument naming the defect: magic, version, length).
Result<EntryFileHeader> DecodeEntryFileHeader(std::span<const uint8_t> file);

class KvStore {
 public:
  // The restored state of a prefix: the blobs of its chain, root first, and their lengths.
  struct Hit {
    int64_t n_tokens = 0;
    std::vector<std::shared_ptr<const std::vector<uint8_t>>> blobs;
    std::vector<int64_t> lengths;
    std::vector<Sha256Digest> keys;
  };

  static Result<std::unique_ptr<KvStore>> Open(KvStoreOptions options, const KvStoreSalt& salt);
  // Waits for queued writes; in write-back mode writes what only the RAM tier holds first.
  ~KvStore();

  static Sha256Digest SaltDigest(const KvStoreSalt& salt);
  // key(n) of ids[0, n) (n > 0).
  Sha256Digest KeyOf(std::span<const int32_t> prefix) const;
  std::string PathOf(const Sha256Digest& key) const;  // the entry's file (dir set)
  int page_tokens() const { return page_tokens_; }

  // Any thread: brings the longest stored chain of ids[0, <= max_tokens) into the RAM tier,
  // reading disk (and verifying) where needed, so the engine thread finds it there.
  void Prefetch(std::span<const int32_t> ids, int64_t max_tokens);
  // Engine thread: the longest stored prefix of ids of length in (min_tokens, max_tokens] whose
  // whole chain loads and verifies, or nullopt. Reads disk only for what prefetch did not bring.
  std::optional<Hit> Lookup(std::span<const int32_t> ids, int64_t min_tokens, int64_t max_tokens);
  // The engine could not import an entry of a hit (it is dropped from both tiers and counted).
  void Discard(const Sha256Digest& key);
  // Drops the entries of ids' page-aligned prefixes shorter than n (not counted as failures):
  // after an entry of length n was refused, the ones below it may come from the same foreign or
  // damaged writer without being in the refused chain (a chain's shape depends on what was
  // stored when it was written); kept, they would be the parents the recomputed entries chain
  // to, and be refused again on every later hit.
  void ForgetBelow(std::span<const int32_t> ids, int64_t n);
  // Whether ids[0, n) is stored in a tier (as far as this store knows).
  bool Contains(std::span<const int32_t> prefix) const;
  // The page an entry for `prefix` should start at: its parent's page count when the parent is
  // stored, else 0 (the entry is self-contained).
  int64_t FirstPageFor(std::span<const int32_t> prefix) const;
  // Engine thread: stores the blob of prefix (exported from first_page); RAM at once, disk on the
  // IO thread (write-through) or when the RAM tier evicts it (write-back).
  void Put(std::span<const int32_t> prefix, int64_t first_page, std::vector<uint8_t> blob);
  // Blocks until every queued disk write is done (tests, shutdown).
  void Flush();
  KvStoreStats stats() const;

 private:
  // Drops key's entry from both tiers and its file; counts a checksum failure when asked.
  void Remove(const Sha256Digest& key, bool count_failure);
  struct RamEntry {
    std::shared_ptr<const std::vector<uint8_t>> blob;  // [bytes] the StateBlob
    int64_t n_tokens = 0, first_page = 0;
    int64_t last_use = 0, hits = 0;
    bool dirty = false;  // write-back: not on disk yet
  };
  struct DiskEntry {
    int64_t bytes = 0;
    int64_t last_use = 0, hits = 0;
  };
  struct Write {
    Sha256Digest key;
    std::shared_ptr<const std::vector<uint8_t>> blob;
    int64_t n_tokens = 0, first_page = 0;
  };
  struct KeyHash {
    size_t operator()(const Sha256Digest& d) const;
  };

  KvStore(KvStoreOptions options, const KvStoreSalt& salt);
  // Lowest first: recency plus a bonus per hit (LRU with hit weighting).
  static int64_t Score(int64_t last_use, int64_t hits);
  // The chain of the longest candidate, loading from disk when `allow_disk`; under no lock.
  std::optional<Hit> Resolve(std::span<const int32_t> ids, int64_t min_tokens, int64_t max_tokens,
                             bool count);
  // The entry key at ids[0, n) from RAM, else disk (verified); nullopt when absent or bad.
  std::optional<RamEntry> Load(const Sha256Digest& key, std::span<const int32_t> ids, int64_t n);
  std::optional<RamEntry> ReadFile(const Sha256Digest& key, std::span<const int32_t> ids,
                                   int64_t n);
  void InsertRam(const Sha256Digest& key, RamEntry entry);  // under mu_
  void EvictRam();                                          // under mu_
  void Enqueue(Write w);                                    // under mu_
  void IoLoop();
  Status WriteFile(const Write& w);
  void EnforceDiskBudget();  // IO thread
  void ScanDir();

  KvStoreOptions options_;
  Sha256Digest salt_digest_{};
  Sha256Digest root_{};
  int page_tokens_ = 0;

  mutable std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  std::unordered_map<Sha256Digest, RamEntry, KeyHash> ram_;
  std::unordered_map<Sha256Digest, DiskEntry, KeyHash> disk_;
  int64_t ram_bytes_ = 0, disk_bytes_ = 0;
  int64_t clock_ = 0;  // logical time of uses
  std::deque<Write> writes_;
  int writing_ = 0;
  bool stopping_ = false;
  uint64_t tmp_counter_ = 0;
  KvStoreStats stats_;
  std::thread io_;
};

}  // namespace dsinfer::runtime
