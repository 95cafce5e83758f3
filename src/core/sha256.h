// SHA-256 over byte strings, through OpenSSL's libcrypto (EVP): the digest of state blobs and
// of a checkpoint's identity (model/fingerprint.h). Thread-compatible; each Sha256 is one
// running digest.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace dsinfer {

using Sha256Digest = std::array<uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(std::span<const uint8_t> bytes);
  void Update(std::string_view text) {
    Update(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
  }
  // The digest of everything added so far; the object must not be used after.
  Sha256Digest Finish();

  static Sha256Digest Of(std::span<const uint8_t> bytes);

 private:
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
};

std::string HexDigest(const Sha256Digest& digest);

}  // namespace dsinfer
