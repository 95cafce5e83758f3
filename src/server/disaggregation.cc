// Prefill/decode disaggregation at the API (docs/SERVER.md, "Prefill/decode disaggregation"):
// the routers' kv_transfer_params, vLLM's shape. vllm-router (--vllm-pd-disaggregation) sends
// the prefill worker the request with max_tokens 1 and kv_transfer_params {do_remote_decode:
// true}; the prefill worker answers with kv_transfer_params {do_remote_prefill: true, ...,
// dsinfer_transfer: the descriptor of its held state blob}; the router sends those to the decode
// worker with the original request, which pulls the blob over UCX (transfer/kv_transfer.h) and
// continues from it.
//
// sglang-router (--pd-disaggregation) instead sends the same request to a prefill and a decode
// worker at once, adding bootstrap_host / bootstrap_port (the prefill worker's host and the port
// given after its URL) and a random bootstrap_room; it answers with the decode worker's response.
// The prefill worker runs the prompt (max_tokens 1), holds the state as above and publishes its
// descriptor under the room (transfer/bootstrap_rooms.h); the decode worker asks the prefill
// worker's HTTP port (GET /dsinfer/bootstrap: bootstrap_port must be that port) until the room
// is published or --bootstrap-timeout passes, then pulls over UCX as above.
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <thread>

#include "net/http_client.h"
#include "server/openai_result.h"

