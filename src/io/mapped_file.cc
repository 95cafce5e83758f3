#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

namespace dsinfer::io {
namespace {

std::string ErrnoText(int error) { return std::strerror(error); }

// Closes the descriptor on every exit path of Open; the mapping outlives it.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() { ::close(fd_); }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

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

Status MappedFile::CopyIntoMemory() {
  if (copied_ || data_ == nullptr) {
    copied_ = true;
    return Status::Ok();
  }
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return IoError("cannot reopen " + path_ + " to copy it: " + ErrnoText(errno));
  FdCloser closer(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) return IoError("cannot stat " + path_ + ": " + ErrnoText(errno));
  if (static_cast<uint64_t>(st.st_dev) != device_ || static_cast<uint64_t>(st.st_ino) != inode_ ||
      static_cast<size_t>(st.st_size) != size_)
    return IoError(path_ + " was replaced or resized since it was mapped");

  constexpr size_t kHugePage = size_t{2} << 20;
  const size_t region_size = size_ + kHugePage;  // room to start on a 2 MiB boundary
  void* region =
      ::mmap(nullptr, region_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (region == MAP_FAILED)
    return IoError("cannot allocate " + std::to_string(size_) + " bytes to copy " + path_ +
                   " into memory: " + ErrnoText(errno));
  const auto base = reinterpret_cast<uintptr_t>(region);
  auto* copy = reinterpret_cast<uint8_t*>((base + kHugePage - 1) & ~(kHugePage - 1));
  // Fewer page faults while copying and fewer TLB misses after; a hint, so failures are fine.
  (void)::madvise(copy, size_, MADV_HUGEPAGE);

  // Whole huge pages per thread; each thread's first error wins.
  const unsigned hardware = std::max(1u, std::thread::hardware_concurrency());
  const size_t n_threads = std::min<size_t>({hardware, 8, (size_ + kHugePage - 1) / kHugePage});
  const size_t per_thread =
      ((size_ + n_threads - 1) / n_threads + kHugePage - 1) & ~(kHugePage - 1);
  std::vector<int> errors(n_threads, 0);  // errno, or -1 for a short read
  {
    std::vector<std::thread> threads;
    for (size_t t = 0; t < n_threads; ++t)
      threads.emplace_back([&, t] {
        const size_t begin = std::min(size_, t * per_thread);
        const size_t end = std::min(size_, begin + per_thread);
        for (size_t at = begin; at < end;) {
          const ssize_t got = ::pread(fd, copy + at, std::min<size_t>(end - at, size_t{64} << 20),
                                      static_cast<off_t>(at));
          if (got < 0 && errno == EINTR) continue;
          if (got <= 0) {
            errors[t] = got < 0 ? errno : -1;
            return;
          }
          at += static_cast<size_t>(got);
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
  return Status::Ok();
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

}  // namespace dsinfer::io
