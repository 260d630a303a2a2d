#include "echelon/net/pipeline_stage.h"

#include <ATen/ATen.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstring>

#include "echelon/net/auth.h"
#include "echelon/net/protocol.h"
#include "echelon/net/tls.h"
#include "echelon/v1/pipeline.grpc.pb.h"

namespace echelon::net {
namespace {

const char* DtypeName(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    default: return nullptr;
  }
}

void EncodeTensor(const at::Tensor& t, v1::Tensor* out) {
  const at::Tensor c = t.to(at::kCPU).contiguous();
  for (int64_t d : c.sizes()) out->add_shape(d);
  const char* name = DtypeName(c.scalar_type());
  TORCH_CHECK(name != nullptr, "pipeline: hidden states of dtype ", c.scalar_type(), " cannot be sent");
  out->set_dtype(name);
  out->set_data(static_cast<const char*>(c.data_ptr()), c.nbytes());
}

// [B, T, width] with B <= kMaxLaneRows and T <= positions; the bytes must match exactly.
Result<at::Tensor> DecodeTensor(const v1::Tensor& in, int64_t width, int64_t positions, const std::string& what) {
  at::ScalarType type;
  if (in.dtype() == "float32") type = at::kFloat;
  else if (in.dtype() == "bfloat16") type = at::kBFloat16;
  else if (in.dtype() == "float16") type = at::kHalf;
  else return InvalidArgument(what + ": dtype \"" + in.dtype().substr(0, 32) + "\" (float32, bfloat16 or float16)");
  if (in.shape_size() != 3 || in.shape(0) < 1 || in.shape(0) > kMaxLaneRows || in.shape(1) < 1 ||
      in.shape(1) > positions || in.shape(2) != width)
    return InvalidArgument(what + ": shape must be [1.." + std::to_string(kMaxLaneRows) + ", 1.." +
                           std::to_string(positions) + ", " + std::to_string(width) + "]");
  const int64_t n = in.shape(0) * in.shape(1) * in.shape(2);
  const size_t bytes = static_cast<size_t>(n) * at::elementSize(type);
  if (in.data().size() != bytes)
    return InvalidArgument(what + ": " + std::to_string(in.data().size()) + " bytes for a tensor of " +
                           std::to_string(bytes));
  at::Tensor t = at::empty({in.shape(0), in.shape(1), in.shape(2)}, at::TensorOptions().dtype(type));
  std::memcpy(t.data_ptr(), in.data().data(), bytes);
  if (!at::isfinite(t).all().item<bool>()) return InvalidArgument(what + ": not finite");
  return t;
}

grpc::Status ToGrpc(const Status& s) {
  if (s.ok()) return grpc::Status::OK;
  grpc::StatusCode code = grpc::StatusCode::INTERNAL;
  switch (s.code()) {
    case StatusCode::kInvalidArgument: code = grpc::StatusCode::INVALID_ARGUMENT; break;
    case StatusCode::kNotFound: code = grpc::StatusCode::NOT_FOUND; break;
    case StatusCode::kFailedPrecondition: code = grpc::StatusCode::FAILED_PRECONDITION; break;
    case StatusCode::kUnavailable: code = grpc::StatusCode::UNAVAILABLE; break;
    case StatusCode::kDeadlineExceeded: code = grpc::StatusCode::DEADLINE_EXCEEDED; break;
    case StatusCode::kAborted: code = grpc::StatusCode::ABORTED; break;
    case StatusCode::kResourceExhausted: code = grpc::StatusCode::RESOURCE_EXHAUSTED; break;
    default: break;
  }
  return grpc::Status(code, s.message());
}

Status FromGrpc(const grpc::Status& s, const std::string& where) {
  if (s.ok()) return Status::Ok();
  const std::string m = where + ": " + s.error_message();
  switch (s.error_code()) {
    case grpc::StatusCode::INVALID_ARGUMENT: return InvalidArgument(m);
    case grpc::StatusCode::NOT_FOUND: return NotFound(m);
    case grpc::StatusCode::ABORTED: return Aborted(m);
    case grpc::StatusCode::DEADLINE_EXCEEDED: return DeadlineExceeded(m);
    case grpc::StatusCode::UNAVAILABLE: return Unavailable(m);
    case grpc::StatusCode::UNAUTHENTICATED: return FailedPrecondition(m);
    default: return Internal(m);
  }
}

void EncodeMessage(uint64_t lane, const model::StageMessage& m, v1::StageForwardRequest* out) {
  out->set_lane(lane);
  out->set_has_draws(m.has_draws);
  for (int64_t r : m.rows) out->add_rows(r);
  for (int64_t t : m.tokens) out->add_tokens(t);
  if (m.hidden.defined()) EncodeTensor(m.hidden, out->mutable_hidden());
  out->set_need(m.need);
  out->set_stopped(m.stopped);
}

}  // namespace

