// The one table of scheduling and liveness tunables (dispatcher leases, actor heartbeats,
// the learner's waiting), each with the reason for its default. The training config's keys
// (cli/train_config.cc) and the gRPC transport (net/) take their defaults from here.
//
// Thread contract: plain values.
#pragma once

namespace echelon::sched {

// A lease only recovers the work of an actor that is alive but stuck (a hung inference
// server, a wedged GPU): one that dies or loses its link stops heartbeating and is evicted
// within kEvictAfterSeconds, its groups re-issued at once. So the lease can be long, and must
// be longer than any honest group: a group of the default job takes under a second; 8 samples
// x 2,048 tokens of an 8B model on one consumer GPU take about a minute. Twice that.
inline constexpr double kDefaultLeaseSeconds = 120;

// A lease whose holder reports progress (tokens generated, with its heartbeats) is renewed, so
// reasoning-length groups need no longer lease; the renewals stop this many leases after the
// hand-out. Ten (20 minutes by default) covers 8 samples x 32k tokens at 250 tokens/s, and
// bounds what a worker that reports fake progress can hold back (a few groups, its lease cap,
// for 20 minutes; the staleness bound drops what it then submits anyway).
inline constexpr double kMaxLeaseLifeFactor = 10;

// How often an actor tells the learner how far its running group has come (piggybacked on the
// heartbeat over gRPC): every heartbeat.
inline constexpr double kProgressSeconds = 1.0;

// How often an actor reports its running group's new tokens (contract::PrefixPart), so that a
// lease lost midway is resumed from there: at most this much generation is lost to a
// preemption. A 20k-token sample at 50 tokens/s loses at most a twelfth of itself; a report
// is ~20 bytes a token (token, log-prob, version), 0.1 MB every 10 s for 8 such samples.
inline constexpr double kPrefixSeconds = 10.0;

// Actors call in at least this often (acquire, submit or heartbeat). One second keeps the
// learner's liveness view fresh at a cost of one tiny RPC per actor per second (1,000 actors:
// 1,000 RPC/s, well within one learner's gRPC server).
inline constexpr double kHeartbeatSeconds = 1.0;

// An actor silent for three heartbeats is evicted and its groups re-issued: one lost or
// delayed heartbeat (a GC pause, a congested home link) does not evict, a dead actor costs
// the run at most three seconds of its work.
inline constexpr double kEvictAfterSeconds = 3.0;

// A worker whose submissions were refused as forged this many times (SubmitOutcome::forged:
// refusals an honest actor never earns, such as a swapped prompt or an impossible log-prob) is
// quarantined until the learner restarts: its calls are refused and its leases re-issued.
// One forged group may be a bug on the worker's side and costs the run nothing (it is
// refused and re-issued); three are a pattern, and cost at most three groups of work.
inline constexpr int kQuarantineAfterForged = 3;

// The most running leases one worker (its actors together, WorkerName) may hold. An honest
// actor holds one (two while the lease of a group it failed runs out), so 8 lets a worker run
// a few actor processes on one token; a worker that acquires and never submits (hoarding the
// admission window, which holds groups_per_step x (S + 1) groups, 32 at the least by default)
// holds 8 leases until they expire, never the whole window.
inline constexpr int64_t kMaxLeasesPerWorker = 8;

// The learner gives up when no rollout arrives for this long: every actor is failing or gone.
// Five minutes lets remote actors boot, load a model and fetch the first snapshot.
inline constexpr double kDefaultStallTimeoutSeconds = 300;

// While it waits for groups the learner wakes at least this often to collect expired
// leases and silent actors (arrivals wake it at once). 50 ms is below one heartbeat and costs
// nothing measurable.
inline constexpr double kLearnerPollSeconds = 0.05;

// An actor that gets no work (the admission window is full) or holds no snapshot yet asks
// again after this long: short against a group's generation time, so a freed slot is taken
// within milliseconds, long enough that idle actors cost the learner little.
inline constexpr double kActorIdleSleepSeconds = 0.002;
// An actor that keeps getting no work doubles its wait up to this: a thousand idle actors then
// ask about 16,000 times a second at most (not 500,000), and with N actors polling, a freed
// slot still waits about 64 ms / N on average.
inline constexpr double kActorMaxIdleSleepSeconds = 0.064;

}  // namespace echelon::sched
