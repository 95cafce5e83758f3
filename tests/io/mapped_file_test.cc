#include "io/mapped_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "core/cpu_topology.h"
#include "io_test_util.h"

namespace dsinfer::io {
namespace {

using testing::ScratchDir;
using testing::WriteBytes;

// Resident set size of this process in bytes (second field of /proc/self/statm, in pages).
uint64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t total_pages = 0, resident_pages = 0;
  statm >> total_pages >> resident_pages;
  return resident_pages * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

TEST(MappedFileTest, MapsContents) {
  ScratchDir dir;
  std::vector<uint8_t> bytes = {1, 2, 3, 250, 0, 7};
  WriteBytes(dir.File("f.bin"), bytes);
  auto file = MappedFile::Open(dir.File("f.bin"));
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ((*file)->size(), bytes.size());
  EXPECT_EQ((*file)->path(), dir.File("f.bin"));
  std::span<const uint8_t> view = (*file)->bytes();
  EXPECT_EQ(std::vector<uint8_t>(view.begin(), view.end()), bytes);
}

TEST(MappedFileTest, EmptyFileIsAnEmptyMapping) {
  ScratchDir dir;
  WriteBytes(dir.File("empty"), {});
  auto file = MappedFile::Open(dir.File("empty"));
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ((*file)->size(), 0u);
  EXPECT_TRUE((*file)->bytes().empty());
  EXPECT_TRUE((*file)->AdviseWillNeed(0, 100).ok());
}

TEST(MappedFileTest, MissingFileNamesPathAndErrno) {
  ScratchDir dir;
  auto file = MappedFile::Open(dir.File("nope.bin"));
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), StatusCode::kNotFound);
  EXPECT_NE(file.status().message().find(dir.File("nope.bin")), std::string::npos);
  EXPECT_NE(file.status().message().find("No such file or directory"), std::string::npos)
      << file.status().message();
}

TEST(MappedFileTest, DirectoryIsRejected) {
  ScratchDir dir;
  auto file = MappedFile::Open(dir.path());
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().message().find(dir.path()), std::string::npos);
  EXPECT_NE(file.status().message().find("not a regular file"), std::string::npos);
}

TEST(MappedFileTest, UnreadableFileNamesErrno) {
  if (::geteuid() == 0) GTEST_SKIP() << "root ignores file permissions";
  ScratchDir dir;
  WriteBytes(dir.File("secret"), {1});
  std::filesystem::permissions(dir.File("secret"), std::filesystem::perms::none);
  auto file = MappedFile::Open(dir.File("secret"));
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().message().find("Permission denied"), std::string::npos);
}

