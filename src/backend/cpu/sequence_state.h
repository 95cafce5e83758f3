// One sequence's decode state on the CPU, in the layout of model/state_layout.h: pages of
// compressed KV rows and indexer keys shared copy-on-write, and per layer the boundary part (the
// window ring of packed KV rows and the compressors' per-token projection history), plus V4.1
// Engram's token classes of the last n-gram positions. Rows are
// packed on write and unpacked on read, bit for bit.
//
// Operations beyond the forward pass: Truncate (roll back to n tokens: nothing to undo, since
// the ring and the history keep rollback_tokens more positions than the forward needs, and the
// rows past n are simply no longer visible), Snapshot / Restore (a copy that shares every page
// and keeps only the boundary the next token needs), Export / Import (model::StateBlob).
// Engine-thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/forward_types.h"
#include "backend/page_allocator.h"
#include "model/state_layout.h"

namespace dsinfer::backend::cpu {

// A ring of fixed-size rows indexed by position (slot = position % slots).
template <typename T>
struct PositionRing {
  int64_t slots = 0;
  int64_t row = 0;     // elements per row
  std::vector<T> data;  // [slots, row]

  void Init(int64_t n_slots, int64_t row_elems) {
    slots = n_slots, row = row_elems;
    data.assign(static_cast<size_t>(slots * row), T{});
  }
  T* At(int64_t pos) { return data.data() + (pos % slots) * row; }
  const T* At(int64_t pos) const { return data.data() + (pos % slots) * row; }
  int64_t Bytes() const { return static_cast<int64_t>(data.size() * sizeof(T)); }
};

struct LayerState {
  PositionRing<uint8_t> ring;        // window KV rows, packed (layout.kv_row)
  PositionRing<float> history;       // [2, kv_width]: a, then g + ape, per position
  PositionRing<float> index_history;  // [2, index_width], the indexer's compressor
};

class SequenceState final : public RunnerState {
 public:
  // A fresh state with full boundary capacity (rollback_tokens past the window and the groups).
  SequenceState(const model::StateLayout& layout, std::shared_ptr<PageAllocator> pages);
  // Back to a fresh sequence (pages released).
  void Reset();

  int64_t n_tokens() const override { return n_tokens_; }
  int64_t rollback_floor() const override;
  int64_t mtp_n_tokens() const { return mtp_n_tokens_; }
  const model::StateLayout& layout() const { return *layout_; }
  int n_layers() const { return static_cast<int>(layers_.size()); }

  // ---- the forward pass's access -------------------------------------------------------------
  // Window row of `pos` of layer l into row [head_dim] (pos must be inside the ring).
  void ReadWindow(int l, int64_t pos, float* row) const;
  Status WriteWindow(int l, int64_t pos, const float* row);
  // V4.1 Engram: the token class of `pos` (inside the kept history: the n-gram's previous
  // positions and the rollback).
  int32_t TokenClass(int64_t pos) const { return *token_classes_.At(pos); }
  void SetTokenClass(int64_t pos, int32_t cls) { *token_classes_.At(pos) = cls; }
  // Projection history row of `pos` ([2, width]: a, g + ape).
  float* History(int l, bool index, int64_t pos);
  const float* History(int l, bool index, int64_t pos) const;
  // Compressed KV row (index=false) or indexer key j of layer l, packed / unpacked.
  const uint8_t* PackedRow(int l, bool index, int64_t j) const;
  void ReadRow(int l, bool index, int64_t j, float* row) const;
  Status WriteRow(int l, bool index, int64_t j, const float* row);
  // Advance the lengths after a step (the forward has written every position below them).
  void Advance(int64_t n_tokens) { n_tokens_ = n_tokens; }
  void AdvanceMtp(int64_t n_tokens) { mtp_n_tokens_ = n_tokens; }

  // ---- state operations ----------------------------------------------------------------------
  // Back to n tokens (rollback_floor() <= n <= n_tokens()); the MTP stream follows (it runs one
  // position behind: at most n - 1 positions).
  Status Truncate(int64_t n);
  // The MTP stream alone back to n positions (speculative drafts chained past the backbone):
  // mtp_rollback_floor() <= n <= mtp_n_tokens(); the backbone is untouched.
  Status TruncateMtp(int64_t n);
  int64_t mtp_rollback_floor() const;
  // An exact copy sharing every page: stepping it gives the same bits as stepping this.
  std::unique_ptr<SequenceState> Copy() const;
  // A copy that keeps only the boundary the next position needs (no rollback): what a
  // prefix-cache entry holds. Restore it with Copy().
  std::unique_ptr<SequenceState> Snapshot() const;
  // The state as a self-describing blob: pages [first_page, PagesFor(n)), the boundary at n,
  // the token ids (tokens.size() == n_tokens()), the model fingerprint and numerics.
  Result<std::vector<uint8_t>> Export(std::span<const int32_t> tokens, int64_t first_page,
                                      const Sha256Digest& model,
                                      const std::string& numerics) const;
  // Rebuilds a state from Export's blob. The blob must name this model, numerics and layout and
  // hold exactly `tokens` (the ids the caller continues from). Pages below its first page come
  // from `base` (a state over the same tokens, at least that long). Nothing is built unless all
  // of it checks.
  static Result<std::unique_ptr<SequenceState>> Import(
      std::span<const uint8_t> blob, std::span<const int32_t> tokens,
      const model::StateLayout& layout, std::shared_ptr<PageAllocator> pages,
      const Sha256Digest& model, const std::string& numerics, const SequenceState* base);

  // Bytes this state holds apart from pages (ring and history), and the pages it references.
  int64_t BoundaryBytes() const;
  int64_t n_pages() const { return static_cast<int64_t>(pages_.size()); }
  const std::vector<PageRef>& pages() const { return pages_; }

 private:
  SequenceState(const SequenceState&) = default;
  SequenceState& operator=(SequenceState&&) = default;
  // The page holding byte range of row j (allocated, or copied when shared, for writing).
  Result<uint8_t*> WritablePage(int64_t page);
  // Copies the boundary rows the next position needs into `to` (whose rings may differ in size).
  void CopyBoundary(SequenceState& to) const;

  const model::StateLayout* layout_;
  std::shared_ptr<PageAllocator> allocator_;
  int64_t n_tokens_ = 0;
  int64_t mtp_n_tokens_ = 0;
  int64_t history_start_ = 0;  // positions before this have no boundary rows (restore point)
  int64_t mtp_history_start_ = 0;  // the same for the MTP stream
  int rollback_tokens_ = 0;    // how far back from n the boundary reaches
  std::vector<PageRef> pages_;
  std::vector<LayerState> layers_;  // backbone, then MTP
  PositionRing<int32_t> token_classes_;  // V4.1 Engram: [token_history_slots, 1]
};

}  // namespace dsinfer::backend::cpu
