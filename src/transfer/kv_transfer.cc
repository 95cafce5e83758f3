// UCX side of the KV transfer (transfer/kv_transfer.h). One ucp context and worker per agent,
// every UCX call on the agent's thread; callers post closures to it and wait for their answer.
#include "transfer/kv_transfer.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "core/sha256.h"

namespace dsinfer::transfer {
namespace {

using Clock = std::chrono::steady_clock;

// Active-message ids of the three control messages (16 bytes each, always eager).
constexpr unsigned kAmAcquire = 11;       // puller -> holder: {handle, token}
constexpr unsigned kAmAcquireReply = 12;  // holder -> puller: {token, still held}
constexpr unsigned kAmRelease = 13;       // puller -> holder: {handle, 0}

struct ControlMessage {
  uint64_t a = 0;
  uint64_t b = 0;
};

std::string Hex(std::span<const uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (uint8_t b : bytes) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 15]);
  }
  return out;
}

Result<std::vector<uint8_t>> Unhex(const std::string& text, const char* what) {
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (text.empty() || text.size() % 2 != 0)
    return InvalidArgument(std::string("transfer descriptor: ") + what +
                           " must be a non-empty even-length hex string");
  std::vector<uint8_t> out(text.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = nibble(text[2 * i]), lo = nibble(text[2 * i + 1]);
    if (hi < 0 || lo < 0)
      return InvalidArgument(std::string("transfer descriptor: ") + what + " is not hex");
    out[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return out;
}

Status FromUcs(ucs_status_t status, const std::string& what) {
  return IoError(what + ": " + ucs_status_string(status));
}

// The completion of one non-blocking request, written by its callback.
struct Completion {
  bool done = false;
  ucs_status_t status = UCS_OK;
};

void OnRequestDone(void* request, ucs_status_t status, void* user_data) {
  (void)request;
  auto* c = static_cast<Completion*>(user_data);
  c->done = true;
  c->status = status;
}

// A fire-and-forget control message: it owns its bytes until UCX is done with them.
struct PendingSend {
  ControlMessage message;
};

void OnFireAndForgetDone(void* request, ucs_status_t status, void* user_data) {
  (void)status;
  delete static_cast<PendingSend*>(user_data);
  ucp_request_free(request);
}

struct Held {
  std::vector<uint8_t> bytes;  // [length] u8: the exported state blob
  ucp_mem_h memh = nullptr;
  Clock::time_point deadline;
};

}  // namespace

struct KvTransferAgent::Impl {
  TransferOptions options;
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  int worker_fd = -1;
  int wake_fd = -1;  // eventfd: a command is queued, or stop
  std::string worker_address_hex;
  std::thread thread;
  std::atomic<bool> stopping{false};

  mutable std::mutex mu;  // guards commands, stats
  std::deque<std::function<void()>> commands;
  TransferStats stats;

  // Agent-thread state.
  std::map<uint64_t, Held> held;  // by handle
  uint64_t next_handle = 0;       // random start: a stale descriptor of an earlier process misses
  std::map<std::string, ucp_ep_h> endpoints;  // by the remote worker address (hex)
  std::set<ucp_ep_h> failed_endpoints;        // their peer failed (error callback)
  std::map<uint64_t, bool> acquire_answers;   // token -> still held
  uint64_t next_token = 1;
  std::vector<std::pair<ucp_ep_h, ControlMessage>> replies;  // acquire answers to send

  ~Impl() {
    if (worker != nullptr) ucp_worker_destroy(worker);
    if (context != nullptr) ucp_cleanup(context);
    if (wake_fd >= 0) close(wake_fd);
  }

  Status Init() {
    ucp_config_t* config = nullptr;
    ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
    if (st != UCS_OK) return FromUcs(st, "ucp_config_read");
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    st = ucp_init(&params, config, &context);
    ucp_config_release(config);
    if (st != UCS_OK) return FromUcs(st, "ucp_init");
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;  // only the agent's thread touches it
    st = ucp_worker_create(context, &wp, &worker);
    if (st != UCS_OK) return FromUcs(st, "ucp_worker_create");
    st = ucp_worker_get_efd(worker, &worker_fd);
    if (st != UCS_OK) return FromUcs(st, "ucp_worker_get_efd");
    ucp_address_t* address = nullptr;
    size_t address_length = 0;
    st = ucp_worker_get_address(worker, &address, &address_length);
    if (st != UCS_OK) return FromUcs(st, "ucp_worker_get_address");
    worker_address_hex =
        Hex(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(address), address_length));
    ucp_worker_release_address(worker, address);
    const std::pair<unsigned, ucp_am_recv_callback_t> handlers[] = {
        {kAmAcquire, &Impl::OnAcquire},
        {kAmAcquireReply, &Impl::OnAcquireReply},
        {kAmRelease, &Impl::OnRelease}};
    for (const auto& [id, callback] : handlers) {
      ucp_am_handler_param_t hp{};
      hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                      UCP_AM_HANDLER_PARAM_FIELD_ARG;
      hp.id = id;
      hp.cb = callback;
      hp.arg = this;
      st = ucp_worker_set_am_recv_handler(worker, &hp);
      if (st != UCS_OK) return FromUcs(st, "ucp_worker_set_am_recv_handler");
    }
    wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd < 0) return IoError("eventfd failed");
    std::random_device random;
    next_handle = (static_cast<uint64_t>(random()) << 32 | random()) & ~uint64_t{0xffff};
    return Status::Ok();
  }

  // ---- the agent's thread --------------------------------------------------------------------
  // One handler per control message (UCX does not pass the id to the callback).
  static bool ReadControl(const void* data, size_t length, const ucp_am_recv_param_t* param,
                          ControlMessage* m) {
    // Every control message is 16 eager bytes; anything else is not ours and is dropped.
    if (length != sizeof(ControlMessage) || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV))
      return false;
    std::memcpy(m, data, sizeof *m);
    return true;
  }

  // Holder: {handle, token}; keeps the blob another deadline for the puller and answers.
  static ucs_status_t OnAcquire(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param) {
    (void)header, (void)header_length;
    auto* self = static_cast<Impl*>(arg);
    ControlMessage m;
    if (!ReadControl(data, length, param, &m) ||
        !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP))
      return UCS_OK;
    auto it = self->held.find(m.a);
    const bool found = it != self->held.end();
    if (found) it->second.deadline = Clock::now() + self->options.hold_deadline;
    // Sent after the progress call returns: no sends from inside a callback.
    self->replies.push_back({param->reply_ep, ControlMessage{m.b, found ? 1u : 0u}});
    return UCS_OK;
  }

  // Puller: {token, still held}.
  static ucs_status_t OnAcquireReply(void* arg, const void* header, size_t header_length,
                                     void* data, size_t length, const ucp_am_recv_param_t* param) {
    (void)header, (void)header_length;
    ControlMessage m;
    if (ReadControl(data, length, param, &m))
      static_cast<Impl*>(arg)->acquire_answers[m.a] = m.b != 0;
    return UCS_OK;
  }

  // Holder: {handle, 0}; the puller has the bytes.
  static ucs_status_t OnRelease(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param) {
    (void)header, (void)header_length;
    auto* self = static_cast<Impl*>(arg);
    ControlMessage m;
    if (!ReadControl(data, length, param, &m)) return UCS_OK;
    auto it = self->held.find(m.a);
    if (it != self->held.end()) self->Release(it, /*pulled=*/true);
    return UCS_OK;
  }

  void Loop() {
    while (!stopping.load()) {
      Service();
      if (stopping.load()) break;
      if (ucp_worker_arm(worker) == UCS_ERR_BUSY) continue;
      pollfd fds[2] = {{worker_fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
      (void)poll(fds, 2, /*timeout_ms=*/50);  // the timeout bounds how late a deadline is seen
      uint64_t count = 0;
      while (read(wake_fd, &count, sizeof count) == sizeof count) {
      }
    }
    Service();
    Shutdown();
  }

  // Progress until idle, answer acquires, release expired blobs, run queued commands.
  void Service() {
    while (ucp_worker_progress(worker) != 0) {
    }
    SendReplies();
    ExpireHolds();
    std::deque<std::function<void()>> todo;
    {
      std::lock_guard<std::mutex> lock(mu);
      todo.swap(commands);
    }
    for (auto& command : todo) command();
  }

  void SendReplies() {
    auto replies_now = std::move(replies);
    replies.clear();
    for (auto& [ep, message] : replies_now) SendControl(ep, kAmAcquireReply, message, false);
  }

  // Posts a control message; the reply flag lets the holder answer without an endpoint of its
  // own to us. Failures are counted by the caller's wait (a failed peer fails the endpoint).
  void SendControl(ucp_ep_h ep, unsigned id, ControlMessage message, bool reply) {
    auto* pending = new PendingSend{message};
    ucp_request_param_t p{};
    p.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    p.cb.send = &OnFireAndForgetDone;
    p.user_data = pending;
    p.flags = UCP_AM_SEND_FLAG_EAGER | (reply ? UCP_AM_SEND_FLAG_REPLY : 0);
    ucs_status_ptr_t request =
        ucp_am_send_nbx(ep, id, nullptr, 0, &pending->message, sizeof pending->message, &p);
    if (request == nullptr || UCS_PTR_IS_ERR(request)) delete pending;  // done (or failed) now
  }

  void Release(std::map<uint64_t, Held>::iterator it, bool pulled) {
    ucp_mem_unmap(context, it->second.memh);
    const auto bytes = static_cast<int64_t>(it->second.bytes.size());
    held.erase(it);
    std::lock_guard<std::mutex> lock(mu);
    --stats.held_blobs;
    stats.held_bytes -= bytes;
    ++(pulled ? stats.released_pulled_total : stats.released_deadline_total);
  }

  void ExpireHolds() {
    const auto now = Clock::now();
    for (auto it = held.begin(); it != held.end();) {
      auto next = std::next(it);
      if (it->second.deadline <= now) Release(it, /*pulled=*/false);
      it = next;
    }
  }

  void Shutdown() {
    while (!held.empty()) Release(held.begin(), /*pulled=*/false);
    for (auto& [address, ep] : endpoints) Close(ep);
    endpoints.clear();
  }

  void Close(ucp_ep_h ep) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;  // the peer may be gone: do not wait for it
    ucs_status_ptr_t request = ucp_ep_close_nbx(ep, &p);
    if (request == nullptr || UCS_PTR_IS_ERR(request)) return;
    while (ucp_request_check_status(request) == UCS_INPROGRESS) ucp_worker_progress(worker);
    ucp_request_free(request);
    failed_endpoints.erase(ep);
  }

  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status) {
    (void)status;
    static_cast<Impl*>(arg)->failed_endpoints.insert(ep);
  }

  Result<ucp_ep_h> EndpointTo(const std::string& address_hex) {
    auto it = endpoints.find(address_hex);
    if (it != endpoints.end()) {
      if (!failed_endpoints.contains(it->second)) return it->second;
      Close(it->second);
      endpoints.erase(it);
    }
    DSINFER_ASSIGN_OR_RETURN(std::vector<uint8_t> address, Unhex(address_hex, "worker_address"));
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                   UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.address = reinterpret_cast<const ucp_address_t*>(address.data());
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    p.err_handler.cb = &Impl::OnEndpointError;
    p.err_handler.arg = this;
    ucp_ep_h ep = nullptr;
    const ucs_status_t st = ucp_ep_create(worker, &p, &ep);
    if (st != UCS_OK) return FromUcs(st, "connecting to the prefill worker (ucp_ep_create)");
    endpoints[address_hex] = ep;
    return ep;
  }

  // Progresses (serving everyone) until done() or the deadline or the endpoint's peer failed.
  Status WaitFor(const std::function<bool()>& done, ucp_ep_h ep, Clock::time_point deadline,
                 const std::string& what) {
    while (!done()) {
      if (failed_endpoints.contains(ep))
        return IoError(what + ": the connection to the prefill worker failed");
      if (Clock::now() > deadline) return IoError(what + ": timed out");
      if (ucp_worker_progress(worker) == 0) std::this_thread::yield();
      SendReplies();
    }
    return Status::Ok();
  }

  Result<TransferDescriptor> HoldOnThread(std::vector<uint8_t> blob, std::string sha256) {
    Held h;
    h.bytes = std::move(blob);
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = h.bytes.data();
    mp.length = h.bytes.size();
    ucs_status_t st = ucp_mem_map(context, &mp, &h.memh);
    if (st != UCS_OK) return FromUcs(st, "registering the state blob (ucp_mem_map)");
    void* rkey = nullptr;
    size_t rkey_length = 0;
    st = ucp_rkey_pack(context, h.memh, &rkey, &rkey_length);
    if (st != UCS_OK) {
      ucp_mem_unmap(context, h.memh);
      return FromUcs(st, "packing the blob's remote key (ucp_rkey_pack)");
    }
    TransferDescriptor d;
    d.engine_id = options.engine_id;
    d.worker_address = worker_address_hex;
    d.rkey = Hex(std::span<const uint8_t>(static_cast<const uint8_t*>(rkey), rkey_length));
    ucp_rkey_buffer_release(rkey);
    d.remote_address = reinterpret_cast<uintptr_t>(h.bytes.data());
    d.length = h.bytes.size();
    d.sha256 = std::move(sha256);
    d.handle = ++next_handle;
    h.deadline = Clock::now() + options.hold_deadline;
    held.emplace(d.handle, std::move(h));
    std::lock_guard<std::mutex> lock(mu);
    ++stats.held_blobs;
    stats.held_bytes += static_cast<int64_t>(d.length);
    ++stats.holds_total;
    return d;
  }

  Result<std::vector<uint8_t>> PullOnThread(const TransferDescriptor& d) {
    DSINFER_ASSIGN_OR_RETURN(std::vector<uint8_t> packed_rkey, Unhex(d.rkey, "rkey"));
    DSINFER_ASSIGN_OR_RETURN(ucp_ep_h ep, EndpointTo(d.worker_address));
    const auto deadline = Clock::now() + options.pull_timeout;
    const std::string from = "pulling the state from prefill worker " + d.engine_id;
    // 1. Acquire: the holder keeps the blob for us (or says it no longer has it).
    const uint64_t token = next_token++;
    SendControl(ep, kAmAcquire, {d.handle, token}, /*reply=*/true);
    DSINFER_RETURN_IF_ERROR(
        WaitFor([&] { return acquire_answers.contains(token); }, ep, deadline, from));
    const bool still_held = acquire_answers.at(token);
    acquire_answers.erase(token);
    if (!still_held)
      return NotFound(from + ": it no longer holds transfer " + std::to_string(d.handle) +
                      " (pulled already, or released after its deadline)");
    // 2. The one-sided get of the whole blob.
    ucp_rkey_h rkey = nullptr;
    ucs_status_t st = ucp_ep_rkey_unpack(ep, packed_rkey.data(), &rkey);
    if (st != UCS_OK) return FromUcs(st, from + " (ucp_ep_rkey_unpack)");
    std::vector<uint8_t> bytes(d.length);  // [length] u8: the blob, as the holder has it
    Completion done;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = &OnRequestDone;
    p.user_data = &done;
    ucs_status_ptr_t request =
        ucp_get_nbx(ep, bytes.data(), bytes.size(), d.remote_address, rkey, &p);
    Status waited = Status::Ok();
    if (request == nullptr) {
      done.done = true;
    } else if (UCS_PTR_IS_ERR(request)) {
      done = {true, UCS_PTR_STATUS(request)};
    } else {
      waited = WaitFor([&] { return done.done; }, ep, deadline, from);
      if (!waited.ok()) {
        // The destination buffer must outlive the request: force the endpoint closed, which
        // completes (fails) everything posted on it.
        endpoints.erase(d.worker_address);
        Close(ep);
        while (!done.done) ucp_worker_progress(worker);
      }
      ucp_request_free(request);
    }
    ucp_rkey_destroy(rkey);
    DSINFER_RETURN_IF_ERROR(waited);
    if (done.status != UCS_OK) return FromUcs(done.status, from + " (ucp_get_nbx)");
    // 3. Done with it: the holder may release the blob.
    SendControl(ep, kAmRelease, {d.handle, 0}, /*reply=*/false);
    return bytes;
  }

  // Runs fn on the agent's thread and returns its answer.
  template <typename T>
  Result<T> OnThread(std::function<Result<T>()> fn) {
    auto task = std::make_shared<std::packaged_task<Result<T>()>>(std::move(fn));
    std::future<Result<T>> answer = task->get_future();
    {
      std::lock_guard<std::mutex> lock(mu);
      if (stopping.load()) return FailedPrecondition("the KV transfer agent is stopping");
      commands.push_back([task] { (*task)(); });
    }
    const uint64_t one = 1;
    (void)!write(wake_fd, &one, sizeof one);
    return answer.get();
  }
};