class StageService::Impl final : public v1::PipelineStage::Service {
 public:
  Impl(model::StageServer* stage, std::optional<model::ModelConfig> config, const StageServiceOptions& options)
      : stage_(stage), options_(options) {
    if (config) SetConfig(*config);
  }

  void SetConfig(const model::ModelConfig& config) {
    std::lock_guard<std::mutex> lock(mu_);
    config_ = std::make_shared<const model::ModelConfig>(config);
  }

  grpc::Status Open(grpc::ServerContext* ctx, const v1::OpenLaneRequest* req, v1::OpenLaneReply*) override {
    if (!TokenMatches(*ctx, options_.token)) return Unauthenticated();
    const auto config = Config();
    if (!config) return NotReady();
    Result<model::LaneSpec> spec = DecodeSpec(*config, *req);
    if (!spec.ok()) return ToGrpc(spec.status());
    if (stage_->open_lanes() >= options_.max_lanes)
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          "this stage holds " + std::to_string(options_.max_lanes) + " lanes already");
    return ToGrpc(stage_->Open(req->lane(), spec.value()));
  }

  grpc::Status Forward(grpc::ServerContext* ctx, const v1::StageForwardRequest* req,
                       v1::StageForwardReply* reply) override {
    if (!TokenMatches(*ctx, options_.token)) return Unauthenticated();
    if (!req->has_hidden()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "forward without hidden states");
    const auto config = Config();
    if (!config) return NotReady();
    Result<model::StageMessage> m = DecodeMessage(*config, *req);
    if (!m.ok()) return ToGrpc(m.status());
    Result<at::Tensor> out = stage_->Forward(req->lane(), std::move(m).value());
    if (!out.ok()) return ToGrpc(out.status());
    if (out.value().defined()) EncodeTensor(out.value(), reply->mutable_output());
    return grpc::Status::OK;
  }

  grpc::Status Close(grpc::ServerContext* ctx, const v1::StageForwardRequest* req, v1::StageForwardReply*) override {
    if (!TokenMatches(*ctx, options_.token)) return Unauthenticated();
    if (req->has_hidden()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "a close carries no hidden states");
    const auto config = Config();
    if (!config) return NotReady();
    Result<model::StageMessage> m = DecodeMessage(*config, *req);
    if (!m.ok()) return ToGrpc(m.status());
    return ToGrpc(stage_->Close(req->lane(), std::move(m).value()));
  }

 private:
  std::shared_ptr<const model::ModelConfig> Config() const {
    std::lock_guard<std::mutex> lock(mu_);
    return config_;
  }
  static grpc::Status NotReady() {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "this pipeline stage has not joined its run yet");
  }

  static grpc::Status Unauthenticated() {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing or wrong bearer token");
  }

  static Result<model::LaneSpec> DecodeSpec(const model::ModelConfig& config, const v1::OpenLaneRequest& req) {
    const int64_t positions = config.max_position_embeddings;
    const int64_t rows = req.prompts_size();
    if (rows < 1 || rows > kMaxLaneRows)
      return InvalidArgument("a lane holds 1.." + std::to_string(kMaxLaneRows) + " prompts, not " + std::to_string(rows));
    const v1::LaneControl& c = req.control();
    if (c.max_new_tokens() < 0 || c.max_new_tokens() > positions)
      return InvalidArgument("max_new_tokens must be in 0.." + std::to_string(positions));
    if (c.slots() < 0 || c.slots() > kMaxLaneRows)
      return InvalidArgument("slots must be in 0.." + std::to_string(kMaxLaneRows));
    if (c.max_new_tokens_per_row_size() != 0 && c.max_new_tokens_per_row_size() != rows)
      return InvalidArgument("max_new_tokens_per_row must be empty or hold one limit per prompt");
    model::LaneSpec spec;
    for (const v1::Prompt& p : req.prompts()) {
      if (p.ids_size() < 1 || p.ids_size() + c.max_new_tokens() > positions)
        return InvalidArgument("a prompt holds 1.." + std::to_string(positions) +
                               " tokens with its completion, not " + std::to_string(p.ids_size()));
      for (int64_t id : p.ids())
        if (id < 0 || id >= config.vocab_size) return InvalidArgument("token id " + std::to_string(id) + " out of vocab");
      spec.prompts.emplace_back(p.ids().begin(), p.ids().end());
    }
    model::SamplingParams& s = spec.params;
    s.max_new_tokens = c.max_new_tokens();
    s.eos_token_id = c.eos_token_id();
    s.stop_token_ids.assign(c.stop_token_ids().begin(), c.stop_token_ids().end());
    s.ignore_eos = c.ignore_eos();
    s.max_new_tokens_per_row.assign(c.max_new_tokens_per_row().begin(), c.max_new_tokens_per_row().end());
    s.slots = c.slots();
    s.continuous = c.continuous();
    s.use_cache = c.use_cache();
    s.share_prefix = c.share_prefix();
    if (req.versioned()) {
      if (req.version() < 0) return InvalidArgument("a lane's snapshot version is >= 0");
      spec.version = req.version();
    }
    return spec;
  }

  static Result<model::StageMessage> DecodeMessage(const model::ModelConfig& config, const v1::StageForwardRequest& req) {
    model::StageMessage m;
    m.has_draws = req.has_draws();
    if (req.rows_size() != req.tokens_size() || req.rows_size() > kMaxLaneRows)
      return InvalidArgument("draws: rows and tokens must pair up (at most " + std::to_string(kMaxLaneRows) + ")");
    m.rows.assign(req.rows().begin(), req.rows().end());
    m.tokens.assign(req.tokens().begin(), req.tokens().end());
    if (req.has_hidden()) {
      ECHELON_ASSIGN_OR_RETURN(m.hidden, DecodeTensor(req.hidden(), config.hidden_size,
                                                      config.max_position_embeddings, "hidden states"));
    }
    m.need = req.need();
    m.stopped = req.stopped();
    return m;
  }

  model::StageServer* const stage_;
  const StageServiceOptions options_;
  mutable std::mutex mu_;  // guards config_
  std::shared_ptr<const model::ModelConfig> config_;  // null until SetConfig
};

