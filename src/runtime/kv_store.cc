#include "runtime/kv_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>

#include "model/state_layout.h"

namespace dsinfer::runtime {

namespace {

using SteadyClock = std::chrono::steady_clock;

double SecondsSince(SteadyClock::time_point t) {
  return std::chrono::duration<double>(SteadyClock::now() - t).count();
}

// Little-endian fields written at `p` (the buffer is sized first: GCC 12 misreads push_back
// sequences after reserve as overflows).
void PutU32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void PutI64(uint8_t* p, int64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i));
}
uint32_t GetU32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}
int64_t GetI64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return static_cast<int64_t>(v);
}

// Token ids as the key hashes them: u32 little-endian, whatever the host's order.
void HashIds(Sha256& h, std::span<const int32_t> ids) {
  std::vector<uint8_t> bytes(ids.size() * 4);
  for (size_t i = 0; i < ids.size(); ++i)
    PutU32(bytes.data() + 4 * i, static_cast<uint32_t>(ids[i]));
  h.Update(bytes);
}

Sha256Digest Extend(const Sha256Digest& parent, std::span<const int32_t> ids) {
  Sha256 h;
  h.Update(parent);
  HashIds(h, ids);
  return h.Finish();
}

// Entry files are `<64 hex>.kv`; anything else in the directory is not ours to read.
bool IsEntryName(const std::string& name) {
  if (name.size() != 64 + 3 || name.compare(64, 3, ".kv") != 0) return false;
  return std::all_of(name.begin(), name.begin() + 64,
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

std::optional<Sha256Digest> KeyOfName(const std::string& name) {
  if (!IsEntryName(name)) return std::nullopt;
  Sha256Digest d{};
  for (size_t i = 0; i < d.size(); ++i)
    d[i] = static_cast<uint8_t>(std::stoi(name.substr(2 * i, 2), nullptr, 16));
  return d;
}

Status ErrnoStatus(const std::string& what, int err) {
  return IoError(what + ": " + std::strerror(err));
}

}  // namespace

std::vector<uint8_t> EncodeEntryFile(const EntryFileHeader& h, std::span<const uint8_t> blob) {
  std::vector<uint8_t> out(EntryFileHeader::kBytes + blob.size(), 0);
  uint8_t* p = out.data();
  std::memcpy(p, EntryFileHeader::kMagic, 8);
  PutU32(p + 8, EntryFileHeader::kVersion);  // p + 12: reserved, zero
  std::memcpy(p + 16, h.key.data(), 32);
  std::memcpy(p + 48, h.salt.data(), 32);
  PutI64(p + 80, h.n_tokens);
  PutI64(p + 88, h.first_page);
  PutI64(p + 96, h.blob_bytes);
  if (!blob.empty()) std::memcpy(p + EntryFileHeader::kBytes, blob.data(), blob.size());
  return out;
}

Result<EntryFileHeader> DecodeEntryFileHeader(std::span<const uint8_t> file) {
  if (file.size() < EntryFileHeader::kBytes)
    return InvalidArgument("entry file of " + std::to_string(file.size()) +
                           " bytes is shorter than its header");
  if (!std::equal(std::begin(EntryFileHeader::kMagic), std::end(EntryFileHeader::kMagic),
                  file.begin()))
    return InvalidArgument("entry file has a wrong magic");
  const uint8_t* p = file.data() + 8;
  if (GetU32(p) != EntryFileHeader::kVersion)
    return InvalidArgument("entry file version " + std::to_string(GetU32(p)) + " is not " +
                           std::to_string(EntryFileHeader::kVersion));
  p += 8;
  EntryFileHeader h;
  std::copy(p, p + 32, h.key.begin());
  std::copy(p + 32, p + 64, h.salt.begin());
  p += 64;
  h.n_tokens = GetI64(p);
  h.first_page = GetI64(p + 8);
  h.blob_bytes = GetI64(p + 16);
  if (h.blob_bytes != static_cast<int64_t>(file.size() - EntryFileHeader::kBytes))
    return InvalidArgument("entry file holds " +
                           std::to_string(file.size() - EntryFileHeader::kBytes) +
                           " blob bytes, its header says " + std::to_string(h.blob_bytes));
  return h;
}

size_t KvStore::KeyHash::operator()(const Sha256Digest& d) const {
  size_t h = 0;
  std::memcpy(&h, d.data(), sizeof(h));  // the key is a uniform hash already
  return h;
}

Sha256Digest KvStore::SaltDigest(const KvStoreSalt& salt) {
  Sha256 h;
  h.Update(std::string_view("dsinfer kv tier\n"));
  h.Update(salt.model);
  h.Update(salt.numerics + "\n" + std::to_string(salt.blob_version) + "\n" +
           std::to_string(salt.page_tokens) + "\n" + salt.layout);
  return h.Finish();
}

KvStore::KvStore(KvStoreOptions options, const KvStoreSalt& salt)
    : options_(std::move(options)),
      salt_digest_(SaltDigest(salt)),
      root_(Sha256::Of(salt_digest_)),
      page_tokens_(salt.page_tokens) {}

Result<std::unique_ptr<KvStore>> KvStore::Open(KvStoreOptions options, const KvStoreSalt& salt) {
  if (salt.page_tokens < 1) return InvalidArgument("kv store: page size must be >= 1");
  if (options.ram_bytes < 0 || options.disk_bytes < 0)
    return InvalidArgument("kv store: budgets must be >= 0");
  if (!options.dir.empty()) {
    if (options.disk_bytes <= 0)
      return InvalidArgument("kv store: a disk directory needs a disk budget > 0");
    if (::mkdir(options.dir.c_str(), 0755) != 0 && errno != EEXIST)
      return ErrnoStatus("kv store: cannot create " + options.dir, errno);
    struct stat st {};
    if (::stat(options.dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      return InvalidArgument("kv store: " + options.dir + " is not a directory");
  } else if (options.ram_bytes <= 0) {
    return InvalidArgument("kv store: neither a RAM budget nor a disk directory");
  }
  auto store = std::unique_ptr<KvStore>(new KvStore(std::move(options), salt));
  if (!store->options_.dir.empty()) {
    store->ScanDir();
    store->io_ = std::thread([p = store.get()] { p->IoLoop(); });
  }
  return store;
}

KvStore::~KvStore() {
  {
    std::lock_guard lock(mu_);
    if (options_.write_back && !options_.dir.empty())
      for (auto& [key, e] : ram_)
        if (e.dirty) {
          e.dirty = false;
          Enqueue({key, e.blob, e.n_tokens, e.first_page});
        }
    stopping_ = true;
  }
  cv_.notify_all();
  if (io_.joinable()) io_.join();
}

Sha256Digest KvStore::KeyOf(std::span<const int32_t> prefix) const {
  Sha256Digest key = root_;
  const size_t P = static_cast<size_t>(page_tokens_);
  size_t at = 0;
  for (; at + P <= prefix.size(); at += P) key = Extend(key, prefix.subspan(at, P));
  if (at < prefix.size()) key = Extend(key, prefix.subspan(at));
  return key;
}

std::string KvStore::PathOf(const Sha256Digest& key) const {
  return options_.dir + "/" + HexDigest(key) + ".kv";
}

int64_t KvStore::Score(int64_t last_use, int64_t hits) {
  // A hit is worth 4 later uses, up to 8 hits: a prefix used often outlives one used once
  // recently, but not forever.
  return last_use + 4 * std::min<int64_t>(hits, 8);
}

bool KvStore::Contains(std::span<const int32_t> prefix) const {
  const Sha256Digest key = KeyOf(prefix);
  std::lock_guard lock(mu_);
  return ram_.count(key) != 0 || disk_.count(key) != 0;
}

int64_t KvStore::FirstPageFor(std::span<const int32_t> prefix) const {
  const int64_t n = static_cast<int64_t>(prefix.size());
  const int64_t parent = (n - 1) / page_tokens_ * page_tokens_;
  if (parent <= 0) return 0;
  return Contains(prefix.first(static_cast<size_t>(parent))) ? parent / page_tokens_ : 0;
}

void KvStore::Put(std::span<const int32_t> prefix, int64_t first_page, std::vector<uint8_t> blob) {
  const Sha256Digest key = KeyOf(prefix);
  RamEntry e;
  e.blob = std::make_shared<const std::vector<uint8_t>>(std::move(blob));
  e.n_tokens = static_cast<int64_t>(prefix.size());
  e.first_page = first_page;
  std::lock_guard lock(mu_);
  const bool to_ram =
      options_.ram_bytes > 0 && static_cast<int64_t>(e.blob->size()) <= options_.ram_bytes;
  const bool to_disk_now = !options_.dir.empty() && (!options_.write_back || !to_ram);
  if (to_disk_now) Enqueue({key, e.blob, e.n_tokens, e.first_page});
  if (to_ram) {
    e.dirty = options_.write_back && !options_.dir.empty();
    InsertRam(key, std::move(e));
  }
}

void KvStore::InsertRam(const Sha256Digest& key, RamEntry entry) {
  entry.last_use = ++clock_;
  auto it = ram_.find(key);
  if (it != ram_.end()) {
    ram_bytes_ -= static_cast<int64_t>(it->second.blob->size());
    entry.hits = it->second.hits;
    entry.dirty = entry.dirty || it->second.dirty;
  }
  ram_bytes_ += static_cast<int64_t>(entry.blob->size());
  ram_[key] = std::move(entry);
  EvictRam();
}

void KvStore::EvictRam() {
  while (ram_bytes_ > options_.ram_bytes && !ram_.empty()) {
    auto victim = std::min_element(ram_.begin(), ram_.end(), [](const auto& a, const auto& b) {
      return Score(a.second.last_use, a.second.hits) < Score(b.second.last_use, b.second.hits);
    });
    if (victim->second.dirty)  // write-back: the disk gets it now
      Enqueue(
          {victim->first, victim->second.blob, victim->second.n_tokens, victim->second.first_page});
    ram_bytes_ -= static_cast<int64_t>(victim->second.blob->size());
    ram_.erase(victim);
    ++stats_.ram_evictions;
  }
}

void KvStore::Enqueue(Write w) {
  writes_.push_back(std::move(w));
  cv_.notify_all();
}

void KvStore::Flush() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return writes_.empty() && writing_ == 0; });
}