KvTransferAgent::KvTransferAgent(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

KvTransferAgent::~KvTransferAgent() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
  }
  const uint64_t one = 1;
  (void)!write(impl_->wake_fd, &one, sizeof one);
  if (impl_->thread.joinable()) impl_->thread.join();
}

Result<std::unique_ptr<KvTransferAgent>> KvTransferAgent::Create(TransferOptions options) {
  if (options.hold_deadline.count() <= 0 || options.pull_timeout.count() <= 0)
    return InvalidArgument("KV transfer: the hold deadline and pull timeout must be positive");
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  DSINFER_RETURN_IF_ERROR(impl->Init().WithContext("KV transfer (UCX)"));
  Impl* p = impl.get();
  auto agent = std::unique_ptr<KvTransferAgent>(new KvTransferAgent(std::move(impl)));
  p->thread = std::thread([p] { p->Loop(); });
  return agent;
}

Result<TransferDescriptor> KvTransferAgent::Hold(std::vector<uint8_t> blob) {
  if (blob.empty()) return InvalidArgument("KV transfer: an empty blob cannot be held");
  std::string sha256 = HexDigest(Sha256::Of(blob));  // on the caller's thread
  auto shared = std::make_shared<std::vector<uint8_t>>(std::move(blob));
  return impl_->OnThread<TransferDescriptor>(
      [this, shared, sha256] { return impl_->HoldOnThread(std::move(*shared), sha256); });
}

