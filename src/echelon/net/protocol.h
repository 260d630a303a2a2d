// Constants of the learner <-> actor wire protocol (proto/echelon/v1/learner.proto), with the
// reason for each default.
#pragma once

#include <cstdint>

namespace echelon::net {

// Bumped on any incompatible change to learner.proto; checked at registration. 3: pipeline
// stages (PipelineRole): a stage must not be taken for a whole-model actor by an older learner.
// 4: stages serve over TLS with the learner (PipelineRole.cert_pem), which an older learner
// would not hand on. 5: single-turn work comes without its reference (scored_by_learner), which
// an older actor would score against "". 6: the learner plays multi-turn environments (Play),
// and their work comes without a prompt.
inline constexpr uint32_t kProtocolVersion = 6;

// Stages one pipelined rollout worker may have (each a process and a gRPC hop per token).
inline constexpr int kMaxPipelineStages = 64;
// A stage's self-signed certificate (net/tls.h) is under 1 KiB; 8 KiB bounds what the learner
// keeps and hands on per stage.
inline constexpr uint64_t kMaxStageCertBytes = 8192;

// Largest message either side accepts. A group of 8 x 6-token math samples is ~1 KiB; a
// 64-sample group of 4k-token episodes is ~4 MiB. Anything larger is refused as hostile.
inline constexpr int kMaxMessageBytes = 32 << 20;

// Snapshots stream in pieces of this size: large enough that per-message overhead is small
// (gRPC moves 1-2 GB/s on loopback with MiB messages), small enough to stay far below the
// message limit.
inline constexpr uint64_t kSnapshotPieceBytes = 1 << 20;

// Actors heartbeat this often; a learner evicts an actor silent for kEvictAfterHeartbeats
// intervals (about 3 s at the default), re-issuing its groups. Three missed beats tolerate a
// scheduling hiccup on a loaded 2-core machine without letting a dead actor hold work long.
inline constexpr double kDefaultHeartbeatSeconds = 1.0;
inline constexpr double kEvictAfterHeartbeats = 3.0;

// An actor that cannot reach the learner retries with exponential backoff up to this cap, and
// its channel redials at least this often, so a restarted learner has its actors back within
// about two seconds.
inline constexpr double kMaxBackoffSeconds = 2.0;

// A Play call waits while the learner's environment takes its turn (an HTTP environment's
// step, a poker hand's opponent), which is short; a minute leaves room for a slow one.
inline constexpr int kPlayDeadlineSeconds = 60;

}  // namespace echelon::net