KvStoreStats KvStore::stats() const {
  std::lock_guard lock(mu_);
  KvStoreStats s = stats_;
  s.ram_entries = static_cast<int64_t>(ram_.size());
  s.ram_bytes = ram_bytes_;
  s.disk_entries = static_cast<int64_t>(disk_.size());
  s.disk_bytes = disk_bytes_;
  return s;
}

void KvStore::Remove(const Sha256Digest& key, bool count_failure) {
  {
    std::lock_guard lock(mu_);
    auto r = ram_.find(key);
    if (r != ram_.end()) {
      ram_bytes_ -= static_cast<int64_t>(r->second.blob->size());
      ram_.erase(r);
    }
    auto d = disk_.find(key);
    if (d != disk_.end()) {
      disk_bytes_ -= d->second.bytes;
      disk_.erase(d);
    }
    if (count_failure) ++stats_.checksum_failures;
  }
  if (!options_.dir.empty()) ::unlink(PathOf(key).c_str());
}

void KvStore::Discard(const Sha256Digest& key) { Remove(key, /*count_failure=*/true); }

void KvStore::ForgetBelow(std::span<const int32_t> ids, int64_t n) {
  const int64_t P = page_tokens_;
  n = std::min<int64_t>(n, static_cast<int64_t>(ids.size()));
  Sha256Digest key = root_;
  for (int64_t at = 0; at + P < n; at += P) {
    key = Extend(key, ids.subspan(static_cast<size_t>(at), static_cast<size_t>(P)));
    Remove(key, /*count_failure=*/false);
  }
}

