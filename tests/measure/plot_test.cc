// The PNG encoder read back by an independent decoder written here (bitwise CRC-32, Adler-32,
// stored-block inflate), known-answer checksums, and the line-plot rasterizer's geometry.
#include "measure/plot.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "measure/png.h"

namespace dsinfer::measure {
namespace {

uint32_t BitwiseCrc32(const std::string& data) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : data) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return ~c;
}

uint32_t ReadBe32(const std::string& s, size_t at) {
  return (uint32_t{static_cast<uint8_t>(s[at])} << 24) |
         (uint32_t{static_cast<uint8_t>(s[at + 1])} << 16) |
         (uint32_t{static_cast<uint8_t>(s[at + 2])} << 8) |
         uint32_t{static_cast<uint8_t>(s[at + 3])};
}

struct DecodedPng {
  uint32_t width = 0, height = 0;
  std::string ihdr_rest;  // depth, colour type, compression, filter, interlace
  std::string palette;
  std::string raw;  // inflated scanlines
  std::vector<std::string> chunk_types;
};

// Parses chunks (checking every CRC), then inflates IDAT's stored blocks, checking the zlib header,
// each block's LEN/NLEN and the Adler-32 trailer.
DecodedPng Decode(const std::string& png) {
  DecodedPng d;
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n"));
  std::string idat;
  size_t at = 8;
  while (at + 12 <= png.size()) {
    const uint32_t len = ReadBe32(png, at);
    const std::string typed = png.substr(at + 4, 4 + len);
    EXPECT_EQ(ReadBe32(png, at + 8 + len), BitwiseCrc32(typed)) << typed.substr(0, 4);
    const std::string type = typed.substr(0, 4), body = typed.substr(4);
    d.chunk_types.push_back(type);
    if (type == "IHDR") {
      d.width = ReadBe32(body, 0);
      d.height = ReadBe32(body, 4);
      d.ihdr_rest = body.substr(8);
    } else if (type == "PLTE") {
      d.palette = body;
    } else if (type == "IDAT") {
      idat += body;
    }
    at += 12 + len;
  }
  EXPECT_EQ(at, png.size());
  EXPECT_EQ((uint8_t(idat[0]) * 256 + uint8_t(idat[1])) % 31, 0);  // FCHECK
  EXPECT_EQ(uint8_t(idat[0]) & 0x0F, 8);                           // deflate
  size_t p = 2;
  for (bool last = false; !last;) {
    const uint8_t header = static_cast<uint8_t>(idat[p++]);
    last = header & 1;
    EXPECT_EQ(header >> 1, 0) << "not a stored block";
    const uint16_t len = static_cast<uint16_t>(uint8_t(idat[p]) | (uint8_t(idat[p + 1]) << 8));
    const uint16_t nlen = static_cast<uint16_t>(uint8_t(idat[p + 2]) | (uint8_t(idat[p + 3]) << 8));
    EXPECT_EQ(static_cast<uint16_t>(~len), nlen);
    d.raw += idat.substr(p + 4, len);
    p += 4 + len;
  }
  uint32_t a = 1, b = 0;
  for (unsigned char c : d.raw) {
    a = (a + c) % 65521;
    b = (b + a) % 65521;
  }
  EXPECT_EQ(ReadBe32(idat, p), (b << 16) | a);
  EXPECT_EQ(p + 4, idat.size());
  return d;
}

TEST(Png, KnownChecksums) {
  EXPECT_EQ(Crc32("123456789"), 0xCBF43926u);
  EXPECT_EQ(Crc32(""), 0u);
  EXPECT_EQ(Adler32("Wikipedia"), 0x11E60398u);
  EXPECT_EQ(Adler32(""), 1u);
}

TEST(Png, HeaderChunksAndPixelsRoundTrip) {
  IndexedImage img{3, 2, {0, 1, 2, 2, 1, 0}, {{255, 255, 255}, {0, 0, 0}, {10, 20, 30}}};
  const DecodedPng d = Decode(EncodePng(img));
  EXPECT_EQ(d.chunk_types, (std::vector<std::string>{"IHDR", "PLTE", "IDAT", "IEND"}));
  EXPECT_EQ(d.width, 3u);
  EXPECT_EQ(d.height, 2u);
  EXPECT_EQ(d.ihdr_rest, std::string("\x08\x03\x00\x00\x00", 5));
  EXPECT_EQ(d.palette, std::string("\xff\xff\xff\x00\x00\x00\x0a\x14\x1e", 9));
  EXPECT_EQ(d.raw, std::string("\x00\x00\x01\x02\x00\x02\x01\x00", 8));  // filter 0 per row
}

