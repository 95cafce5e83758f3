// A minimal PNG encoder for `bench serve --plot-dir`: 8-bit indexed colour (palette), no
// interlace, filter 0 on every row, and a zlib stream of *stored* (uncompressed) deflate blocks,
// so no compression library is needed. CRC-32 (chunks) and Adler-32 (zlib) are computed here.
// Plots are a few hundred KB this way, which is fine for a report directory.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dsinfer::measure {

struct IndexedImage {
  int width = 0, height = 0;
  std::vector<uint8_t> pixels;                  // [height, width] palette indices, row-major
  std::vector<std::array<uint8_t, 3>> palette;  // RGB, at most 256 entries
};

// CRC-32 (ISO 3309 / PNG, polynomial 0xEDB88320 reflected) and Adler-32 (RFC 1950) of `data`.
uint32_t Crc32(std::string_view data);
uint32_t Adler32(std::string_view data);

// The PNG file bytes. The image must be non-empty, pixels.size() == width * height, every index
// < palette.size() <= 256 (checked: a bad image is a broken invariant of the caller, not input).
std::string EncodePng(const IndexedImage& image);

}  // namespace dsinfer::measure