// ---- loading ----------------------------------------------------------------------------------

std::optional<KvStore::RamEntry> KvStore::ReadFile(const Sha256Digest& key,
                                                   std::span<const int32_t> ids, int64_t n) {
  const std::string path = PathOf(key);
  const auto t0 = SteadyClock::now();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;  // not stored (or not readable): a miss, not a fault
  std::vector<uint8_t> file;
  struct stat st {};
  bool read_ok = ::fstat(fd, &st) == 0;
  if (read_ok) {
    file.resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < file.size()) {
      const ssize_t r = ::read(fd, file.data() + got, file.size() - got);
      if (r <= 0) break;
      got += static_cast<size_t>(r);
    }
    file.resize(got);
    // The file's time is its last use (the order eviction sees after a restart).
    (void)::futimens(fd, nullptr);
  }
  ::close(fd);
  // Every check of the entry: file header, salt, key, length, blob checksum, ids.
  auto verify = [&]() -> Result<RamEntry> {
    DSINFER_ASSIGN_OR_RETURN(EntryFileHeader h, DecodeEntryFileHeader(file));
    if (h.salt != salt_digest_)
      return InvalidArgument("written by another model, numerics or layout");
    if (h.key != key || h.n_tokens != n) return InvalidArgument("names another prefix");
    const std::span<const uint8_t> blob =
        std::span<const uint8_t>(file).subspan(EntryFileHeader::kBytes);
    DSINFER_ASSIGN_OR_RETURN(model::DecodedStateBlob d, model::DecodeStateBlob(blob));
    if (d.header.end_pos != n || d.header.first_page != h.first_page ||
        static_cast<int64_t>(d.header.tokens.size()) != n ||
        !std::equal(d.header.tokens.begin(), d.header.tokens.end(), ids.begin()))
      return InvalidArgument("its state holds other tokens than the prefix");
    if (h.first_page < 0 || h.first_page * page_tokens_ >= n)
      return InvalidArgument("its parent is not below it");
    RamEntry e;
    e.blob = std::make_shared<const std::vector<uint8_t>>(blob.begin(), blob.end());
    e.n_tokens = n;
    e.first_page = h.first_page;
    return e;
  };
  Result<RamEntry> entry = read_ok ? verify() : InvalidArgument("unreadable");
  const double seconds = SecondsSince(t0);
  if (!entry.ok()) {
    Discard(key);  // counts it; the prefix is recomputed (and stored again)
    return std::nullopt;
  }
  std::lock_guard lock(mu_);
  ++stats_.disk_hits;
  stats_.disk_read_bytes += static_cast<int64_t>(file.size());
  stats_.load_seconds += seconds;
  DiskEntry& d = disk_[key];
  if (d.bytes == 0) {
    d.bytes = static_cast<int64_t>(file.size());
    disk_bytes_ += d.bytes;
  }
  d.last_use = ++clock_;
  ++d.hits;
  return std::move(entry).value();
}

