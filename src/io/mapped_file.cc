#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

namespace dsinfer::io {
namespace {

std::string ErrnoText(int error) { return std::strerror(error); }

// Closes a descriptor (none when -1) on every exit path; a mapping outlives it.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

constexpr size_t kCopyChunk = MappedFile::kCopyChunkBytes;
// O_DIRECT needs offsets, lengths and addresses aligned to the device's logical block: 4096
// covers 512- and 4096-byte blocks. A filesystem that wants more answers EINVAL, and the copy
// then reads through the page cache.
constexpr size_t kDirectAlign = 4096;
constexpr size_t kCacheLineBytes = 64;

// Whether every page of `length` bytes from `mapped` (page-aligned, inside a file mapping) is in
// the page cache. mincore reports the cache only to the file's owner or a writer; for anyone
// else it says "not resident", and the chunk is read with O_DIRECT: correct, only slower than a
// memory copy when the file was in fact cached.
bool AllInPageCache(const uint8_t* mapped, size_t length, std::vector<unsigned char>& residency) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  residency.resize((length + page - 1) / page);
  if (::mincore(const_cast<uint8_t*>(mapped), length, residency.data()) != 0) return false;
  return std::all_of(residency.begin(), residency.end(),
                     [](unsigned char r) { return (r & 1) != 0; });
}

// Reads `length` bytes at `offset` into `out`: 0, an errno, or -1 when the file ends first.
int ReadFully(int fd, uint8_t* out, size_t length, size_t offset) {
  for (size_t done = 0; done < length;) {
    const ssize_t got = ::pread(fd, out + done, length - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return errno;
    if (got == 0) return -1;
    done += static_cast<size_t>(got);
  }
  return 0;
}

}  // namespace

Result<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  // O_NONBLOCK keeps open() from hanging on a FIFO passed by mistake; it has no effect on the
  // regular files accepted below.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    int error = errno;
    Status status = IoError("cannot open " + path + ": " + ErrnoText(error));
    if (error == ENOENT) status = NotFound("cannot open " + path + ": " + ErrnoText(error));
    return status;
  }
  FdCloser closer(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) return IoError("cannot stat " + path + ": " + ErrnoText(errno));
  if (!S_ISREG(st.st_mode)) return IoError("cannot map " + path + ": not a regular file");
  const size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    // mmap rejects length 0; an empty file is still a valid (empty) mapping.
    return std::unique_ptr<MappedFile>(new MappedFile(path, nullptr, 0));
  }
  // MAP_PRIVATE + PROT_READ: nothing is read here; pages fault in from the page cache on first
  // touch. The default readahead suits tensors that are read front to back, so no madvise is
  // applied up front (MADV_WILLNEED on a whole multi-GB checkpoint would start reading it all).
  void* mapped = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (mapped == MAP_FAILED) {
    return IoError("cannot mmap " + path + " (" + std::to_string(size) +
                   " bytes): " + ErrnoText(errno));
  }
  auto file =
      std::unique_ptr<MappedFile>(new MappedFile(path, static_cast<const uint8_t*>(mapped), size));
  file->device_ = static_cast<uint64_t>(st.st_dev);
  file->inode_ = static_cast<uint64_t>(st.st_ino);
  return file;
}

MappedFile::~MappedFile() {
  if (region_ != nullptr) ::munmap(region_, region_size_);
}

