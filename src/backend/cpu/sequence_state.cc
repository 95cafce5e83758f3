#include "backend/cpu/sequence_state.h"

#include <algorithm>
#include <cstring>

namespace dsinfer::backend::cpu {

namespace {

// Positions [first, n) of a ring that the next position needs.
int64_t WindowFirst(int64_t n, int window) { return std::max<int64_t>(0, n - window); }
int64_t HistoryFirst(int64_t n, int ratio, bool overlap) {
  return std::max<int64_t>(0, model::CompressorHistoryFirst(n, ratio, overlap));
}
// The Engram token classes the next position's n-gram reads: positions [first, n).
int64_t TokenHistoryFirst(int64_t n, const model::StateLayout& layout) {
  return std::max<int64_t>(0, n - layout.token_history_needed);
}

}  // namespace

SequenceState::SequenceState(const model::StateLayout& layout,
                             std::shared_ptr<PageAllocator> pages)
    : layout_(&layout),
      allocator_(std::move(pages)),
      rollback_tokens_(layout.rollback_tokens),
      layers_(layout.layers.size()) {
  for (size_t l = 0; l < layers_.size(); ++l) {
    const model::LayerStateLayout& ll = layout.layers[l];
    layers_[l].ring.Init(ll.ring_slots, layout.kv_row.Bytes());
    if (ll.history_slots > 0) layers_[l].history.Init(ll.history_slots, 2 * int64_t{ll.kv_width});
    if (ll.index_history_slots > 0)
      layers_[l].index_history.Init(ll.index_history_slots, 2 * int64_t{ll.index_width});
  }
  if (layout.token_history_slots > 0) token_classes_.Init(layout.token_history_slots, 1);
}

void SequenceState::Reset() {
  n_tokens_ = mtp_n_tokens_ = history_start_ = mtp_history_start_ = 0;
  pages_.clear();
  if (rollback_tokens_ == layout_->rollback_tokens) return;  // rings already full size
  *this = SequenceState(*layout_, allocator_);
}

int64_t SequenceState::rollback_floor() const {
  return std::max<int64_t>({0, history_start_, n_tokens_ - rollback_tokens_});
}

void SequenceState::ReadWindow(int l, int64_t pos, float* row) const {
  model::UnpackRow(layout_->kv_row, layers_[l].ring.At(pos), row);
}

Status SequenceState::WriteWindow(int l, int64_t pos, const float* row) {
  return model::PackRow(layout_->kv_row, row, layers_[l].ring.At(pos));
}

float* SequenceState::History(int l, bool index, int64_t pos) {
  return (index ? layers_[l].index_history : layers_[l].history).At(pos);
}

const float* SequenceState::History(int l, bool index, int64_t pos) const {
  return (index ? layers_[l].index_history : layers_[l].history).At(pos);
}

const uint8_t* SequenceState::PackedRow(int l, bool index, int64_t j) const {
  const model::LayerStateLayout& ll = layout_->layers[l];
  const int64_t per_page = index ? ll.keys_per_page : ll.rows_per_page;
  const int64_t page = j / per_page;
  DSINFER_CHECK_MSG(page < static_cast<int64_t>(pages_.size()), "compressed row past the pages");
  const int64_t bytes = (index ? layout_->index_key : layout_->compressed_row).Bytes();
  return pages_[page]->data + (index ? ll.page_keys_offset : ll.page_rows_offset) +
         (j % per_page) * bytes;
}

void SequenceState::ReadRow(int l, bool index, int64_t j, float* row) const {
  model::UnpackRow(index ? layout_->index_key : layout_->compressed_row, PackedRow(l, index, j),
                   row);
}

Status SequenceState::WriteRow(int l, bool index, int64_t j, const float* row) {
  const model::LayerStateLayout& ll = layout_->layers[l];
  const int64_t per_page = index ? ll.keys_per_page : ll.rows_per_page;
  DSINFER_ASSIGN_OR_RETURN(uint8_t * page, WritablePage(j / per_page));
  const model::RowFormat& f = index ? layout_->index_key : layout_->compressed_row;
  return model::PackRow(f, row,
                        page + (index ? ll.page_keys_offset : ll.page_rows_offset) +
                            (j % per_page) * f.Bytes());
}

Result<uint8_t*> SequenceState::WritablePage(int64_t page) {
  while (static_cast<int64_t>(pages_.size()) <= page) {
    DSINFER_ASSIGN_OR_RETURN(PageRef p, allocator_->Allocate(layout_->page_bytes));
    // Zeroed: rows past a state's length are exported as zeros, never as stale memory.
    std::memset(p->data, 0, static_cast<size_t>(p->bytes));
    pages_.push_back(std::move(p));
  }
  PageRef& p = pages_[page];
  if (p.use_count() > 1) {  // shared with another sequence or a snapshot: copy on write
    DSINFER_ASSIGN_OR_RETURN(PageRef mine, allocator_->Allocate(layout_->page_bytes));
    std::memcpy(mine->data, p->data, static_cast<size_t>(p->bytes));
    p = std::move(mine);
  }
  return p->data;
}

Status SequenceState::Truncate(int64_t n) {
  if (n < rollback_floor() || n > n_tokens_)
    return OutOfRange("Truncate to " + std::to_string(n) + " tokens: this state can go back to " +
                      std::to_string(rollback_floor()) + " at the earliest (it holds " +
                      std::to_string(n_tokens_) + ")");
  // Rows and ring slots past n are no longer visible (every read is bounded by the length) and
  // are overwritten as positions come again; pages that held only such rows are released.
  n_tokens_ = n;
  mtp_n_tokens_ = std::min(mtp_n_tokens_, std::max<int64_t>(0, n - 1));
  const auto keep = static_cast<size_t>(layout_->PagesFor(n));
  if (pages_.size() > keep) pages_.resize(keep);
  return Status::Ok();
}

int64_t SequenceState::mtp_rollback_floor() const {
  return std::max<int64_t>({0, mtp_history_start_, mtp_n_tokens_ - rollback_tokens_});
}

Status SequenceState::TruncateMtp(int64_t n) {
  if (n < mtp_rollback_floor() || n > mtp_n_tokens_)
    return OutOfRange("TruncateMtp to " + std::to_string(n) +
                      " positions: the MTP stream can go "
                      "back to " +
                      std::to_string(mtp_rollback_floor()) +
                      " at the earliest (it "
                      "holds " +
                      std::to_string(mtp_n_tokens_) + ")");
  // As Truncate: ring slots past n are no longer visible and are overwritten when written again.
  mtp_n_tokens_ = n;
  return Status::Ok();
}

void SequenceState::CopyBoundary(SequenceState& to) const {
  for (size_t l = 0; l < layers_.size(); ++l) {
    const model::LayerStateLayout& ll = layout_->layers[l];
    const int64_t n = ll.mtp ? mtp_n_tokens_ : n_tokens_;
    const LayerState& a = layers_[l];
    LayerState& b = to.layers_[l];
    for (int64_t p = WindowFirst(n, layout_->window); p < n; ++p)
      std::memcpy(b.ring.At(p), a.ring.At(p), static_cast<size_t>(a.ring.row));
    if (ll.history_slots > 0)
      for (int64_t p = HistoryFirst(n, ll.compress_ratio, ll.overlap); p < n; ++p)
        std::memcpy(b.history.At(p), a.history.At(p), static_cast<size_t>(a.history.row) * 4);
    if (ll.index_history_slots > 0)
      for (int64_t p = HistoryFirst(n, ll.index_ratio, true); p < n; ++p)
        std::memcpy(b.index_history.At(p), a.index_history.At(p),
                    static_cast<size_t>(a.index_history.row) * 4);
  }
  if (layout_->token_history_slots > 0)
    for (int64_t p = TokenHistoryFirst(n_tokens_, *layout_); p < n_tokens_; ++p)
      to.SetTokenClass(p, TokenClass(p));
}

std::unique_ptr<SequenceState> SequenceState::Copy() const {
  if (rollback_tokens_ == layout_->rollback_tokens)
    return std::unique_ptr<SequenceState>(new SequenceState(*this));  // pages shared
  // A snapshot: back to full capacity, from its boundary on.
  auto s = std::make_unique<SequenceState>(*layout_, allocator_);
  s->n_tokens_ = n_tokens_;
  s->mtp_n_tokens_ = mtp_n_tokens_;
  s->history_start_ = n_tokens_;
  s->mtp_history_start_ = mtp_n_tokens_;
  s->pages_ = pages_;
  CopyBoundary(*s);
  return s;
}

std::unique_ptr<SequenceState> SequenceState::Snapshot() const {
  auto s = std::unique_ptr<SequenceState>(new SequenceState(*layout_, allocator_));
  s->n_tokens_ = n_tokens_;
  s->mtp_n_tokens_ = mtp_n_tokens_;
  s->history_start_ = n_tokens_;
  s->rollback_tokens_ = 0;
  s->pages_ = pages_;
  // Rings just large enough for the positions the next one reads (at least one slot).
  for (size_t l = 0; l < layers_.size(); ++l) {
    const model::LayerStateLayout& ll = layout_->layers[l];
    const int64_t n = ll.mtp ? mtp_n_tokens_ : n_tokens_;
    LayerState& b = s->layers_[l];
    b.ring.Init(std::max<int64_t>(1, n - WindowFirst(n, layout_->window)), b.ring.row);
    if (ll.history_slots > 0)
      b.history.Init(
          std::max<int64_t>(1, n - HistoryFirst(n, ll.compress_ratio, ll.overlap)), b.history.row);
    if (ll.index_history_slots > 0)
      b.index_history.Init(std::max<int64_t>(1, n - HistoryFirst(n, ll.index_ratio, true)),
                           b.index_history.row);
  }
  if (layout_->token_history_slots > 0)
    s->token_classes_.Init(std::max<int64_t>(1, n_tokens_ - TokenHistoryFirst(n_tokens_, *layout_)),
                           1);
  CopyBoundary(*s);
  return s;
}

int64_t SequenceState::BoundaryBytes() const {
  int64_t b = static_cast<int64_t>(sizeof(*this) + pages_.capacity() * sizeof(PageRef));
  for (const LayerState& l : layers_) b += l.ring.Bytes() + l.history.Bytes() + l.index_history.Bytes();
  return b + token_classes_.Bytes();
}

// ---- Export / Import -------------------------------------------------------------------------

namespace {

// Bytes of the boundary part of a blob at lengths n (backbone) / mtp_n.
int64_t BoundaryBlobBytes(const model::StateLayout& layout, int64_t n, int64_t mtp_n) {
  int64_t b = 0;
  for (const model::LayerStateLayout& ll : layout.layers) {
    const int64_t len = ll.mtp ? mtp_n : n;
    b += (len - WindowFirst(len, layout.window)) * layout.kv_row.Bytes();
    if (ll.history_slots > 0)
      b += (len - HistoryFirst(len, ll.compress_ratio, ll.overlap)) * 2 * ll.kv_width * 4;
    if (ll.index_history_slots > 0)
      b += (len - HistoryFirst(len, ll.index_ratio, true)) * 2 * ll.index_width * 4;
  }
  if (layout.token_history_slots > 0) b += (n - TokenHistoryFirst(n, layout)) * 4;
  return b;
}

// Visits the boundary rows of a state of lengths n / mtp_n in blob order: fn(bytes per row,
// ring or history of layer l, position).
template <typename Fn>
void ForEachBoundaryRow(const model::StateLayout& layout, int64_t n, int64_t mtp_n, Fn&& fn) {
  for (size_t l = 0; l < layout.layers.size(); ++l) {
    const model::LayerStateLayout& ll = layout.layers[l];
    const int64_t len = ll.mtp ? mtp_n : n;
    for (int64_t p = WindowFirst(len, layout.window); p < len; ++p) fn(l, 0, p);
    if (ll.history_slots > 0)
      for (int64_t p = HistoryFirst(len, ll.compress_ratio, ll.overlap); p < len; ++p) fn(l, 1, p);
    if (ll.index_history_slots > 0)
      for (int64_t p = HistoryFirst(len, ll.index_ratio, true); p < len; ++p) fn(l, 2, p);
  }
}

}  // namespace

Result<std::vector<uint8_t>> SequenceState::Export(std::span<const int32_t> tokens,
                                                   int64_t first_page, const Sha256Digest& model,
                                                   const std::string& numerics) const {
  const model::StateLayout& L = *layout_;
  if (static_cast<int64_t>(tokens.size()) != n_tokens_)
    return InvalidArgument("Export: " + std::to_string(tokens.size()) + " token ids for a state of " +
                           std::to_string(n_tokens_) + " tokens");
  const int64_t end_page = L.PagesFor(n_tokens_);
  if (first_page < 0 || first_page > end_page)
    return InvalidArgument("Export: first page " + std::to_string(first_page) + " outside [0, " +
                           std::to_string(end_page) + "]");
  std::vector<uint8_t> payload;
  payload.reserve(static_cast<size_t>((end_page - first_page) * L.page_bytes +
                                      BoundaryBlobBytes(L, n_tokens_, mtp_n_tokens_)));
  // Pages: the rows the state holds; zeros past them (rows a Truncate left behind included).
  for (int64_t m = first_page; m < end_page; ++m) {
    const size_t at = payload.size();
    payload.resize(at + static_cast<size_t>(L.page_bytes), 0);
    for (size_t l = 0; l < L.layers.size(); ++l) {
      const model::LayerStateLayout& ll = L.layers[l];
      for (bool index : {false, true}) {
        const int ratio = index ? ll.index_ratio : ll.compress_ratio;
        if (ratio == 0) continue;
        const int64_t per_page = index ? ll.keys_per_page : ll.rows_per_page;
        const int64_t bytes = (index ? L.index_key : L.compressed_row).Bytes();
        const int64_t have = n_tokens_ / ratio;
        for (int64_t j = m * per_page; j < std::min(have, (m + 1) * per_page); ++j)
          std::memcpy(payload.data() + at + (index ? ll.page_keys_offset : ll.page_rows_offset) +
                          (j - m * per_page) * bytes,
                      PackedRow(static_cast<int>(l), index, j), static_cast<size_t>(bytes));
      }
    }
  }
  ForEachBoundaryRow(L, n_tokens_, mtp_n_tokens_, [&](size_t l, int part, int64_t p) {
    const LayerState& ls = layers_[l];
    const uint8_t* src =
        part == 0 ? ls.ring.At(p)
                  : reinterpret_cast<const uint8_t*>(part == 1 ? ls.history.At(p)
                                                               : ls.index_history.At(p));
    const int64_t bytes =
        part == 0 ? ls.ring.row : (part == 1 ? ls.history.row : ls.index_history.row) * 4;
    payload.insert(payload.end(), src, src + bytes);
  });
  if (L.token_history_slots > 0)
    for (int64_t p = TokenHistoryFirst(n_tokens_, L); p < n_tokens_; ++p) {
      const int32_t cls = TokenClass(p);
      const auto* b = reinterpret_cast<const uint8_t*>(&cls);
      payload.insert(payload.end(), b, b + 4);
    }
  model::StateBlobHeader h;
  h.model = model;
  h.numerics = numerics;
  h.kv_row = L.kv_row;
  h.compressed_row = L.compressed_row;
  h.index_key = L.index_key;
  h.page_tokens = L.page_tokens;
  h.window = L.window;
  h.n_layers = static_cast<int>(L.layers.size());
  h.first_page = first_page;
  h.end_pos = n_tokens_;
  h.mtp_end_pos = mtp_n_tokens_;
  h.tokens.assign(tokens.begin(), tokens.end());
  return model::EncodeStateBlob(h, payload);
}

Result<std::unique_ptr<SequenceState>> SequenceState::Import(
    std::span<const uint8_t> blob, std::span<const int32_t> tokens,
    const model::StateLayout& layout, std::shared_ptr<PageAllocator> pages,
    const Sha256Digest& model, const std::string& numerics, const SequenceState* base) {
  DSINFER_ASSIGN_OR_RETURN(model::DecodedStateBlob d, model::DecodeStateBlob(blob));
  const model::StateBlobHeader& h = d.header;
  auto refuse = [](const std::string& what) {
    return InvalidArgument("state blob refused: " + what);
  };
  if (h.model != model) return refuse("it was written by another model (fingerprint differs)");
  if (h.numerics != numerics)
    return refuse("it holds " + h.numerics + " numerics, this model runs " + numerics);
  if (h.kv_row != layout.kv_row || h.compressed_row != layout.compressed_row ||
      h.index_key != layout.index_key)
    return refuse("its row formats (" + h.kv_row.Describe() + ", " + h.compressed_row.Describe() +
                  ", " + h.index_key.Describe() + ") are not this layout's");
  if (h.page_tokens != layout.page_tokens)
    return refuse("page size " + std::to_string(h.page_tokens) + ", this layout uses " +
                  std::to_string(layout.page_tokens));
  if (h.window != layout.window || h.n_layers != static_cast<int>(layout.layers.size()))
    return refuse("its window or layer count differs from this model's");
  if (h.tokens.size() != tokens.size() ||
      !std::equal(h.tokens.begin(), h.tokens.end(), tokens.begin()))
    return refuse("it holds other tokens than the ones to continue from");
  const int64_t end_page = layout.PagesFor(h.end_pos);
  if (h.first_page > 0 &&
      (base == nullptr || base->layout_ != &layout || base->n_tokens_ < h.first_page * h.page_tokens ||
       static_cast<int64_t>(base->pages_.size()) < h.first_page))
    return refuse("it starts at page " + std::to_string(h.first_page) +
                  " and no state holding the pages before it was given");
  const int64_t want = (end_page - h.first_page) * layout.page_bytes +
                       BoundaryBlobBytes(layout, h.end_pos, h.mtp_end_pos);
  if (static_cast<int64_t>(d.payload.size()) != want)
    return refuse("payload of " + std::to_string(d.payload.size()) + " bytes, the layout needs " +
                  std::to_string(want));

  auto s = std::make_unique<SequenceState>(layout, std::move(pages));
  s->n_tokens_ = h.end_pos;
  s->mtp_n_tokens_ = h.mtp_end_pos;
  s->history_start_ = h.end_pos;
  s->mtp_history_start_ = h.mtp_end_pos;
  for (int64_t m = 0; m < h.first_page; ++m) s->pages_.push_back(base->pages_[m]);
  const uint8_t* at = d.payload.data();
  for (int64_t m = h.first_page; m < end_page; ++m, at += layout.page_bytes) {
    DSINFER_ASSIGN_OR_RETURN(uint8_t * page, s->WritablePage(m));
    std::memcpy(page, at, static_cast<size_t>(layout.page_bytes));
  }
  ForEachBoundaryRow(layout, h.end_pos, h.mtp_end_pos, [&](size_t l, int part, int64_t p) {
    LayerState& ls = s->layers_[l];
    uint8_t* dst = part == 0 ? ls.ring.At(p)
                             : reinterpret_cast<uint8_t*>(part == 1 ? ls.history.At(p)
                                                                    : ls.index_history.At(p));
    const int64_t bytes =
        part == 0 ? ls.ring.row : (part == 1 ? ls.history.row : ls.index_history.row) * 4;
    std::memcpy(dst, at, static_cast<size_t>(bytes));
    at += bytes;
  });
  if (layout.token_history_slots > 0)
    for (int64_t p = TokenHistoryFirst(h.end_pos, layout); p < h.end_pos; ++p, at += 4) {
      int32_t cls;
      std::memcpy(&cls, at, 4);
      if (cls < 0 || cls >= layout.token_classes)
        return refuse("an Engram token class (" + std::to_string(cls) + ") is out of range");
      s->SetTokenClass(p, cls);
    }
  return s;
}

}  // namespace dsinfer::backend::cpu
