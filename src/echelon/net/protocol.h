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
// and their work comes without a prompt. 7: tokens carry the version that drew them
// (Turn.versions, partial rollouts), which an older learner would take for the oldest's and
// refuse as a log-prob mismatch. 8: each group's sampling seed comes with its work
// (AcquireReply.seed, drawn from the learner's secret); an older actor would sample with the
// run seed it no longer gets, and be refused as sample_not_drawn. 9: resumable groups
// (AcquireReply.prefix, ReportPrefix): an older actor would start a resumed group over, and be
// refused as prefix_altered. 10: evaluation groups (AcquireReply.evaluation): an older actor
// would sample one with its newest snapshot at the run's temperature, and be refused.
inline constexpr uint32_t kProtocolVersion = 10;

// Stages one pipelined rollout worker may have (each a process and a gRPC hop per token).
inline constexpr int kMaxPipelineStages = 64;
// A stage's self-signed certificate (net/tls.h) is under 1 KiB; 8 KiB bounds what the learner
// keeps and hands on per stage.
inline constexpr uint64_t kMaxStageCertBytes = 8192;

// Progress reports one heartbeat carries that the learner reads (the rest are ignored): an
// honest actor runs one group at a time, and a worker holds at most kMaxLeasesPerWorker leases.
inline constexpr int kMaxProgressReports = 16;
// Prefix parts one ReportPrefix request may carry (one a sample of a group; rl.group_size is
// at most this): a request with more is refused before it is decoded.
inline constexpr int kMaxPrefixParts = 4096;
// Live registrations one worker may hold (its actors and pipeline stages together): a worker
// that registers again past it loses its least recently seen registration, so a restarting
// worker replaces its stale ones and no worker can fill the learner's tables.
inline constexpr int kMaxRegistrationsPerWorker = 32;

// Largest message either side accepts. A group of 8 x 6-token math samples is ~1 KiB; a
// 64-sample group of 4k-token episodes is ~4 MiB. Anything larger is refused as hostile.
inline constexpr int kMaxMessageBytes = 32 << 20;
// What an actor leaves of it for gRPC's own framing when it sizes a Submit (net/codec.h
// FitRoutes: router replay's routes are dropped before a group would not fit).
inline constexpr int kSubmitHeadroomBytes = 64 << 10;

// Snapshots stream in pieces of this size: large enough that per-message overhead is small
// (gRPC moves 1-2 GB/s on loopback with MiB messages), small enough to stay far below the
// message limit.
inline constexpr uint64_t kSnapshotPieceBytes = 1 << 20;

// An actor that cannot reach the learner retries with exponential backoff up to this cap, and
// its channel redials at least this often, so a restarted learner has its actors back within
// about two seconds.
inline constexpr double kMaxBackoffSeconds = 2.0;

// The deadlines of an actor's calls to the learner (heartbeat and eviction times are
// sched/tunables.h's). A call past its deadline is retried with backoff (Play gives its group
// up), so a deadline only bounds how long a lost reply holds the actor.
// Register: a learner busy publishing answers late; the reply is small.
inline constexpr double kRegisterDeadlineSeconds = 30;
// Heartbeat: tiny; a missed one is followed by the next within a heartbeat.
inline constexpr double kHeartbeatDeadlineSeconds = 5;
// Acquire: tiny, but waits behind the dispatcher's lock.
inline constexpr double kAcquireDeadlineSeconds = 10;
// Submit: a group of up to kMaxMessageBytes (32 MiB) takes ~27 s on a 10 Mbit/s uplink.
inline constexpr double kSubmitDeadlineSeconds = 30;
// Play: waits while the learner's environment takes its turn (an HTTP environment's step, a
// poker opponent), which is short; above learn::HostedEpisodesOptions::environment_wait_seconds.
inline constexpr double kPlayDeadlineSeconds = 60;
// A direct snapshot pull has no deadline as a whole (16 GB at 100 Mbit/s takes 22 minutes): it
// is cancelled when no piece (kSnapshotPieceBytes) arrived for this long, by the actor, and by
// the learner when no piece could be written for this long (a reader that stops reading would
// otherwise pin its version's bytes and a server thread).
inline constexpr double kSnapshotStallSeconds = 30;
// ReportPrefix: ten seconds of a group's new tokens, ~20 bytes each; a report that fails is
// sent again with the next (the generation waits while it goes).
inline constexpr double kReportPrefixDeadlineSeconds = 10;
// Joining the learner's broadcast; on failure snapshots come directly.
inline constexpr double kBroadcastJoinSeconds = 5;

}  // namespace echelon::net
