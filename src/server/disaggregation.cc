// Prefill/decode disaggregation at the API (docs/SERVER.md, "Prefill/decode disaggregation"):
// the routers' kv_transfer_params, vLLM's shape. vllm-router (--vllm-pd-disaggregation) sends
// the prefill worker the request with max_tokens 1 and kv_transfer_params {do_remote_decode:
// true}; the prefill worker answers with kv_transfer_params {do_remote_prefill: true, ...,
// dsinfer_transfer: the descriptor of its held state blob}; the router sends those to the decode
// worker with the original request, which pulls the blob over UCX (transfer/kv_transfer.h) and
// continues from it.
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

}  // namespace

Result<KvTransferRequest> ParseKvTransferParams(const Service::Core& core, const Json& body) {
  KvTransferRequest r;
  const auto it = body.find("kv_transfer_params");
  if (it == body.end() || it->is_null()) return r;
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
  return r;
}

Status PrepareDisaggregated(Service::Core& core, const KvTransferRequest& kv,
                            runtime::RequestParams* params) {
  if (kv.remote_decode) {
    if (params->n != 1) return InvalidArgument("kv_transfer_params.do_remote_decode: n must be 1");
    // Nothing to hand over for a one-token prompt: the decode worker computes it.
    params->export_prompt_state = params->prompt.size() >= 2;
  }
  if (kv.remote_prefill && kv.descriptor) {
    auto blob = core.options.kv_transfer->Pull(*kv.descriptor);
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

Result<Json> HoldForRemoteDecode(Service::Core& core, const Generation& generation,
                                 const runtime::RequestParams& params) {
  Json descriptor = nullptr;
  if (params.export_prompt_state) {
    if (!generation.export_status().ok()) return generation.export_status();
    if (generation.exported_state() == nullptr)
      return Internal("the prefill finished without exporting its state");
    auto held = core.options.kv_transfer->Hold(*generation.exported_state());
    if (!held.ok()) return held.status();
    descriptor = DescriptorToJson(*held);
  }
  return Json{{"do_remote_decode", false},
              {"do_remote_prefill", true},
              {"remote_engine_id", core.options.engine_id},
              {"remote_request_id", params.request_id},
              {"remote_block_ids", Json::array()},
              {"dsinfer_transfer", descriptor}};
}

bool RefuseKvTransferParams(const Json& body, ResponseSink& sink, ApiFlavor flavor) {
  const auto it = body.find("kv_transfer_params");
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
    SendError(sink, BadRequest(kv.status().message(), "kv_transfer_params"), flavor);
    return std::nullopt;
  }
  if (kv->remote_decode && stream) {
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
  if (!kv.remote_decode || end != GenerationEnd::kFinished) return true;
  auto params = HoldForRemoteDecode(core, generation, generation.params());
  if (!params.ok()) {
    SendError(sink, GenerationFailed(params.status()), ApiFlavor::kOpenAI);
    return false;
  }
  result.set_extra_field("kv_transfer_params", std::move(params).value());
  return true;
}

}  // namespace dsinfer::server
