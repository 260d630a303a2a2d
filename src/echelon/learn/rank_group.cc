#include "echelon/learn/rank_group.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef ECHELON_WITH_NCCL
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace echelon::learn {
namespace {

Result<int> EnvInt(const char* name, int lo, int hi, std::optional<int> fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') {
    if (fallback) return *fallback;
    return InvalidArgument(std::string(name) + " is not set (WORLD_SIZE is, so RANK, MASTER_ADDR and MASTER_PORT "
                                               "must be too, as torchrun sets them)");
  }
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < lo || x > hi)
    return InvalidArgument(std::string(name) + "=" + v + " is not an integer in [" + std::to_string(lo) + ", " +
                           std::to_string(hi) + "]");
  return static_cast<int>(x);
}

}  // namespace

// The concrete group types: LibTorch 1.x derives them from ProcessGroup, 2.x from Backend; both
// have the collectives used here.
struct RankGroup::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group;  // host memory: bytes, and every tensor without NCCL
#ifdef ECHELON_WITH_NCCL
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> nccl;   // CUDA tensors, in place on the device
#endif
  bool OnDevice(const at::Tensor& t) const {
#ifdef ECHELON_WITH_NCCL
    return nccl && t.is_cuda();
#else
    return false;
#endif
  }
  // One collective over `t`: on the device group where it lives there, else on Gloo through host
  // memory (copied back into a device tensor afterwards).
  template <typename Op>
  void Collective(at::Tensor& t, const Op& op) {
#ifdef ECHELON_WITH_NCCL
    if (OnDevice(t)) {
      std::vector<at::Tensor> one = {t};
      op(*nccl, one);
      return;
    }
#endif
    std::vector<at::Tensor> one = {t.is_cpu() ? t : t.to(at::kCPU)};
    op(*group, one);
    if (!t.is_cpu()) t.copy_(one[0]);
  }
};

Result<std::optional<RankGroupOptions>> RankOptionsFromEnv() {
  if (std::getenv("WORLD_SIZE") == nullptr) return std::optional<RankGroupOptions>();
  RankGroupOptions o;
  ECHELON_ASSIGN_OR_RETURN(o.world, EnvInt("WORLD_SIZE", 1, 65536, std::nullopt));
  ECHELON_ASSIGN_OR_RETURN(o.rank, EnvInt("RANK", 0, o.world - 1, std::nullopt));
  ECHELON_ASSIGN_OR_RETURN(o.local_rank, EnvInt("LOCAL_RANK", 0, 65535, 0));
  ECHELON_ASSIGN_OR_RETURN(o.master_port, EnvInt("MASTER_PORT", 1, 65535, std::nullopt));
  const char* addr = std::getenv("MASTER_ADDR");
  if (addr == nullptr || *addr == '\0') return InvalidArgument("MASTER_ADDR is not set (WORLD_SIZE is)");
  o.master_addr = addr;
  return std::optional<RankGroupOptions>(o);
}

RankGroup::RankGroup(RankGroupOptions options, std::unique_ptr<Impl> impl)
    : options_(std::move(options)), impl_(std::move(impl)) {}

RankGroup::~RankGroup() = default;

Result<std::unique_ptr<RankGroup>> RankGroup::Connect(const RankGroupOptions& options) {
  const std::string where = "learner rank " + std::to_string(options.rank) + " of " + std::to_string(options.world) +
                            " (rendezvous " + options.master_addr + ":" + std::to_string(options.master_port) + ")";
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(options.timeout_seconds * 1000));
  auto impl = std::make_unique<Impl>();
  RankGroupOptions o = options;
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(options.master_port);
    so.isServer = options.rank == 0;
    so.numWorkers = options.world;
    so.waitWorkers = false;
    so.timeout = timeout;
    auto store = c10::make_intrusive<c10d::TCPStore>(options.master_addr, so);
    o.master_port = store->getPort();
    if (options.rank == 0 && options.on_listening) ECHELON_RETURN_IF_ERROR(options.on_listening(o.master_port));
    impl->store = store;
    auto go = c10d::ProcessGroupGloo::Options::create();
    // Gloo's own connections: on loopback for local ranks; across hosts through the interface of
    // GLOO_SOCKET_IFNAME, else the one this host's name resolves to.
    const bool loopback = options.master_addr.rfind("127.", 0) == 0 || options.master_addr == "localhost";
    if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname != nullptr && *ifname != '\0') {
      go->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
    } else if (loopback) {
      go->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    } else {
      go->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    }
    go->timeout = timeout;
    impl->group = c10::make_intrusive<c10d::ProcessGroupGloo>(impl->store, options.rank, options.world, go);