TEST(Png, LargeImagesSpanSeveralStoredBlocks) {
  IndexedImage img;
  img.width = 400;
  img.height = 300;  // 120,300 raw bytes: two full blocks would not fit in one
  img.palette = {{0, 0, 0}, {255, 0, 0}, {0, 255, 0}};
  for (int i = 0; i < img.width * img.height; ++i)
    img.pixels.push_back(static_cast<uint8_t>(i % 3));
  const DecodedPng d = Decode(EncodePng(img));
  ASSERT_EQ(d.raw.size(), 300u * 401u);
  for (int y = 0; y < img.height; y += 37) {
    EXPECT_EQ(d.raw[static_cast<size_t>(y) * 401], '\0');
    for (int x = 0; x < img.width; x += 53)
      EXPECT_EQ(static_cast<uint8_t>(d.raw[static_cast<size_t>(y) * 401 + 1 + x]),
                img.pixels[static_cast<size_t>(y * img.width + x)]);
  }
}

// Bounding box of the pixels of one palette colour.
struct Box {
  int x0 = 1 << 30, y0 = 1 << 30, x1 = -1, y1 = -1;
  int count = 0;
};
Box BoxOf(const IndexedImage& img, uint8_t color, int x_from = 0, int x_to = 1 << 30) {
  Box b;
  for (int y = 0; y < img.height; ++y)
    for (int x = x_from; x < std::min(x_to, img.width); ++x)
      if (img.pixels[static_cast<size_t>(y * img.width + x)] == color) {
        b.x0 = std::min(b.x0, x);
        b.y0 = std::min(b.y0, y);
        b.x1 = std::max(b.x1, x);
        b.y1 = std::max(b.y1, y);
        ++b.count;
      }
  return b;
}

TEST(Plot, ARisingSeriesGoesFromTheAxisToTheTopOfThePlot) {
  LinePlot plot{"T", "X", "Y", {"1", "4", "16"}, {{"S", {0, 5, 10}}}};
  const IndexedImage img = RenderLinePlot(plot, 400, 300);
  ASSERT_EQ(img.width, 400);
  ASSERT_EQ(img.height, 300);
  // Exclude the legend's swatch (left of the first point) by looking right of it.
  const Box line = BoxOf(img, kPlotFirstSeries, 105);
  ASSERT_GT(line.count, 100);
  // y axis 0..10 (10 is already a nice bound) over pixel rows 250 (bottom) .. 50 (top); the
  // markers reach 3 pixels beyond the points.
  EXPECT_NEAR(line.y1, 250 + 3, 1);
  EXPECT_NEAR(line.y0, 50 - 3, 1);
  // The leftmost point is at the bottom, the rightmost at the top: rising left to right.
  const Box first = BoxOf(img, kPlotFirstSeries, line.x0, line.x0 + 4);
  const Box last = BoxOf(img, kPlotFirstSeries, line.x1 - 3, line.x1 + 1);
  EXPECT_GT(first.y0, 240);
  EXPECT_LT(last.y1, 60);
}

TEST(Plot, MissingValuesBreakTheLine) {
  LinePlot plot{"T", "X", "Y", {"1", "2", "3"}, {{"S", {4, std::nan(""), 4}}}};
  const IndexedImage img = RenderLinePlot(plot, 400, 300);
  const Box points = BoxOf(img, kPlotFirstSeries, 105);
  ASSERT_GT(points.count, 0);
  const int middle = (points.x0 + points.x1) / 2;
  EXPECT_EQ(BoxOf(img, kPlotFirstSeries, middle - 20, middle + 20).count, 0);
  // With the value present the same columns are crossed by the line.
  plot.series[0].y[1] = 4;
  EXPECT_GT(BoxOf(RenderLinePlot(plot, 400, 300), kPlotFirstSeries, middle - 20, middle + 20).count,
            0);
}

}  // namespace
}  // namespace dsinfer::measure