Result<std::vector<uint8_t>> KvTransferAgent::Pull(const TransferDescriptor& d) {
  const auto start = std::chrono::steady_clock::now();
  Result<std::vector<uint8_t>> bytes = InvalidArgument("KV transfer: bad descriptor");
  if (d.length == 0 || d.remote_address == 0 || d.sha256.size() != 64) {
    bytes = InvalidArgument(
        "KV transfer descriptor: length and remote_address must be non-zero and sha256 64 hex "
        "digits");
  } else {
    bytes = impl_->OnThread<std::vector<uint8_t>>([this, d] { return impl_->PullOnThread(d); });
  }
  if (bytes.ok()) {
    if (impl_->options.after_get_for_test) impl_->options.after_get_for_test(*bytes);
    if (HexDigest(Sha256::Of(*bytes)) != d.sha256) {
      std::lock_guard<std::mutex> lock(impl_->mu);
      ++impl_->stats.checksum_failures_total;
      ++impl_->stats.pull_failures_total;
      return IoError("KV transfer from prefill worker " + d.engine_id + ": the " +
                     std::to_string(d.length) +
                     " bytes pulled do not match their SHA-256 (corrupted in transfer)");
    }
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (!bytes.ok()) {
    ++impl_->stats.pull_failures_total;
    return bytes.status();
  }
  ++impl_->stats.pulls_total;
  impl_->stats.pulled_bytes_total += static_cast<int64_t>(d.length);
  impl_->stats.pull_seconds_total +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return bytes;
}

TransferStats KvTransferAgent::Stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

}  // namespace dsinfer::transfer