Status MappedFile::CopyIntoMemory(uint64_t cache_line_offset, const MemoryPlacement& placement) {
  if (copied_ || data_ == nullptr) {
    copied_ = true;
    return Status::Ok();
  }
  DSINFER_ASSIGN_OR_RETURN(const int fd, ReopenSameFile(O_RDONLY));
  FdCloser closer(fd);
  // -1 where the filesystem has no O_DIRECT (tmpfs on older kernels): every chunk goes through
  // the page cache then.
  const Result<int> direct = ReopenSameFile(O_RDONLY | O_DIRECT);
  const int direct_fd = direct.ok() ? *direct : -1;
  FdCloser direct_closer(direct_fd);

  constexpr size_t kHugePage = size_t{2} << 20;
  const size_t region_size = size_ + kHugePage;  // room to start on a 2 MiB boundary
  void* region =
      ::mmap(nullptr, region_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (region == MAP_FAILED)
    return IoError("cannot allocate " + std::to_string(size_) + " bytes to copy " + path_ +
                   " into memory: " + ErrnoText(errno));
  const auto base = reinterpret_cast<uintptr_t>(region);
  auto* const huge_page = reinterpret_cast<uint8_t*>((base + kHugePage - 1) & ~(kHugePage - 1));
  // File byte cache_line_offset at a multiple of 64 (the region's slack covers the shift).
  const size_t shift = (kCacheLineBytes - cache_line_offset % kCacheLineBytes) % kCacheLineBytes;
  uint8_t* const copy = huge_page + shift;
  if (const Status placed = PlaceMemory(region, region_size, placement); !placed.ok()) {
    ::munmap(region, region_size);
    return FailedPrecondition("copying " + path_ + " into memory: " + placed.message());
  }
  // Fewer page faults while copying and fewer TLB misses after; a hint, so failures are fine.
  (void)::madvise(huge_page, shift + size_, MADV_HUGEPAGE);

  // Chunks are handed out one at a time, so threads stay busy whatever each chunk's source.
  const size_t n_chunks = (size_ + kCopyChunk - 1) / kCopyChunk;
  const unsigned hardware = std::max(1u, std::thread::hardware_concurrency());
  const size_t n_threads = std::min<size_t>({hardware, 8, n_chunks});
  std::atomic<size_t> next_chunk{0};
  std::atomic<bool> direct_usable{direct_fd >= 0};
  std::atomic<uint64_t> direct_bytes{0}, buffered_bytes{0};
  std::vector<int> errors(n_threads, 0);  // each thread's first errno, or -1 for a short read
  {
    std::vector<std::thread> threads;
    for (size_t t = 0; t < n_threads; ++t)
      threads.emplace_back([&, t] {
        std::vector<unsigned char> residency;
        // O_DIRECT reads land here first when the copy is shifted off the block alignment.
        std::unique_ptr<uint8_t, decltype(&std::free)> bounce(nullptr, &std::free);
        if (shift != 0 && direct_usable.load())
          bounce.reset(static_cast<uint8_t*>(std::aligned_alloc(kDirectAlign, kCopyChunk)));
        for (size_t chunk; (chunk = next_chunk.fetch_add(1)) < n_chunks;) {
          const size_t begin = chunk * kCopyChunk;  // a multiple of kDirectAlign
          const size_t end = std::min(size_, begin + kCopyChunk);
          size_t buffered_from = begin;
          const size_t aligned_end = end / kDirectAlign * kDirectAlign;
          if (direct_usable.load() && aligned_end > begin && (shift == 0 || bounce != nullptr) &&
              !AllInPageCache(data_ + begin, end - begin, residency)) {
            uint8_t* const target = shift == 0 ? copy + begin : bounce.get();
            const int error = ReadFully(direct_fd, target, aligned_end - begin, begin);
            if (error == 0 && shift != 0) std::memcpy(copy + begin, target, aligned_end - begin);
            if (error == 0) {
              buffered_from = aligned_end;
              direct_bytes += aligned_end - begin;
            } else if (error == EINVAL) {
              direct_usable = false;  // this filesystem refuses the alignment: use the cache
            } else {
              errors[t] = error;
              return;
            }
          }
          if (const int error =
                  ReadFully(fd, copy + buffered_from, end - buffered_from, buffered_from)) {
            errors[t] = error;
            return;
          }
          buffered_bytes += end - buffered_from;
        }
      });
    for (auto& thread : threads) thread.join();
  }
  for (int error : errors) {
    if (error == 0) continue;
    ::munmap(region, region_size);
    return IoError("cannot read " + path_ + " into memory: " +
                   (error < 0 ? std::string("the file ended early") : ErrnoText(error)));
  }
  if (::mprotect(region, region_size, PROT_READ) != 0) {
    const int error = errno;
    ::munmap(region, region_size);
    return IoError("cannot make the copy of " + path_ + " read-only: " + ErrnoText(error));
  }
  ::munmap(region_, region_size_);
  region_ = region;
  region_size_ = region_size;
  data_ = copy;
  copied_ = true;
  copy_stats_ = {direct_bytes.load(), buffered_bytes.load()};
  return Status::Ok();
}

Result<int> MappedFile::ReopenSameFile(int flags) const {
  const int fd = ::open(path_.c_str(), flags | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return IoError("cannot reopen " + path_ + " to copy it: " + ErrnoText(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    return IoError("cannot stat " + path_ + ": " + ErrnoText(error));
  }
  if (static_cast<uint64_t>(st.st_dev) != device_ || static_cast<uint64_t>(st.st_ino) != inode_ ||
      static_cast<size_t>(st.st_size) != size_) {
    ::close(fd);
    return IoError(path_ + " was replaced or resized since it was mapped");
  }
  return fd;
}

Status MappedFile::Advise(uint64_t offset, uint64_t length, int advice,
                          const char* advice_name) const {
  // A copy has no page cache behind it (MADV_DONTNEED would zero anonymous pages).
  if (copied_ || data_ == nullptr || offset >= size_ || length == 0) return Status::Ok();
  const uint64_t end = length > size_ - offset ? size_ : offset + length;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t begin_page = offset / page * page;  // the mapping itself is page-aligned
  auto* start = const_cast<uint8_t*>(data_) + begin_page;
  if (::madvise(start, end - begin_page, advice) != 0) {
    return IoError(std::string("madvise(") + advice_name + ") failed for " + path_ + ": " +
                   ErrnoText(errno));
  }
  return Status::Ok();
}

Status MappedFile::AdviseWillNeed(uint64_t offset, uint64_t length) const {
  return Advise(offset, length, MADV_WILLNEED, "MADV_WILLNEED");
}

Status MappedFile::AdviseDontNeed(uint64_t offset, uint64_t length) const {
  return Advise(offset, length, MADV_DONTNEED, "MADV_DONTNEED");
}

Status MappedFile::AdviseRandom(uint64_t offset, uint64_t length) const {
  return Advise(offset, length, MADV_RANDOM, "MADV_RANDOM");
}

}  // namespace dsinfer::io