// Mapping must cost address space, not memory: resident size stays flat after Open() and only
// grows when pages are touched. The touch step proves the measurement can see the file.
TEST(MappedFileTest, OpenIsZeroCopyUntilTouched) {
  ScratchDir dir;
  constexpr uint64_t kFileBytes = 256ull << 20;
  const std::string path = dir.File("big.bin");
  {
    std::ofstream out(path, std::ios::binary);
    std::vector<char> chunk(1 << 20);
    for (size_t i = 0; i < chunk.size(); ++i) chunk[i] = static_cast<char>(i * 31 + 1);
    for (uint64_t written = 0; written < kFileBytes; written += chunk.size()) {
      out.write(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    }
    ASSERT_TRUE(out.good());
  }
  const uint64_t before_open = ResidentBytes();
  auto file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  ASSERT_EQ((*file)->size(), kFileBytes);
  const uint64_t after_open = ResidentBytes();

  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  std::span<const uint8_t> bytes = (*file)->bytes();
  uint64_t checksum = 0;
  for (uint64_t i = 0; i < kFileBytes; i += page) checksum += bytes[i];
  const uint64_t after_touch = ResidentBytes();

  ASSERT_TRUE((*file)->AdviseDontNeed(0, kFileBytes).ok());
  const uint64_t after_dontneed = ResidentBytes();

  auto mib = [](int64_t b) { return static_cast<double>(b) / (1 << 20); };
  std::printf(
      "[ zero-copy ] file %.0f MiB: RSS delta after Open %+.1f MiB, after touching every page "
      "%+.1f MiB, after MADV_DONTNEED %+.1f MiB (checksum %llu)\n",
      mib(kFileBytes), mib(static_cast<int64_t>(after_open - before_open)),
      mib(static_cast<int64_t>(after_touch - before_open)),
      mib(static_cast<int64_t>(after_dontneed - before_open)),
      static_cast<unsigned long long>(checksum));
  EXPECT_LT(after_open, before_open + (8ull << 20)) << "Open() read the file";
  EXPECT_GT(after_touch, before_open + kFileBytes * 3 / 4) << "touching pages was not measured";
  EXPECT_LT(after_dontneed, before_open + kFileBytes / 4) << "MADV_DONTNEED did not release";
}

TEST(MappedFileTest, AdviseClampsRanges) {
  ScratchDir dir;
  WriteBytes(dir.File("f"), std::vector<uint8_t>(10000, 3));
  auto file = MappedFile::Open(dir.File("f"));
  ASSERT_TRUE(file.ok());
  EXPECT_TRUE((*file)->AdviseWillNeed(5000, ~0ull).ok());  // past the end: clamped
  EXPECT_TRUE((*file)->AdviseWillNeed(123, 1).ok());       // unaligned start: rounded down
  EXPECT_TRUE((*file)->AdviseWillNeed(20000, 5).ok());     // wholly outside: no-op
  EXPECT_EQ((*file)->bytes()[9999], 3);
}

// The copy holds the same bytes at a new, 2 MiB aligned address; the page-cache hints leave
// them alone (MADV_DONTNEED on anonymous memory would zero them); a second copy is a no-op.
TEST(MappedFileTest, CopyIntoMemoryKeepsTheBytesAndIgnoresHints) {
  ScratchDir dir;
  std::vector<uint8_t> want(3 * 4096 + 17);
  for (size_t i = 0; i < want.size(); ++i) want[i] = static_cast<uint8_t>(i * 131 + 7);
  WriteBytes(dir.File("f"), want);
  auto file = MappedFile::Open(dir.File("f"));
  ASSERT_TRUE(file.ok());
  EXPECT_FALSE((*file)->copied());
  const uint8_t* mapped = (*file)->bytes().data();
  ASSERT_TRUE((*file)->CopyIntoMemory().ok());
  EXPECT_TRUE((*file)->copied());
  const uint8_t* copy = (*file)->bytes().data();
  EXPECT_NE(copy, mapped);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(copy) % (uintptr_t{2} << 20), 0u);
  ASSERT_EQ((*file)->size(), want.size());
  EXPECT_TRUE(std::equal(want.begin(), want.end(), (*file)->bytes().begin()));
  // Just written, so all in the page cache: read through it.
  EXPECT_EQ((*file)->copy_stats().buffered_bytes, want.size());
  EXPECT_EQ((*file)->copy_stats().direct_bytes, 0u);
  EXPECT_TRUE((*file)->AdviseDontNeed(0, want.size()).ok());
  EXPECT_TRUE((*file)->AdviseWillNeed(0, want.size()).ok());
  EXPECT_TRUE(std::equal(want.begin(), want.end(), (*file)->bytes().begin()));
  ASSERT_TRUE((*file)->CopyIntoMemory().ok());
  EXPECT_EQ((*file)->bytes().data(), copy);
}

// Whether this filesystem serves an aligned O_DIRECT read of `path` (tmpfs on older kernels
// refuses O_DIRECT; some filesystems want larger alignment).
bool DirectReadsWork(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
  if (fd < 0) return false;
  void* buffer = nullptr;
  bool ok = ::posix_memalign(&buffer, 4096, 4096) == 0 && ::pread(fd, buffer, 4096, 0) == 4096;
  std::free(buffer);
  ::close(fd);
  return ok;
}

// Pages of [offset, offset + length) in the page cache, through a fresh mapping of `path`.
size_t CachedPages(const std::string& path, size_t size, size_t offset, size_t length) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  void* mapped = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> residency((length + page - 1) / page);
  ::mincore(static_cast<uint8_t*>(mapped) + offset, length, residency.data());
  ::munmap(mapped, size);
  return static_cast<size_t>(std::count_if(residency.begin(), residency.end(),
                                           [](unsigned char r) { return (r & 1) != 0; }));
}

// Chunks in the page cache are copied through it; the others are read past it with O_DIRECT,
// up to the last whole 4096-byte block, and the file's unaligned tail through the cache. The
// bytes are a hash of their offset, so a chunk read into the wrong place fails the comparison.
// With cache_line_offset not a multiple of 64 the copy is shifted off the block alignment
// O_DIRECT needs, and direct reads go through a bounce buffer.
void CheckUncachedChunksPastThePageCache(uint64_t cache_line_offset) {
  ScratchDir dir;
  constexpr size_t kChunk = MappedFile::kCopyChunkBytes;
  constexpr size_t kTail = 3 * 4096 + 100;  // the last chunk: three whole blocks and 100 bytes
  std::vector<uint8_t> want(2 * kChunk + kTail);
  for (size_t i = 0; i < want.size(); ++i)
    want[i] = static_cast<uint8_t>((static_cast<uint32_t>(i) * 2654435761u) >> 13);
  const std::string path = dir.File("f");
  WriteBytes(path, want);
  // Written back, then the second and third chunks dropped from the cache.
  const int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::fsync(fd), 0);
  ASSERT_EQ(::posix_fadvise(fd, kChunk, 0, POSIX_FADV_DONTNEED), 0);
  ::close(fd);
  if (CachedPages(path, want.size(), kChunk, want.size() - kChunk) != 0)
    GTEST_SKIP() << "the kernel kept the dropped pages in the cache";
  if (CachedPages(path, want.size(), 0, kChunk) != kChunk / 4096)
    GTEST_SKIP() << "the first chunk left the cache";
  if (!DirectReadsWork(path)) GTEST_SKIP() << "no O_DIRECT on this filesystem";

  auto file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->CopyIntoMemory(cache_line_offset).ok());
  ASSERT_EQ((*file)->size(), want.size());
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*file)->bytes().data() + cache_line_offset) % 64, 0u);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), (*file)->bytes().begin()));
  EXPECT_EQ((*file)->copy_stats().direct_bytes, kChunk + 3 * 4096);
  EXPECT_EQ((*file)->copy_stats().buffered_bytes, kChunk + 100);
  // The direct reads did not bring the chunks they read into the cache.
  EXPECT_EQ(CachedPages(path, want.size(), kChunk, kChunk), 0u);
}