namespace dsinfer::server {
namespace {

Result<uint64_t> U64Field(const Json& object, const char* key) {
  const auto it = object.find(key);
  if (it == object.end() || !it->is_string())
    return InvalidArgument(std::string("kv_transfer_params.dsinfer_transfer.") + key +
                           ": must be a decimal string");
  const std::string& text = it->get_ref<const std::string&>();
  if (text.empty() || text.size() > 20 || text.find_first_not_of("0123456789") != std::string::npos)
    return InvalidArgument(std::string("kv_transfer_params.dsinfer_transfer.") + key +
                           ": must be a decimal string");
  return std::stoull(text);
}

Result<transfer::TransferDescriptor> DescriptorFromJson(const Json& j) {
  if (!j.is_object())
    return InvalidArgument("kv_transfer_params.dsinfer_transfer: must be an object");
  transfer::TransferDescriptor d;
  const std::string path = "kv_transfer_params.dsinfer_transfer";
  DSINFER_ASSIGN_OR_RETURN(d.engine_id, StringField(j, "engine_id", path));
  DSINFER_ASSIGN_OR_RETURN(d.worker_address, StringField(j, "worker_address", path));
  DSINFER_ASSIGN_OR_RETURN(d.rkey, StringField(j, "rkey", path));
  DSINFER_ASSIGN_OR_RETURN(d.sha256, StringField(j, "sha256", path));
  DSINFER_ASSIGN_OR_RETURN(d.remote_address, U64Field(j, "remote_address"));
  DSINFER_ASSIGN_OR_RETURN(d.length, U64Field(j, "length"));
  DSINFER_ASSIGN_OR_RETURN(d.handle, U64Field(j, "handle"));
  return d;
}

Json DescriptorToJson(const transfer::TransferDescriptor& d) {
  // 64-bit values as decimal strings: JSON numbers past 2^53 do not survive every client.
  return Json{{"engine_id", d.engine_id},
              {"worker_address", d.worker_address},
              {"rkey", d.rkey},
              {"remote_address", std::to_string(d.remote_address)},
              {"length", std::to_string(d.length)},
              {"sha256", d.sha256},
              {"handle", std::to_string(d.handle)}};
}

const char* RoleName(DisaggregationRole role) {
  switch (role) {
    case DisaggregationRole::kPrefill:
      return "prefill";
    case DisaggregationRole::kDecode:
      return "decode";
    case DisaggregationRole::kBoth:
      break;
  }
  return "both";
}

constexpr const char* kBootstrapPath = "/dsinfer/bootstrap";
// How the engine prefixes a refused import (runtime/engine_kv_tier.cc).
constexpr const char* kImportContext = "importing the prefilled state";
// The bootstrap endpoint's 404 for a room not published yet (the decode worker asks again).
constexpr const char* kNotPublished = "is not published (yet)";
// One long poll of the bootstrap endpoint waits at most this long (the decode worker asks again
// until its own deadline); short enough that a connection never idles past keep-alive limits.
constexpr int64_t kMaxBootstrapWaitMs = 2000;
// A prefill worker that cannot be reached for this long is given up (killed, wrong port).
constexpr auto kBootstrapUnreachable = std::chrono::seconds(2);

Result<uint64_t> RoomField(const Json& value) {
  if (value.is_array())
    return InvalidArgument(
        "bootstrap_room: a list (n > 1 or a batch) is not supported; a prefill/decode request "
        "must have n = 1");
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_number_integer() && value.get<int64_t>() >= 0)
    return static_cast<uint64_t>(value.get<int64_t>());
  return InvalidArgument("bootstrap_room: must be a non-negative integer");
}

// Fills r's bootstrap fields from sglang-router's bootstrap_host / bootstrap_port /
// bootstrap_room; nothing when the body has none of them.
Status ParseBootstrapFields(const Service::Core& core, const Json& body, KvTransferRequest* r) {
  const auto room = body.find("bootstrap_room");
  const auto host = body.find("bootstrap_host");
  const auto port = body.find("bootstrap_port");
  const bool any = (room != body.end() && !room->is_null()) ||
                   (host != body.end() && !host->is_null()) ||
                   (port != body.end() && !port->is_null());
  if (!any) return Status::Ok();
  if (r->remote_decode || r->remote_prefill)
    return InvalidArgument(
        "bootstrap_room: give either kv_transfer_params (vllm-router) or bootstrap_host / "
        "bootstrap_port / bootstrap_room (sglang-router), not both");
  if (room == body.end() || room->is_null())
    return InvalidArgument(
        "bootstrap_room: missing (bootstrap_host / bootstrap_port come with it)");
  DSINFER_ASSIGN_OR_RETURN(uint64_t room_id, RoomField(*room));
  const DisaggregationRole role = core.options.role;
  if (role == DisaggregationRole::kBoth)
    return InvalidArgument(
        "bootstrap_room: this worker runs --role both; sglang-router's prefill/decode hand-over "
        "needs --role prefill and --role decode workers");
  r->bootstrap_room = room_id;
  if (role == DisaggregationRole::kPrefill) {
    r->remote_decode = true;  // the room names this worker; host and port are not needed here
    return Status::Ok();
  }
  r->remote_prefill = true;
  if (host == body.end() || !host->is_string() || host->get_ref<const std::string&>().empty())
    return InvalidArgument("bootstrap_host: must be the prefill worker's host name");
  r->bootstrap_host = host->get<std::string>();
  if (port == body.end() || port->is_null())
    return InvalidArgument(
        "bootstrap_port: null; start sglang-router with --prefill URL PORT where PORT is the "
        "prefill worker's HTTP port (dsinfer serves the bootstrap on it)");
  if (!port->is_number_integer() || port->get<int64_t>() < 1 || port->get<int64_t>() > 65535)
    return InvalidArgument("bootstrap_port: must be an integer in [1, 65535]");
  r->bootstrap_port = static_cast<int>(port->get<int64_t>());
  return Status::Ok();
}

// A decode worker's side of the bootstrap: asks the prefill worker for the room until it is
// published or the deadline. FailedPrecondition (503, the router retries) when the prefill
// worker failed the request, cannot be reached, or never publishes the room.
Result<std::optional<transfer::TransferDescriptor>> FetchBootstrapRoom(
    const Service::Core& core, const KvTransferRequest& kv) {
  using Clock = std::chrono::steady_clock;
  const std::string where = kv.bootstrap_host + ":" + std::to_string(kv.bootstrap_port);
  const std::string room = std::to_string(*kv.bootstrap_room);
  const auto deadline = Clock::now() + core.options.bootstrap_timeout;
  net::Url url;
  url.host = kv.bootstrap_host;
  url.port = kv.bootstrap_port;
  // The workers of one deployment share their keys: the bootstrap call presents this worker's.
  std::vector<std::pair<std::string, std::string>> headers;
  if (!core.options.api_keys.empty())
    headers.emplace_back("Authorization", "Bearer " + core.options.api_keys.front());
  // Since when the prefill worker has been unreachable (time_point{}: it answered last time).
  Clock::time_point unreachable_since{};
  while (true) {
    const auto now = Clock::now();
    const int64_t left_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count();
    if (left_ms <= 0)
      return FailedPrecondition("bootstrap_room " + room + ": the prefill worker at " + where +
                                " did not publish it within " +
                                std::to_string(core.options.bootstrap_timeout.count()) +
                                " ms (--bootstrap-timeout; it never got the request, or failed "
                                "before it) (retry the request)");
    const int64_t wait_ms = std::min(left_ms, kMaxBootstrapWaitMs);
    net::HttpRequestSpec spec;
    spec.method = "GET";
    spec.path =
        std::string(kBootstrapPath) + "?room=" + room + "&wait_ms=" + std::to_string(wait_ms);
    spec.headers = headers;
    spec.timeout_s = static_cast<double>(wait_ms) / 1000.0 + 10.0;
    auto answer = net::HttpCall(url, spec);
    if (!answer.ok()) {
      if (unreachable_since == Clock::time_point{}) unreachable_since = now;
      if (now - unreachable_since >= kBootstrapUnreachable)
        return FailedPrecondition("bootstrap_room " + room +
                                  ": cannot reach the prefill worker's bootstrap at " + where +
                                  ": " + answer.status().message() + " (retry the request)");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    unreachable_since = Clock::time_point{};
    // Not published yet (the prefill worker waited wait_ms already). Any other 404 is a server
    // without the bootstrap: asking it again would only spin until the deadline.
    if (answer->status == 404 && answer->body.find(kNotPublished) != std::string::npos) continue;
    if (answer->status == 404)
      return FailedPrecondition("bootstrap_room " + room + ": " + where +
                                " serves no dsinfer bootstrap (is bootstrap_port the prefill "
                                "worker's HTTP port, and is it a dsinfer --role prefill worker?)");
    Json j = Json::parse(answer->body, nullptr, /*allow_exceptions=*/false);
    if (answer->status != 200) {
      std::string message = answer->body.substr(0, 300);
      if (j.is_object() && j.contains("error") && j["error"].is_object() &&
          j["error"].contains("message") && j["error"]["message"].is_string())
        message = j["error"]["message"].get<std::string>();
      return FailedPrecondition("bootstrap_room " + room + ": the prefill worker at " + where +
                                " answered " + std::to_string(answer->status) + ": " + message +
                                " (retry the request)");
    }
    if (!j.is_object() || !j.contains("dsinfer_transfer"))
      return FailedPrecondition("bootstrap_room " + room + ": the bootstrap answer of " + where +
                                " is not a dsinfer prefill worker's");
    if (j["dsinfer_transfer"].is_null()) return std::optional<transfer::TransferDescriptor>();
    auto descriptor = DescriptorFromJson(j["dsinfer_transfer"]);
    if (!descriptor.ok())
      return FailedPrecondition("bootstrap_room " + room + ": the bootstrap answer of " + where +
                                " is malformed: " + descriptor.status().message());
    return std::optional<transfer::TransferDescriptor>(std::move(descriptor).value());
  }
}

Result<std::optional<uint64_t>> QueryUint(const std::string& query, const std::string& key) {
  size_t pos = 0;
  while (pos <= query.size()) {
    const size_t amp = std::min(query.find('&', pos), query.size());
    const std::string part = query.substr(pos, amp - pos);
    if (part.rfind(key + "=", 0) == 0) {
      const std::string text = part.substr(key.size() + 1);
      if (text.empty() || text.size() > 20 ||
          text.find_first_not_of("0123456789") != std::string::npos)
        return InvalidArgument(key + ": must be a non-negative integer");
      errno = 0;
      const unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
      if (errno == ERANGE) return InvalidArgument(key + ": out of range");
      return std::optional<uint64_t>(v);
    }
    pos = amp + 1;
  }
  return std::optional<uint64_t>();
}

}  // namespace

// Publishes a prefill worker's room once: the held state's descriptor, or (from the destructor)
// the failure, so that a decode worker waiting for the room answers at once rather than at its
// deadline.
class RoomPublication {
 public:
  RoomPublication(std::shared_ptr<transfer::BootstrapRooms> rooms, uint64_t room)
      : rooms_(std::move(rooms)), room_(room) {}
  ~RoomPublication() {
    if (!published_)
      (void)Publish(Internal("the prefill worker did not finish bootstrap_room " +
                             std::to_string(room_) + " (cancelled or failed before its state)"));
  }
  RoomPublication(const RoomPublication&) = delete;
  RoomPublication& operator=(const RoomPublication&) = delete;
  Status Publish(transfer::RoomEntry entry) {
    published_ = true;
    return rooms_->Publish(room_, std::move(entry));
  }