#ifdef ECHELON_WITH_NCCL
    if (options.device.rfind("cuda", 0) == 0) {
      auto nccl_store = c10::make_intrusive<c10d::PrefixStore>("nccl/", impl->store);
      auto no = c10d::ProcessGroupNCCL::Options::create();
      no->timeout = timeout;
      impl->nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(nccl_store, options.rank, options.world, no);
    }
#endif
  } catch (const std::exception& e) {
    return Status(StatusCode::kUnavailable, where + ": " + e.what());
  }
  return std::unique_ptr<RankGroup>(new RankGroup(o, std::move(impl)));
}

Status RankGroup::Run(const char* what, const std::function<void()>& op) {
  try {
    op();
  } catch (const std::exception& e) {
    // After a failed collective Gloo's state is undefined: carrying on (writing a checkpoint,
    // tearing the group down) corrupted the heap in tests (a hang in free, segfaults). So, as
    // PyTorch does on NCCL errors, the process ends here: one line, then exit. The run resumes
    // from its last checkpoint (checkpoint.every), with any number of ranks.
    std::string msg = e.what();
    if (const size_t nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
    spdlog::error("learner rank {}: {} across {} ranks failed (a rank died or stopped answering): {}; exiting, "
                  "resume from the last checkpoint (--resume RUN_DIR)",
                  rank(), what, world(), msg);
    spdlog::shutdown();
    std::fflush(nullptr);
    std::_Exit(1);
  }
  return Status::Ok();
}

Status RankGroup::AllReduceSum(at::Tensor& flat) {
  return Run("all-reduce", [&] {
    impl_->Collective(flat, [](auto& group, std::vector<at::Tensor>& t) { group.allreduce(t)->wait(); });
  });
}

Status RankGroup::Broadcast(std::vector<at::Tensor>& tensors, int root) {
  return Run("broadcast", [&] {
    c10d::BroadcastOptions bo;
    bo.rootRank = root;
    for (at::Tensor& t : tensors)
      impl_->Collective(t, [&](auto& group, std::vector<at::Tensor>& one) { group.broadcast(one, bo)->wait(); });
  });
}

Status RankGroup::AllGather(const at::Tensor& shard, at::Tensor& full) {
  const int64_t n = shard.numel();
  if (full.numel() != n * world()) return InvalidArgument("all-gather: the output is not world x the shard");
  return Run("all-gather", [&] {
    const bool host = !impl_->OnDevice(shard);
    std::vector<at::Tensor> in = {host ? shard.to(at::kCPU).contiguous() : shard.contiguous()};
    // Gloo has no bf16: its bits travel as fp16 (copied, never added, so exactly).
    const bool bits = host && in[0].scalar_type() == at::kBFloat16;
    if (bits) in[0] = in[0].view(at::kHalf);
    std::vector<std::vector<at::Tensor>> out(1);
    for (int r = 0; r < world(); ++r) out[0].push_back(at::empty({n}, in[0].options()));
#ifdef ECHELON_WITH_NCCL
    if (!host) {
      impl_->nccl->allgather(out, in)->wait();
    } else {
      impl_->group->allgather(out, in)->wait();
    }
#else
    impl_->group->allgather(out, in)->wait();
#endif
    const at::Tensor gathered = at::cat(out[0]);
    full.copy_(bits ? gathered.view(full.scalar_type()) : gathered);
  });
}

Status RankGroup::ReduceScatterSum(at::Tensor& full, at::Tensor& shard) {
  const int64_t n = shard.numel();
  if (full.numel() != n * world()) return InvalidArgument("reduce-scatter: the input is not world x the shard");
  ECHELON_RETURN_IF_ERROR(AllReduceSum(full));
  shard.copy_(full.narrow(0, rank() * n, n));
  return Status::Ok();
}

Status RankGroup::BroadcastBytes(std::string* bytes, int root) {
  std::vector<at::Tensor> size = {at::full({1}, static_cast<int64_t>(bytes->size()), at::kLong)};
  ECHELON_RETURN_IF_ERROR(Broadcast(size, root));
  const int64_t n = size[0].item<int64_t>();
  std::vector<at::Tensor> data = {at::empty({n}, at::kByte)};
  if (rank() == root && n > 0) std::memcpy(data[0].data_ptr<uint8_t>(), bytes->data(), static_cast<size_t>(n));
  ECHELON_RETURN_IF_ERROR(Broadcast(data, root));
  if (rank() != root) bytes->assign(reinterpret_cast<const char*>(data[0].data_ptr<uint8_t>()), static_cast<size_t>(n));
  return Status::Ok();
}

}  // namespace echelon::learn