void StageService::SetConfig(const model::ModelConfig& config) { impl_->SetConfig(config); }

Result<std::unique_ptr<StageService>> StageService::Start(model::StageServer* stage,
                                                          std::optional<model::ModelConfig> config,
                                                          const StageServiceOptions& options) {
  std::unique_ptr<StageService> s(new StageService());
  s->impl_ = std::make_unique<Impl>(stage, std::move(config), options);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, ServerCredentials(options.tls), &s->port_);
  builder.RegisterService(s->impl_.get());
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  s->server_ = builder.BuildAndStart();
  if (!s->server_ || s->port_ == 0) return Unavailable("pipeline stage: cannot listen on " + options.listen);
  return s;
}

StageService::~StageService() {
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

class RemoteStage::Stub {
 public:
  Stub(const std::string& address, const std::string& cert_pem) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(kMaxMessageBytes);
    args.SetMaxSendMessageSize(kMaxMessageBytes);
    if (!cert_pem.empty()) SetPeerTargetName(&args);
    stub = v1::PipelineStage::NewStub(grpc::CreateCustomChannel(address, ChannelCredentials(cert_pem), args));
  }
  std::unique_ptr<v1::PipelineStage::Stub> stub;
};

Result<std::unique_ptr<RemoteStage>> RemoteStage::Connect(const std::string& address, const std::string& token,
                                                          double timeout_seconds, const std::string& cert_pem) {
  if (address.empty()) return InvalidArgument("pipeline: no address for the next stage");
  std::unique_ptr<RemoteStage> r(new RemoteStage());
  r->address_ = address;
  r->token_ = token;
  r->timeout_seconds_ = timeout_seconds;
  r->stub_ = std::make_unique<Stub>(address, cert_pem);
  return r;
}

RemoteStage::~RemoteStage() = default;

namespace {

void Prepare(grpc::ClientContext& ctx, const std::string& token, double timeout_seconds) {
  AttachToken(ctx, token);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::duration_cast<std::chrono::milliseconds>(
                                                          std::chrono::duration<double>(timeout_seconds)));
}

}  // namespace

