#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

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
  return std::unique_ptr<MappedFile>(
      new MappedFile(path, static_cast<const uint8_t*>(mapped), size));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

Status MappedFile::Advise(uint64_t offset, uint64_t length, int advice,
                          const char* advice_name) const {
  if (data_ == nullptr || offset >= size_ || length == 0) return Status::Ok();
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