std::optional<KvStore::RamEntry> KvStore::Load(const Sha256Digest& key,
                                               std::span<const int32_t> ids, int64_t n) {
  {
    std::lock_guard lock(mu_);
    auto it = ram_.find(key);
    if (it != ram_.end()) {
      it->second.last_use = ++clock_;
      ++it->second.hits;
      ++stats_.ram_hits;
      stats_.ram_hit_bytes += static_cast<int64_t>(it->second.blob->size());
      return it->second;
    }
    if (options_.dir.empty()) return std::nullopt;
  }
  std::optional<RamEntry> e = ReadFile(key, ids, n);
  if (e && options_.ram_bytes > 0 && static_cast<int64_t>(e->blob->size()) <= options_.ram_bytes) {
    std::lock_guard lock(mu_);
    InsertRam(key, *e);
  }
  return e;
}

std::optional<KvStore::Hit> KvStore::Resolve(std::span<const int32_t> ids, int64_t min_tokens,
                                             int64_t max_tokens, bool count) {
  const int64_t P = page_tokens_;
  const int64_t n_max = std::min<int64_t>(max_tokens, static_cast<int64_t>(ids.size()));
  // aligned[k] = key(k * P), k = 0 .. n_max / P.
  std::vector<Sha256Digest> aligned{root_};
  for (int64_t k = 1; k * P <= n_max; ++k)
    aligned.push_back(Extend(
        aligned.back(), ids.subspan(static_cast<size_t>((k - 1) * P), static_cast<size_t>(P))));
  auto key_at = [&](int64_t n) {
    const int64_t k = n / P;
    return n % P == 0
               ? aligned[static_cast<size_t>(k)]
               : Extend(aligned[static_cast<size_t>(k)],
                        ids.subspan(static_cast<size_t>(k * P), static_cast<size_t>(n - k * P)));
  };
  std::vector<int64_t> candidates;
  if (n_max % P != 0 && n_max > min_tokens) candidates.push_back(n_max);
  for (int64_t n = n_max / P * P; n > min_tokens && n > 0; n -= P) candidates.push_back(n);
  for (int64_t n : candidates) {
    Hit hit;
    int64_t at = n;
    bool complete = true;
    while (true) {
      const Sha256Digest key = key_at(at);
      std::optional<RamEntry> e = Load(key, ids, at);
      if (!e) {
        complete = false;
        break;
      }
      hit.blobs.push_back(e->blob);
      hit.lengths.push_back(at);
      hit.keys.push_back(key);
      if (e->first_page == 0) break;
      at = e->first_page * P;  // ReadFile checked it is below
    }
    if (!complete) continue;
    std::reverse(hit.blobs.begin(), hit.blobs.end());
    std::reverse(hit.lengths.begin(), hit.lengths.end());
    std::reverse(hit.keys.begin(), hit.keys.end());
    hit.n_tokens = n;
    if (count) {
      std::lock_guard lock(mu_);
      stats_.hit_tokens += n;
    }
    return hit;
  }
  return std::nullopt;
}