Status RemoteStage::Open(uint64_t lane, const model::LaneSpec& spec) {
  v1::OpenLaneRequest req;
  req.set_lane(lane);
  for (const auto& p : spec.prompts) {
    v1::Prompt* out = req.add_prompts();
    for (int64_t id : p) out->add_ids(id);
  }
  const model::SamplingParams& s = spec.params;
  v1::LaneControl* c = req.mutable_control();
  c->set_max_new_tokens(s.max_new_tokens);
  c->set_eos_token_id(s.eos_token_id);
  for (int64_t id : s.stop_token_ids) c->add_stop_token_ids(id);
  c->set_ignore_eos(s.ignore_eos);
  for (int64_t n : s.max_new_tokens_per_row) c->add_max_new_tokens_per_row(n);
  c->set_slots(s.slots);
  c->set_continuous(s.continuous);
  c->set_use_cache(s.use_cache);
  c->set_share_prefix(s.share_prefix);
  if (spec.version >= 0) {
    req.set_versioned(true);
    req.set_version(spec.version);
  }
  grpc::ClientContext ctx;
  Prepare(ctx, token_, timeout_seconds_);
  v1::OpenLaneReply reply;
  return FromGrpc(stub_->stub->Open(&ctx, req, &reply), "pipeline stage " + address_);
}

Result<at::Tensor> RemoteStage::Forward(uint64_t lane, model::StageMessage m) {
  v1::StageForwardRequest req;
  EncodeMessage(lane, m, &req);
  grpc::ClientContext ctx;
  Prepare(ctx, token_, timeout_seconds_);
  v1::StageForwardReply reply;
  ECHELON_RETURN_IF_ERROR(FromGrpc(stub_->stub->Forward(&ctx, req, &reply), "pipeline stage " + address_));
  if (!reply.has_output()) return at::Tensor();
  const int64_t width = m.hidden.size(2), positions = m.hidden.size(1);
  return DecodeTensor(reply.output(), width, positions, "pipeline stage " + address_ + " output");
}

Status RemoteStage::Close(uint64_t lane, model::StageMessage m) {
  m.hidden = at::Tensor();
  v1::StageForwardRequest req;
  EncodeMessage(lane, m, &req);
  grpc::ClientContext ctx;
  Prepare(ctx, token_, timeout_seconds_);
  v1::StageForwardReply reply;
  return FromGrpc(stub_->stub->Close(&ctx, req, &reply), "pipeline stage " + address_);
}

StageRoute::StageRoute(std::string token, double timeout_seconds)
    : token_(std::move(token)), timeout_seconds_(timeout_seconds) {}

Status StageRoute::Retarget(const std::string& address, const std::string& cert_pem) {
  std::lock_guard<std::mutex> lock(mu_);
  if (address == address_ && cert_pem == cert_pem_ && current_) return Status::Ok();
  ECHELON_ASSIGN_OR_RETURN(std::unique_ptr<RemoteStage> next,
                           RemoteStage::Connect(address, token_, timeout_seconds_, cert_pem));
  current_ = std::move(next);
  address_ = address;
  cert_pem_ = cert_pem;
  return Status::Ok();
}

std::string StageRoute::address() const {
  std::lock_guard<std::mutex> lock(mu_);
  return address_;
}

std::shared_ptr<RemoteStage> StageRoute::Of(uint64_t lane) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = lanes_.find(lane);
  return it == lanes_.end() ? nullptr : it->second;
}

Status StageRoute::Open(uint64_t lane, const model::LaneSpec& spec) {
  std::shared_ptr<RemoteStage> next;
  {
    std::lock_guard<std::mutex> lock(mu_);
    next = current_;
  }
  if (!next) return Unavailable("pipeline: the next stage is not known yet");
  ECHELON_RETURN_IF_ERROR(next->Open(lane, spec));
  std::lock_guard<std::mutex> lock(mu_);
  lanes_[lane] = std::move(next);
  return Status::Ok();
}

Result<at::Tensor> StageRoute::Forward(uint64_t lane, model::StageMessage m) {
  std::shared_ptr<RemoteStage> next = Of(lane);
  if (!next) return NotFound("pipeline lane " + std::to_string(lane) + " was not opened here");
  return next->Forward(lane, std::move(m));
}

Status StageRoute::Close(uint64_t lane, model::StageMessage m) {
  std::shared_ptr<RemoteStage> next;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = lanes_.find(lane);
    if (it == lanes_.end()) return NotFound("pipeline lane " + std::to_string(lane) + " was not opened here");
    next = std::move(it->second);
    lanes_.erase(it);
  }
  return next->Close(lane, std::move(m));
}

}  // namespace echelon::net
