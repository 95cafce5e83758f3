#include "core/sha256.h"

#include <openssl/evp.h>

#include "core/status.h"

namespace dsinfer {

struct Sha256::Ctx {
  EVP_MD_CTX* md = nullptr;
};

Sha256::Sha256() : ctx_(std::make_unique<Ctx>()) {
  ctx_->md = EVP_MD_CTX_new();
  DSINFER_CHECK_MSG(ctx_->md != nullptr && EVP_DigestInit_ex(ctx_->md, EVP_sha256(), nullptr) == 1,
                    "OpenSSL: SHA-256 context");
}

Sha256::~Sha256() { EVP_MD_CTX_free(ctx_->md); }

void Sha256::Update(std::span<const uint8_t> bytes) {
  if (bytes.empty()) return;
  DSINFER_CHECK(EVP_DigestUpdate(ctx_->md, bytes.data(), bytes.size()) == 1);
}

Sha256Digest Sha256::Finish() {
  Sha256Digest out{};
  unsigned int n = 0;
  DSINFER_CHECK(EVP_DigestFinal_ex(ctx_->md, out.data(), &n) == 1 && n == out.size());
  return out;
}

Sha256Digest Sha256::Of(std::span<const uint8_t> bytes) {
  Sha256 h;
  h.Update(bytes);
  return h.Finish();
}

std::string HexDigest(const Sha256Digest& digest) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  s.reserve(64);
  for (uint8_t b : digest) {
    s.push_back(kHex[b >> 4]);
    s.push_back(kHex[b & 15]);
  }
  return s;
}

}  // namespace dsinfer