void KvStore::Prefetch(std::span<const int32_t> ids, int64_t max_tokens) {
  if (options_.ram_bytes <= 0) return;  // nothing to bring the entries into
  (void)Resolve(ids, 0, max_tokens, /*count=*/false);
}

std::optional<KvStore::Hit> KvStore::Lookup(std::span<const int32_t> ids, int64_t min_tokens,
                                            int64_t max_tokens) {
  std::optional<Hit> hit = Resolve(ids, min_tokens, max_tokens, /*count=*/true);
  std::lock_guard lock(mu_);
  ++stats_.lookups;
  if (!hit) ++stats_.misses;
  return hit;
}

// ---- the disk tier's writer ---------------------------------------------------------------------

void KvStore::ScanDir() {
  DIR* dir = ::opendir(options_.dir.c_str());
  if (dir == nullptr) return;
  struct Found {
    Sha256Digest key;
    int64_t bytes;
    int64_t mtime;
  };
  std::vector<Found> found;
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  while (dirent* ent = ::readdir(dir)) {
    const std::string name = ent->d_name;
    struct stat st {};
    const std::string path = options_.dir + "/" + name;
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    // A writer killed mid-write leaves its temporary file; one an hour old has no writer left.
    if (name.rfind(".tmp-", 0) == 0 && now - st.st_mtime > 3600) ::unlink(path.c_str());
    if (auto key = KeyOfName(name)) found.push_back({*key, st.st_size, st.st_mtime});
  }
  ::closedir(dir);
  std::sort(found.begin(), found.end(),
            [](const Found& a, const Found& b) { return a.mtime < b.mtime; });
  std::lock_guard lock(mu_);
  // Files this store does not know yet (another replica's, or a previous run's) count as older
  // than any use of this run, in the order of their times.
  const int64_t n = static_cast<int64_t>(found.size());
  disk_bytes_ = 0;
  std::unordered_map<Sha256Digest, DiskEntry, KeyHash> next;
  for (int64_t i = 0; i < n; ++i) {
    const Found& f = found[static_cast<size_t>(i)];
    auto known = disk_.find(f.key);
    DiskEntry e = known != disk_.end() ? known->second : DiskEntry{0, i - n, 0};
    e.bytes = f.bytes;
    disk_bytes_ += e.bytes;
    next[f.key] = e;
  }
  disk_ = std::move(next);
}