 private:
  std::shared_ptr<transfer::BootstrapRooms> rooms_;
  const uint64_t room_;
  bool published_ = false;
};

bool HandleBootstrapEndpoint(Service::Core& core, const HttpRequest& request, ResponseSink& sink,
                             bool authorized) {
  if (request.path != kBootstrapPath) return false;
  const auto flavor = ApiFlavor::kOpenAI;
  if (!authorized) {
    SendError(sink, Unauthorized(), flavor);
    return true;
  }
  if (request.method != "GET") {
    SendError(sink, ApiError{405, "use GET", "", "", "", 0, false}, flavor);
    return true;
  }
  if (core.options.bootstrap_rooms == nullptr) {
    SendError(sink,
              BadRequest(std::string(kBootstrapPath) + ": this worker runs --role " +
                         RoleName(core.options.role) +
                         "; only a prefill worker publishes bootstrap rooms"),
              flavor);
    return true;
  }
  auto room = QueryUint(request.query, "room");
  auto wait_ms = QueryUint(request.query, "wait_ms");
  if (!room.ok() || !wait_ms.ok() || !room->has_value()) {
    const Status bad = !room.ok()      ? room.status()
                       : !wait_ms.ok() ? wait_ms.status()
                                       : InvalidArgument("room: missing");
    SendError(sink, BadRequest(bad.message(), "room"), flavor);
    return true;
  }
  const auto wait = std::chrono::milliseconds(
      std::min<uint64_t>(wait_ms->value_or(0), static_cast<uint64_t>(kMaxBootstrapWaitMs)));
  auto entry = core.options.bootstrap_rooms->Take(**room, std::chrono::steady_clock::now() + wait);
  if (!entry) {
    ApiError e;
    e.status = 404;
    e.message = "bootstrap_room " + std::to_string(**room) + " " + kNotPublished;
    SendError(sink, e, flavor);
    return true;
  }
  if (!entry->ok()) {
    ApiError e;
    e.status = 503;
    e.message = entry->status().message();
    SendError(sink, e, flavor);
    return true;
  }
  const auto& descriptor = entry->value();
  SendJson(sink, 200,
           Json{{"room", std::to_string(**room)},
                {"dsinfer_transfer", descriptor ? DescriptorToJson(*descriptor) : Json(nullptr)}});
  return true;
}

Result<KvTransferRequest> ParseKvTransferParams(const Service::Core& core, const Json& body) {
  KvTransferRequest r;
  const auto it = body.find("kv_transfer_params");
  if (it == body.end() || it->is_null()) {
    DSINFER_RETURN_IF_ERROR(ParseBootstrapFields(core, body, &r));
    return r;
  }
  if (!it->is_object()) return InvalidArgument("kv_transfer_params: must be an object");
  DSINFER_ASSIGN_OR_RETURN(auto remote_decode, OptBool(*it, "do_remote_decode"));
  DSINFER_ASSIGN_OR_RETURN(auto remote_prefill, OptBool(*it, "do_remote_prefill"));
  r.remote_decode = remote_decode.value_or(false);
  r.remote_prefill = remote_prefill.value_or(false);
  if (r.remote_decode && r.remote_prefill)
    return InvalidArgument(
        "kv_transfer_params: do_remote_decode and do_remote_prefill cannot both be true");
  const DisaggregationRole role = core.options.role;
  const std::string role_text = std::string("this worker runs --role ") + RoleName(role);
  if (r.remote_decode && role != DisaggregationRole::kPrefill)
    return InvalidArgument("kv_transfer_params.do_remote_decode: " + role_text +
                           "; only a prefill worker hands its state to a decode worker");
  if (r.remote_prefill && role != DisaggregationRole::kDecode)
    return InvalidArgument("kv_transfer_params.do_remote_prefill: " + role_text +
                           "; only a decode worker continues a remotely prefilled state");
  if (r.remote_prefill) {
    const auto d = it->find("dsinfer_transfer");
    if (d == it->end())
      return InvalidArgument(
          "kv_transfer_params.dsinfer_transfer: missing; a decode worker continues only from a "
          "dsinfer prefill worker's answer (its kv_transfer_params, passed on unchanged)");
    // null: the prompt was too short to have a state before its last token; nothing travels.
    if (!d->is_null()) {
      DSINFER_ASSIGN_OR_RETURN(auto descriptor, DescriptorFromJson(*d));
      r.descriptor = std::move(descriptor);
    }
  }
  DSINFER_RETURN_IF_ERROR(ParseBootstrapFields(core, body, &r));
  return r;
}

Status PrepareDisaggregated(Service::Core& core, const KvTransferRequest& kv,
                            runtime::RequestParams* params) {
  if (kv.remote_decode) {
    if (params->n != 1)
      return InvalidArgument(kv.bootstrap_room
                                 ? "n: must be 1 for sglang-router's prefill/decode hand-over"
                                 : "kv_transfer_params.do_remote_decode: n must be 1");
    // Nothing to hand over for a one-token prompt: the decode worker computes it.
    params->export_prompt_state = params->prompt.size() >= 2;
    // sglang-router sends the prefill worker the whole request and drops its answer: only the
    // prompt pass matters (vllm-router asks for max_tokens 1 itself).
    if (kv.bootstrap_room) params->max_tokens = 1;
  }
  std::optional<transfer::TransferDescriptor> descriptor = kv.descriptor;
  if (kv.remote_prefill && kv.bootstrap_room) {
    DSINFER_ASSIGN_OR_RETURN(descriptor, FetchBootstrapRoom(core, kv));
  }
  if (kv.remote_prefill && descriptor) {
    auto blob = core.options.kv_transfer->Pull(*descriptor);
    if (!blob.ok()) {
      // A malformed descriptor is the client's; the rest (gone, corrupt, unreachable) is the
      // transfer's: 503 so that the router retries the whole request.
      if (blob.status().code() == StatusCode::kInvalidArgument) return blob.status();
      return FailedPrecondition("KV transfer failed: " + blob.status().message() +
                                " (retry the request)");
    }
    params->imported_state = std::make_shared<const std::vector<uint8_t>>(std::move(blob).value());
  }
  return Status::Ok();
}

namespace {

// Holds a finished prefill's exported state; nullopt when the prompt had none to hand over.
transfer::RoomEntry HoldState(Service::Core& core, const Generation& generation,
                              const runtime::RequestParams& params) {
  if (!params.export_prompt_state) return std::optional<transfer::TransferDescriptor>();
  if (!generation.export_status().ok()) return generation.export_status();
  if (generation.exported_state() == nullptr)
    return Internal("the prefill finished without exporting its state");
  auto held = core.options.kv_transfer->Hold(*generation.exported_state());
  if (!held.ok()) return held.status();
  return std::optional<transfer::TransferDescriptor>(std::move(held).value());
}

}  // namespace

Result<Json> HoldForRemoteDecode(Service::Core& core, const Generation& generation,
                                 const runtime::RequestParams& params) {
  auto held = HoldState(core, generation, params);
  if (!held.ok()) return held.status();
  const Json descriptor = *held ? DescriptorToJson(**held) : Json(nullptr);
  return Json{{"do_remote_decode", false},
              {"do_remote_prefill", true},
              {"remote_engine_id", core.options.engine_id},
              {"remote_request_id", params.request_id},
              {"remote_block_ids", Json::array()},
              {"dsinfer_transfer", descriptor}};
}

bool RefuseKvTransferParams(const Json& body, ResponseSink& sink, ApiFlavor flavor) {
  const auto it = body.find("kv_transfer_params");
  const auto room = body.find("bootstrap_room");
  if (room != body.end() && !room->is_null()) {
    SendError(sink,
              Unsupported("bootstrap_room: prefill/decode disaggregation is served on "
                          "/v1/chat/completions and /v1/completions only",
                          "bootstrap_room"),
              flavor);
    return true;
  }
  if (it == body.end() || it->is_null()) return false;
  SendError(sink,
            Unsupported("kv_transfer_params: prefill/decode disaggregation is served on "
                        "/v1/chat/completions and /v1/completions only",
                        "kv_transfer_params"),
            flavor);
  return true;
}

std::optional<KvTransferRequest> PrepareKvTransfer(Service::Core& core, const Json& body,
                                                   bool stream, runtime::RequestParams* params,
                                                   ResponseSink& sink) {
  const auto flavor = ApiFlavor::kOpenAI;
  auto kv = ParseKvTransferParams(core, body);
  if (!kv.ok()) {
    const std::string& message = kv.status().message();
    const std::string param = message.rfind("bootstrap_", 0) == 0
                                  ? message.substr(0, message.find(':'))
                                  : std::string("kv_transfer_params");
    SendError(sink, BadRequest(message, param), flavor);
    return std::nullopt;
  }
  kv->stream = stream;
  if (kv->remote_decode && kv->bootstrap_room) {
    if (core.options.bootstrap_rooms == nullptr) {
      SendError(sink, GenerationFailed(Internal("this prefill worker has no bootstrap rooms")),
                flavor);
      return std::nullopt;
    }
    kv->publication =
        std::make_shared<RoomPublication>(core.options.bootstrap_rooms, *kv->bootstrap_room);
  }
  if (kv->remote_decode && stream && !kv->bootstrap_room) {
    SendError(sink,
              BadRequest("kv_transfer_params.do_remote_decode: the prefill request must not "
                         "stream (its answer carries the transfer descriptor)",
                         "stream"),
              flavor);
    return std::nullopt;
  }
  if (Status st = PrepareDisaggregated(core, *kv, params); !st.ok()) {
    SendError(sink, FromStatus(st), flavor);
    return std::nullopt;
  }
  return std::move(kv).value();
}

bool AddKvTransferParams(Service::Core& core, const KvTransferRequest& kv,
                         const Generation& generation, GenerationEnd end, OpenAIResult& result,
                         ResponseSink& sink) {
  if (kv.remote_prefill && end == GenerationEnd::kError && !kv.stream &&
      generation.error().message().rfind(kImportContext, 0) == 0) {
    // The decode worker refused the state it pulled (other tokens, another model's layout):
    // 503 like the other transfer failures, so that the router retries the whole request, which
    // may land on a matching prefill/decode pair; the message says what to check when it recurs.
    // (A streamed answer has sent its 200 already; its error event says the same.)
    ApiError e;
    e.status = 503;
    e.message = generation.error().message() +
                " (retry the request; if this recurs, the prefill and decode workers do not serve "
                "the same checkpoint and chat template)";
    SendError(sink, e, ApiFlavor::kOpenAI);
    return false;
  }
  if (!kv.remote_decode || end != GenerationEnd::kFinished) return true;
  if (kv.publication != nullptr) {
    // sglang-router: the state goes to the room, the answer stays as it is (the router drops
    // it). A failure reaches the waiting decode worker through the room; a streamed answer has
    // already begun, so only an unstreamed one reports it here too.
    transfer::RoomEntry held = HoldState(core, generation, generation.params());
    const Status hold_status = held.ok() ? Status::Ok() : held.status();
    const Status published = kv.publication->Publish(std::move(held));
    if (kv.stream || (hold_status.ok() && published.ok())) return true;
    SendError(sink, GenerationFailed(hold_status.ok() ? published : hold_status),
              ApiFlavor::kOpenAI);
    return false;
  }
  auto params = HoldForRemoteDecode(core, generation, generation.params());
  if (!params.ok()) {
    SendError(sink, GenerationFailed(params.status()), ApiFlavor::kOpenAI);
    return false;
  }
  result.set_extra_field("kv_transfer_params", std::move(params).value());
  return true;
}

}  // namespace dsinfer::server
