// RankGroup: the learner's data-parallel ranks on LibTorch's own distributed layer (c10d):
// a TCPStore rendezvous at rank 0's address and a Gloo process group; in builds with ECHELON_NCCL
// (a CUDA LibTorch with NCCL) CUDA ranks also get an NCCL group that reduces their tensors in
// place on the GPU. It is the Learner's GradientReducer, and it
// carries what rank 0 sends its workers (learn/learner_ranks.h): messages as bytes, weights as
// tensors. Every operation has a timeout; a rank that dies makes the others' next operation
// fail: the process then logs one line and exits 1 at once (Gloo's state after a failed
// collective is undefined), and the run resumes from its last checkpoint.
//
//   ECHELON_ASSIGN_OR_RETURN(RankGroupOptions o, RankOptionsFromEnv());   // torchrun's variables
//   ECHELON_ASSIGN_OR_RETURN(std::unique_ptr<RankGroup> g, RankGroup::Connect(o));
//   ECHELON_RETURN_IF_ERROR(g->AllReduceSum(flat_gradients));
//
// Thread contract: one thread drives a group; every rank calls the same operations in the same
// order (collectives).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "echelon/common/status.h"
#include "echelon/learn/learner.h"

namespace echelon::learn {

struct RankGroupOptions {
  int rank = 0;
  int world = 1;
  int local_rank = 0;               // which GPU of its host a rank uses (cuda:LOCAL_RANK)
  std::string master_addr = "127.0.0.1";
  int master_port = 0;              // rank 0 listens here; 0 picks a free port (local ranks only)
  double timeout_seconds = 300;     // one collective, and the rendezvous
  std::string device = "cpu";       // where the tensors of the collectives live
  // Rank 0 only: called once the rendezvous listens, with its port (starts local ranks).
  std::function<Status(int port)> on_listening;
};

// The torchrun variables RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK; nullopt when
// WORLD_SIZE is unset. Errors name the variable (missing, not a number, out of range).
Result<std::optional<RankGroupOptions>> RankOptionsFromEnv();

class RankGroup : public GradientReducer {
 public:
  // Joins the group (rank 0 hosts the rendezvous); fails after timeout_seconds naming who is
  // missing.
  static Result<std::unique_ptr<RankGroup>> Connect(const RankGroupOptions& options);
  ~RankGroup() override;

  int rank() const override { return options_.rank; }
  int world() const override { return options_.world; }
  int local_rank() const { return options_.local_rank; }

  int port() const { return options_.master_port; }
  Status AllReduceSum(at::Tensor& flat) override;
  // Every rank's `tensors` (same shapes everywhere) become root's.
  Status Broadcast(std::vector<at::Tensor>& tensors, int root) override;
  Status AllGather(const at::Tensor& shard, at::Tensor& full) override;
  // Gloo has no reduce-scatter in LibTorch 1.x: an all-reduce, then this rank's part (twice a
  // reduce-scatter's traffic; the same result).
  Status ReduceScatterSum(at::Tensor& full, at::Tensor& shard) override;
  // Root's `bytes` reach every rank (the others' are replaced).
  Status BroadcastBytes(std::string* bytes, int root);

  struct Impl;

 private:
  RankGroup(RankGroupOptions options, std::unique_ptr<Impl> impl);
  Status Run(const char* what, const std::function<void()>& op);
  RankGroupOptions options_;
  std::unique_ptr<Impl> impl_;

};

}  // namespace echelon::learn