Status KvStore::WriteFile(const Write& w) {
  const std::string final_path = PathOf(w.key);
  struct stat st {};
  if (::stat(final_path.c_str(), &st) == 0) {  // another writer (replica) published it
    std::lock_guard lock(mu_);
    DiskEntry& d = disk_[w.key];
    if (d.bytes == 0) {
      d.bytes = static_cast<int64_t>(st.st_size);
      disk_bytes_ += d.bytes;
    }
    d.last_use = ++clock_;
    return Status::Ok();
  }
  EntryFileHeader h;
  h.key = w.key;
  h.salt = salt_digest_;
  h.n_tokens = w.n_tokens;
  h.first_page = w.first_page;
  h.blob_bytes = static_cast<int64_t>(w.blob->size());
  const std::vector<uint8_t> file = EncodeEntryFile(h, *w.blob);
  std::string tmp;
  {
    std::lock_guard lock(mu_);
    tmp = options_.dir + "/.tmp-" + HexDigest(w.key) + "-" + std::to_string(::getpid()) + "-" +
          std::to_string(tmp_counter_++);
  }
  if (options_.write_fault) {
    if (const int err = options_.write_fault(); err != 0) return ErrnoStatus("write " + tmp, err);
  }
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus("create " + tmp, errno);
  size_t put = 0;
  int err = 0;
  while (put < file.size()) {
    const ssize_t r = ::write(fd, file.data() + put, file.size() - put);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      err = r < 0 ? errno : ENOSPC;
      break;
    }
    put += static_cast<size_t>(r);
  }
  // The bytes reach the disk before the name is published, so a crash or power loss never
  // leaves a published name over missing data (the checksum would catch it, at the price of a
  // recompute); the directory entry is then made durable too, best-effort (a lost rename only
  // loses the entry).
  if (err == 0 && ::fdatasync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && ::rename(tmp.c_str(), final_path.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    return ErrnoStatus("write " + final_path, err);
  }
  if (const int dir_fd = ::open(options_.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      dir_fd >= 0) {
    (void)::fsync(dir_fd);
    ::close(dir_fd);
  }
  std::lock_guard lock(mu_);
  stats_.store_bytes += static_cast<int64_t>(file.size());
  ++stats_.stores;
  DiskEntry& d = disk_[w.key];
  if (d.bytes == 0) {
    d.bytes = static_cast<int64_t>(file.size());
    disk_bytes_ += d.bytes;
  }
  d.last_use = ++clock_;
  return Status::Ok();
}

void KvStore::EnforceDiskBudget() {
  {
    std::lock_guard lock(mu_);
    if (disk_bytes_ <= options_.disk_bytes) return;
  }
  ScanDir();  // other replicas' files count against the shared directory's budget too
  while (true) {
    Sha256Digest victim{};
    {
      std::lock_guard lock(mu_);
      if (disk_bytes_ <= options_.disk_bytes || disk_.empty()) return;
      auto it = std::min_element(disk_.begin(), disk_.end(), [](const auto& a, const auto& b) {
        return Score(a.second.last_use, a.second.hits) < Score(b.second.last_use, b.second.hits);
      });
      victim = it->first;
      disk_bytes_ -= it->second.bytes;
      disk_.erase(it);
      ++stats_.disk_evictions;
    }
    ::unlink(PathOf(victim).c_str());
  }
}

void KvStore::IoLoop() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || !writes_.empty(); });
    if (writes_.empty()) break;  // stopping, and everything queued is written
    Write w = std::move(writes_.front());
    writes_.pop_front();
    ++writing_;
    lock.unlock();
    const auto t0 = SteadyClock::now();
    Status st = static_cast<int64_t>(w.blob->size() + EntryFileHeader::kBytes) > options_.disk_bytes
                    ? ResourceExhausted("entry larger than the disk budget")
                    : WriteFile(w);
    if (st.ok()) EnforceDiskBudget();
    const double seconds = SecondsSince(t0);
    lock.lock();
    if (!st.ok()) ++stats_.store_errors;
    stats_.store_seconds += seconds;
    --writing_;
    cv_.notify_all();
  }
}

}  // namespace dsinfer::runtime