TEST(MappedFileTest, CopyIntoMemoryReadsUncachedChunksPastThePageCache) {
  CheckUncachedChunksPastThePageCache(0);
}

TEST(MappedFileTest, CopyIntoMemoryShiftedToACacheLineReadsPastThePageCacheToo) {
  CheckUncachedChunksPastThePageCache(24);
}

// The copy puts the requested file offset on a 64-byte boundary (modulo 64), same bytes.
TEST(MappedFileTest, CopyIntoMemoryPutsTheRequestedOffsetOnACacheLine) {
  for (uint64_t offset : {0u, 8u, 24u, 63u, 64u + 48u}) {
    ScratchDir dir;
    std::vector<uint8_t> want(5 * 4096 + 33);
    for (size_t i = 0; i < want.size(); ++i) want[i] = static_cast<uint8_t>(i * 77 + offset);
    WriteBytes(dir.File("f"), want);
    auto file = MappedFile::Open(dir.File("f"));
    ASSERT_TRUE(file.ok());
    ASSERT_TRUE((*file)->CopyIntoMemory(offset).ok());
    EXPECT_EQ(reinterpret_cast<uintptr_t>((*file)->bytes().data() + offset) % 64, 0u) << offset;
    EXPECT_TRUE(std::equal(want.begin(), want.end(), (*file)->bytes().begin())) << offset;
  }
}

// --numa: the copy's mapping gets the placement before its first byte is written, so the pages
// land on the nodes asked for whichever thread copies them; a placement the kernel refuses fails
// the copy with the reason and leaves the file mapped and readable.
TEST(MappedFileTest, CopyIntoMemoryPlacesThePages) {
  ScratchDir dir;
  std::vector<uint8_t> want(5 * 4096 + 3);
  for (size_t i = 0; i < want.size(); ++i) want[i] = static_cast<uint8_t>(i * 17 + 1);
  WriteBytes(dir.File("f"), want);
  const Result<CpuPlacement> here = PlanCpuPlacementHere(NumaPolicy::kDistribute, 0);
  ASSERT_TRUE(here.ok());
  ASSERT_EQ(here->weights.mode, MemoryPlacement::Mode::kInterleave);
  {
    auto file = MappedFile::Open(dir.File("f"));
    ASSERT_TRUE(file.ok());
    const Status copied = (*file)->CopyIntoMemory(0, here->weights);
    if (!copied.ok() && copied.message().find("Function not implemented") != std::string::npos)
      GTEST_SKIP() << "this kernel has no NUMA support: " << copied.ToString();
    ASSERT_TRUE(copied.ok()) << copied.ToString();
    EXPECT_TRUE(std::equal(want.begin(), want.end(), (*file)->bytes().begin()));
    const auto mode = MemoryPlacementAt((*file)->bytes().data());
    ASSERT_TRUE(mode.ok()) << mode.status().ToString();
    EXPECT_EQ(*mode, MemoryPlacement::Mode::kInterleave);
    const auto nodes = NodesOfPages({(*file)->bytes().data()});
    ASSERT_TRUE(nodes.ok());
    EXPECT_TRUE(std::count(here->weights.nodes.begin(), here->weights.nodes.end(), (*nodes)[0]));
  }
  auto file = MappedFile::Open(dir.File("f"));
  ASSERT_TRUE(file.ok());
  const Status refused =
      (*file)->CopyIntoMemory(0, {MemoryPlacement::Mode::kPreferred, std::vector<int>{1000}});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("NUMA node 1000"), std::string::npos) << refused.ToString();
  EXPECT_FALSE((*file)->copied());
  EXPECT_TRUE(std::equal(want.begin(), want.end(), (*file)->bytes().begin()));
}

TEST(MappedFileTest, CopyIntoMemoryOfAnEmptyFile) {
  ScratchDir dir;
  WriteBytes(dir.File("empty"), {});
  auto file = MappedFile::Open(dir.File("empty"));
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->CopyIntoMemory().ok());
  EXPECT_TRUE((*file)->copied());
  EXPECT_EQ((*file)->size(), 0u);
}

}  // namespace
}  // namespace dsinfer::io
