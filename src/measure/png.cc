#include "measure/png.h"

#include <algorithm>

#include "core/status.h"

namespace dsinfer::measure {
namespace {

// The byte-at-a-time CRC table, built at compile time (a constant, not mutable state).
constexpr std::array<uint32_t, 256> kCrcTable = [] {
  std::array<uint32_t, 256> table{};
  for (uint32_t n = 0; n < 256; ++n) {
    uint32_t c = n;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    table[n] = c;
  }
  return table;
}();

void PutBigEndian32(std::string* out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8)
    out->push_back(static_cast<char>((v >> shift) & 0xFF));
}

// length, type, data, CRC over type + data.
void AppendChunk(std::string* out, std::string_view type, std::string_view data) {
  PutBigEndian32(out, static_cast<uint32_t>(data.size()));
  std::string typed(type);
  typed.append(data);
  out->append(typed);
  PutBigEndian32(out, Crc32(typed));
}

// A zlib stream (RFC 1950) holding `raw` in stored deflate blocks (RFC 1951 §3.2.4) of at most
// 65535 bytes each.
std::string ZlibStored(std::string_view raw) {
  std::string out;
  out.push_back(static_cast<char>(0x78));  // CM 8 (deflate), CINFO 7 (32K window)
  out.push_back(static_cast<char>(0x01));  // FLEVEL 0, no dictionary; (0x78 * 256 + 1) % 31 == 0
  size_t pos = 0;
  do {
    const size_t n = std::min<size_t>(raw.size() - pos, 65535);
    const bool last = pos + n == raw.size();
    out.push_back(static_cast<char>(last ? 1 : 0));  // BFINAL, BTYPE 00; the header ends a byte
    const uint16_t len = static_cast<uint16_t>(n), nlen = static_cast<uint16_t>(~len);
    out.push_back(static_cast<char>(len & 0xFF));
    out.push_back(static_cast<char>(len >> 8));
    out.push_back(static_cast<char>(nlen & 0xFF));
    out.push_back(static_cast<char>(nlen >> 8));
    out.append(raw.substr(pos, n));
    pos += n;
  } while (pos < raw.size());
  PutBigEndian32(&out, Adler32(raw));
  return out;
}

}  // namespace

uint32_t Crc32(std::string_view data) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : data) c = kCrcTable[(c ^ b) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t Adler32(std::string_view data) {
  constexpr uint32_t kMod = 65521;
  uint32_t a = 1, b = 0;
  for (unsigned char byte : data) {
    a = (a + byte) % kMod;
    b = (b + a) % kMod;
  }
  return (b << 16) | a;
}

std::string EncodePng(const IndexedImage& image) {
  DSINFER_CHECK(image.width > 0 && image.height > 0);
  DSINFER_CHECK(image.pixels.size() ==
                static_cast<size_t>(image.width) * static_cast<size_t>(image.height));
  DSINFER_CHECK(!image.palette.empty() && image.palette.size() <= 256);
  for (uint8_t p : image.pixels) DSINFER_CHECK(p < image.palette.size());

  std::string png = "\x89PNG\r\n\x1a\n";
  std::string ihdr;
  PutBigEndian32(&ihdr, static_cast<uint32_t>(image.width));
  PutBigEndian32(&ihdr, static_cast<uint32_t>(image.height));
  ihdr +=
      std::string("\x08\x03\x00\x00\x00", 5);  // depth 8, indexed, deflate, filter 0, no interlace
  AppendChunk(&png, "IHDR", ihdr);
  std::string plte;
  for (const auto& rgb : image.palette)
    for (uint8_t c : rgb) plte.push_back(static_cast<char>(c));
  AppendChunk(&png, "PLTE", plte);
  // Scanlines: a filter-type byte (0, none) before each row.
  std::string raw;
  raw.reserve(image.pixels.size() + static_cast<size_t>(image.height));
  for (int y = 0; y < image.height; ++y) {
    raw.push_back('\0');
    const auto* row =
        image.pixels.data() + static_cast<size_t>(y) * static_cast<size_t>(image.width);
    raw.append(reinterpret_cast<const char*>(row), static_cast<size_t>(image.width));
  }
  AppendChunk(&png, "IDAT", ZlibStored(raw));
  AppendChunk(&png, "IEND", "");
  return png;
}

}  // namespace dsinfer::measure
