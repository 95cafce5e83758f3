// The engine's two hooks into the RAM / disk tiers (runtime/kv_store.h): a sequence starting
// restores the longest stored prefix its hot prefix-cache hit does not cover; a prefill passing
// a page boundary (or one token before its prompt's end) exports its state to them. The export
// runs here on the engine thread (it reads the state's pages), the file IO on the store's thread.
#include "model/fingerprint.h"
#include "runtime/engine_impl.h"

namespace dsinfer::runtime {

Result<std::unique_ptr<KvStore>> OpenKvStore(const model::ModelWeights& weights,
                                             const EngineOptions& options,
                                             const backend::ModelRunner& runner) {
  const model::StateLayout* layout = runner.layout();
  if (layout == nullptr)
    return InvalidArgument("a KV store needs a paged runner; " + runner.device() +
                           " states cannot be exported");
  if (!options.enable_prefix_cache)
    return InvalidArgument("a KV store needs the prefix cache (it restores at its checkpoints)");
  if (layout->page_tokens % options.prefix_block_tokens != 0)
    return InvalidArgument(
        "the prefix cache's checkpoint spacing (" + std::to_string(options.prefix_block_tokens) +
        " tokens) must divide the state's page size (" + std::to_string(layout->page_tokens) + ")");
  KvStoreSalt salt;
  salt.model = model::ModelFingerprint(weights);
  salt.numerics = options.numerics.Name();
  salt.blob_version = model::StateBlobHeader::kVersion;
  salt.page_tokens = layout->page_tokens;
  salt.layout = layout->Describe();
  return KvStore::Open(*options.kv_store, salt);
}

std::unique_ptr<backend::RunnerState> Engine::Impl::RestoreFromStore(const Sequence& s,
                                                                     int64_t min_tokens,
                                                                     int64_t max_tokens) {
  std::optional<KvStore::Hit> hit = kv_store->Lookup(s.tokens, min_tokens, max_tokens);
  if (!hit) return nullptr;
  std::unique_ptr<RunnerState> state;
  for (size_t i = 0; i < hit->blobs.size(); ++i) {
    const std::span<const int32_t> ids =
        std::span<const int32_t>(s.tokens).first(static_cast<size_t>(hit->lengths[i]));
    auto next = model->Import(*hit->blobs[i], ids, state.get());
    if (!next.ok()) {
      // A refused blob is a damaged or foreign entry: it and the entries stored on top of it
      // (written by the same writer, or useless without it) are dropped, counted, recomputed,
      // and so are the shorter prefixes' entries below it, which may be of the same writer
      // without being in this chain (KvStore::ForgetBelow). Anything else (no pages left)
      // leaves the entries alone.
      if (next.status().code() == StatusCode::kInvalidArgument) {
        for (size_t j = i; j < hit->keys.size(); ++j) kv_store->Discard(hit->keys[j]);
        kv_store->ForgetBelow(s.tokens, hit->lengths[i]);
      }
      return nullptr;
    }
    state = std::move(next).value();
  }
  return state;
}

void Engine::Impl::Persist(const Sequence& s) {
  const int64_t n = s.state->n_tokens();
  if (n <= 0 || (n % kv_store->page_tokens() != 0 && n != s.n_prompt - 1)) return;
  const std::span<const int32_t> prefix =
      std::span<const int32_t>(s.tokens).first(static_cast<size_t>(n));
  if (kv_store->Contains(prefix)) return;
  const int64_t first_page = kv_store->FirstPageFor(prefix);
  auto blob = model->Export(*s.state, prefix, first_page);
  if (!blob.ok()) return;  // a runner that cannot export: nothing to store
  kv_store->Put(prefix, first_page, std::move(blob).value());
}

void Engine::Impl::ExportPromptState(Sequence& s) {
  Request& req = *s.req;
  req.exported = true;
  const std::span<const int32_t> prefix =
      std::span<const int32_t>(s.tokens).first(static_cast<size_t>(s.n_prompt - 1));
  auto blob = model->Export(*s.state, prefix, /*first_page=*/0);
  if (!blob.ok()) {
    req.export_status = blob.status().WithContext("exporting the prompt's state");
    return;
  }
  req.exported_state = std::make_shared<const std::vector<uint8_t>>(std::move(blob).value());
}

Result<std::unique_ptr<backend::RunnerState>> Engine::Impl::ImportPromptState(const Sequence& s) {
  const std::span<const int32_t> prefix =
      std::span<const int32_t>(s.tokens).first(static_cast<size_t>(s.n_prompt - 1));
  auto state = model->Import(*s.req->params.imported_state, prefix, /*base=*/nullptr);
  if (!state.ok()) return state.status().WithContext("importing the prefilled state");
  return state;
}

}  // namespace dsinfer::runtime
