// `echelon broadcast origin|peer`: the weight broadcast as standalone processes, one per host,
// for external harnesses and bench/broadcast_netns.sh.
//
//   echelon broadcast origin --file F --listen HOST:PORT [--key KEYFILE] [--mode peer|star]
//       [--chunk-mib N] [--expect-peers N] [--upload-slots K] [--version V] [--exit-when-done]
//       [--timeout S] [--delta-from OLD] [--endgame-ratio R] [--transfers-per-slot K]
//       [--start-latency-ms L] [--trace OUT.jsonl] [--pace]
//   echelon broadcast peer --origin HOST:PORT (--listen HOST:PORT | --no-listen) --out F
//       [--origin-key PUB.pem] [--advertise HOST:PORT] [--name NAME] [--exit-when-done]
//       [--timeout S] [--have OLD] [--upload-mbps R [--no-pace]]
//
// Without --chunk-mib the file is cut into about 1024 chunks, a power of two from 1 to 64 MiB
// (broadcast::ChunkBytesFor).
//
// The origin waits for --expect-peers peers (so every peer starts together), publishes F as
// version V, and prints one JSON line each time every live peer holds it ("peers": how many hold
// it, counting any that left after completing; "dead": how many went away without it):
//   {"event":"complete","version":V,"mode":"peer","bytes":B,"chunks":C,"peers":N,"dead":D,
//    "seconds":T_last_peer,"per_peer":[{"peer":..,"seconds":..,"alive":..,"banned":..}],
//    "transfers":..,"origin_sends":..,"corrupt":..,"failed":..,"endgame":E,"bytes_pulled":P,
//    "uplink":U}
// A peer prints {"bytes":B,"seconds":T,"sha256":"..","version":V,"peer":"..","bytes_received":R}
// once it has verified and atomically written --out (T counts from its start; R: payload bytes
// it pulled, chunks and deltas), and as it leaves {"event":"exit","peer":"..","bytes_received":R,
// "uplink":U}. U is the node's uplink as its pacer saw it (net/uplink_pacer.h):
//   {"declared_mbps","estimated_mbps","pace_mbps","queue_delay_ms":{"p50","p99"},"delay_samples"}
// (null where unknown). Both keep serving until SIGINT/SIGTERM (the origin's Stop ends
// its peers); with --exit-when-done the origin leaves once the version is complete everywhere,
// and a peer once the origin says so (or is gone), so no peer stops relaying while others still
// need its chunks.
//
// With --trace OUT.jsonl the origin also writes, once the version is complete, one JSON line per
// transfer the receivers reported: {"chunk","from","to","ordered_s","reported_s","bytes","result"}
// (seconds after publishing), which shows where the time went: idle uplinks, slow tails.
//
// Deltas: with --delta-from OLD the origin also offers each chunk of F as its delta against OLD
// (broadcast/delta.h); a peer started with --have OLD (the same file) pulls those deltas,
// rebuilds F and checks it against the signed hashes; a peer without it pulls F whole.
//
// Pacing: every peer paces what it serves so its own uplink queue stays under a few
// milliseconds of delay (a FIFO uplink otherwise queues the ACKs of its downloads and its control
// messages behind its uploads), finding its uplink's rate from its sockets' TCP_INFO. A peer's
// --upload-mbps R is the origin's first estimate of its uplink, and the peer then paces to 95%
// of R instead of estimating. A peer's --no-pace: no pacing (a link whose router sends ACKs
// first). The origin downloads nothing and is not paced unless given --pace.
//
// NAT: a peer started with --no-listen serves nothing; it pulls every chunk by dialling its
// senders (the origin or listening peers), and the origin never asks it to relay.
//
// Keys: the origin signs with --key KEYFILE (default ./echelon-origin.key); when that file does
// not exist a new Ed25519 key is generated and saved there (mode 0600), its public key beside
// it as KEYFILE.pub, and both paths are logged. A peer given --origin-key KEYFILE.pub refuses
// any other origin key; without it the key the origin presents at join is trusted (trust on
// first use, logged as a warning with its key id).
#include <csignal>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <thread>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "echelon/broadcast/ed25519.h"
#include "echelon/common/sha256.h"
#include "echelon/cli/commands.h"
#include "echelon/common/clock.h"
#include "echelon/common/fs.h"
#include "echelon/net/auth.h"
#include "echelon/net/broadcast_origin.h"
#include "echelon/net/broadcast_peer.h"

namespace echelon::cli {
namespace {

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }

void InstallSignalHandlers() {
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
}

// How long the wait loops sleep between checks of signals and deadlines.
constexpr double kPollSeconds = 0.2;

struct OriginArgs {
  std::string file;
  std::string listen;
  std::string key = "echelon-origin.key";
  std::string mode = "peer";
  double chunk_mib = 0;  // 0: broadcast::ChunkBytesFor(the file's size)
  int expect_peers = 1;
  int upload_slots = net::kNetUploadSlots;
  double endgame_ratio = broadcast::RelayOptions{}.endgame_ratio;
  int transfers_per_slot = broadcast::RelayOptions{}.max_transfers_per_slot;
  double start_latency_ms = net::kNetStartLatencySeconds * 1000;
  uint64_t version = 1;
  bool exit_when_done = false;
  double timeout = 0;  // 0: none
  std::string token_file;
  std::string delta_from;
  std::string trace;
  bool pace = false;
};

struct PeerArgs {
  std::string origin;
  std::string listen;
  std::string out;
  std::string origin_key;
  std::string advertise;
  std::string name = "peer";
  bool exit_when_done = false;
  double timeout = 0;
  std::string token_file;
  std::string have;
  bool no_listen = false;
  double upload_mbps = 0;
  bool no_pace = false;
};

// The bearer token of --token-file ("" without one); false after printing why it is unusable.
bool ReadTokenFile(const std::string& path, std::string* token) {
  if (path.empty()) return true;
  Result<std::string> t = net::LoadToken(path);
  if (!t.ok()) {
    spdlog::error("--token-file: {}", t.status().message());
    return false;
  }
  *token = t.value();
  return true;
}

Result<broadcast::SigningKey> LoadOrCreateKey(const std::string& path) {
  if (std::filesystem::exists(path)) {
    ECHELON_ASSIGN_OR_RETURN(broadcast::SigningKey key, broadcast::SigningKey::LoadPem(path));
    spdlog::info("signing manifests with key id {} from {}", key.public_key().key_id(), path);
    return key;
  }
  ECHELON_ASSIGN_OR_RETURN(broadcast::SigningKey key, broadcast::SigningKey::Generate());
  ECHELON_RETURN_IF_ERROR(key.SavePem(path));
  ECHELON_RETURN_IF_ERROR(key.public_key().SavePem(path + ".pub"));
  spdlog::info("generated signing key id {}: private key {}, public key {} (give it to peers as --origin-key)",
               key.public_key().key_id(), path, path + ".pub");
  return key;
}

bool TimedOut(double started, double timeout, const RealClock& clock) {
  return timeout > 0 && clock.Now() - started > timeout;
}

nlohmann::json CompletionJson(net::BroadcastOrigin& origin, const broadcast::Manifest& m, const std::string& mode) {
  nlohmann::json per_peer = nlohmann::json::array();
  const std::vector<net::BroadcastPeerReport> reports = origin.Report(m.version);
  for (const net::BroadcastPeerReport& r : reports) {
    nlohmann::json p = {{"peer", r.peer_id}, {"alive", r.alive}, {"banned", r.banned}, {"joined", r.joined_s}};
    if (r.completed_s) p["seconds"] = *r.completed_s;
    per_peer.push_back(p);
  }
  const net::BroadcastTally tally = net::Tally(reports);
  broadcast::RelayPlanner::Stats s = origin.Stats(m.version);
  return {{"event", "complete"},
          {"version", m.version},
          {"mode", mode},
          {"bytes", m.total_bytes},
          {"chunks", m.num_chunks()},
          {"peers", tally.held},
          {"dead", tally.dead},
          {"seconds", tally.last_completed_s.value_or(0.0)},
          {"per_peer", per_peer},
          {"transfers", s.verified},
          {"origin_sends", s.origin_sends},
          {"corrupt", s.corrupt},
          {"failed", s.failed},
          {"endgame", s.endgame},
          {"sha256", m.file_sha256},
          {"bytes_pulled", origin.BytesPulled(m.version)},
          {"uplink", nlohmann::json::parse(net::UplinkSummaryJson(origin.uplink()))}};
}

Status WriteTrace(const net::BroadcastOrigin& origin, uint64_t version, const std::string& path) {
  std::string lines;
  for (const net::BroadcastTransferRecord& r : origin.Transfers(version)) {
    lines += nlohmann::json{{"chunk", r.chunk},         {"from", r.from},   {"to", r.to},
                            {"ordered_s", r.ordered_s}, {"reported_s", r.reported_s},
                            {"bytes", r.bytes},         {"result", r.result}}
                 .dump() +
             "\n";
  }
  return WriteFileAtomic(path, lines);
}

int RunOrigin(const OriginArgs& args) {
  InstallSignalHandlers();
  RealClock clock;
  const double started = clock.Now();
  net::BroadcastOriginOptions opts;
  opts.listen = args.listen;
  opts.record_transfers = !args.trace.empty();
  opts.pacing.pace = args.pace;
  if (!ReadTokenFile(args.token_file, &opts.token)) return 2;
  if (args.mode == "star") {
    opts.relay.mode = broadcast::RelayMode::kStar;
  } else if (args.mode != "peer") {
    spdlog::error("--mode {} is invalid; expected peer or star", args.mode);
    return 2;
  }
  const double chunk_bytes = std::round(args.chunk_mib * (1 << 20));
  if (args.chunk_mib != 0 &&
      !(chunk_bytes >= broadcast::kMinChunkBytes && chunk_bytes <= net::kMaxBroadcastChunkBytes)) {
    spdlog::error("--chunk-mib {} is invalid; expected 0 (auto) or {} KiB to {} MiB", args.chunk_mib,
                  broadcast::kMinChunkBytes >> 10, net::kMaxBroadcastChunkBytes >> 20);
    return 2;
  }
  opts.chunk_bytes = static_cast<uint32_t>(chunk_bytes);  // 0: auto
  if (args.upload_slots < 1 || args.upload_slots > 16) {
    spdlog::error("--upload-slots {} is invalid; expected 1 to 16", args.upload_slots);
    return 2;
  }
  opts.relay.upload_slots = args.upload_slots;
  if (!(args.endgame_ratio == 0 || (args.endgame_ratio >= 1 && args.endgame_ratio <= 1000))) {
    spdlog::error("--endgame-ratio {} is invalid; expected 0 (off) or 1 to 1000", args.endgame_ratio);
    return 2;
  }
  opts.relay.endgame_ratio = args.endgame_ratio;
  if (args.transfers_per_slot < 1 || args.transfers_per_slot > 64) {
    spdlog::error("--transfers-per-slot {} is invalid; expected 1 to 64", args.transfers_per_slot);
    return 2;
  }
  opts.relay.max_transfers_per_slot = args.transfers_per_slot;
  if (!(args.start_latency_ms >= 0 && args.start_latency_ms <= 10000)) {
    spdlog::error("--start-latency-ms {} is invalid; expected 0 to 10000", args.start_latency_ms);
    return 2;
  }
  opts.relay.start_latency_seconds = args.start_latency_ms / 1000;
  Result<std::string> blob = ReadFile(args.file);
  if (!blob.ok()) {
    spdlog::error("{}", blob.status().message());
    return 2;
  }
  Result<std::string> delta_base = args.delta_from.empty() ? std::string() : ReadFile(args.delta_from);
  if (!delta_base.ok()) {
    spdlog::error("--delta-from: {}", delta_base.status().message());
    return 2;
  }
  Result<broadcast::SigningKey> key = LoadOrCreateKey(args.key);
  if (!key.ok()) {
    spdlog::error("--key {}: {}", args.key, key.status().message());
    return 2;
  }
  net::BroadcastOrigin origin(opts, key.value(), &clock);
  if (Status st = origin.Start(); !st.ok()) {
    spdlog::error("{}", st.message());
    return 1;
  }
  spdlog::info("waiting for {} peer(s)", args.expect_peers);
  while (!origin.WaitForPeers(args.expect_peers, kPollSeconds)) {
    if (g_stop) return 130;
    if (TimedOut(started, args.timeout, clock)) {
      spdlog::error("only {} of {} peers joined within --timeout {} s", origin.live_peers(), args.expect_peers,
                    args.timeout);
      return 3;
    }
  }
  Result<broadcast::Manifest> m =
      origin.Publish(args.version, blob.value(), args.delta_from.empty() ? nullptr : &delta_base.value());
  if (!m.ok()) {
    spdlog::error("{}", m.status().message());
    return 1;
  }
  bool reported = false;
  while (!g_stop) {
    const bool complete = origin.WaitComplete(args.version, kPollSeconds);
    if (complete && !reported) {
      std::cout << CompletionJson(origin, m.value(), args.mode).dump() << std::endl;
      if (!args.trace.empty()) {
        if (Status st = WriteTrace(origin, args.version, args.trace); !st.ok()) {
          spdlog::error("--trace {}: {}", args.trace, st.message());
          return 1;
        }
      }
      if (args.exit_when_done) break;
    }
    reported = complete;
    if (TimedOut(started, args.timeout, clock) && !complete) {
      spdlog::error("version {} not complete on every peer within --timeout {} s", args.version, args.timeout);
      return 3;
    }
  }
  origin.Shutdown();
  return 0;
}

int RunPeer(const PeerArgs& args) {
  InstallSignalHandlers();
  RealClock clock;
  const double started = clock.Now();
  net::BroadcastPeerOptions opts;
  opts.origin = args.origin;
  if (args.listen.empty() == !args.no_listen) {
    spdlog::error("give exactly one of --listen HOST:PORT and --no-listen");
    return 2;
  }
  opts.listen = args.listen;
  if (!ReadTokenFile(args.token_file, &opts.token)) return 2;
  opts.advertise = args.advertise;
  opts.name = args.name;
  if (args.upload_mbps != 0) {
    if (!(args.upload_mbps * 1e6 / 8 >= net::kMinDeclaredUploadBps &&
          args.upload_mbps * 1e6 / 8 <= net::kMaxDeclaredUploadBps)) {
      spdlog::error("--upload-mbps {} is invalid; expected 0.008 to 100000", args.upload_mbps);
      return 2;
    }
    opts.upload_bps = args.upload_mbps * 1e6 / 8;
    opts.pacing.declared_bps = opts.upload_bps;
  }
  opts.pacing.pace = !args.no_pace;
  if (!args.origin_key.empty()) {
    Result<broadcast::VerifyKey> pinned = broadcast::VerifyKey::LoadPem(args.origin_key);
    if (!pinned.ok()) {
      spdlog::error("--origin-key {}: {}", args.origin_key, pinned.status().message());
      return 2;
    }
    opts.origin_key = pinned.value();
  }
  net::BroadcastPeer peer(opts);
  if (!args.have.empty()) {
    Result<std::string> have = ReadFile(args.have);
    Status st = have.ok() ? peer.AddBase(have.value()) : have.status();
    if (!st.ok()) {
      spdlog::error("--have {}: {}", args.have, st.message());
      return 2;
    }
  }
  if (Status st = peer.Start(); !st.ok()) {
    spdlog::error("{}", st.message());
    return st.code() == StatusCode::kUnavailable ? 1 : 2;
  }
  uint64_t next = 1;
  uint64_t written = 0;
  while (!g_stop) {
    if (TimedOut(started, args.timeout, clock)) {
      spdlog::error("no complete version within --timeout {} s", args.timeout);
      return 3;
    }
    if (written > 0 && args.exit_when_done) {
      if (peer.WaitForSwarmComplete(written, kPollSeconds) || peer.origin_gone()) break;
      continue;
    }
    std::optional<uint64_t> v = peer.WaitForVersion(next, kPollSeconds);
    if (!v) {
      if (peer.origin_gone()) break;
      continue;
    }
    Result<broadcast::Manifest> m = peer.store().GetManifest(*v);
    Status st = m.ok() ? peer.store().WriteVersion(*v, args.out) : m.status();
    if (!st.ok()) {
      spdlog::error("writing version {} to {}: {}", *v, args.out, st.message());
      return 1;
    }
    nlohmann::json line = {{"bytes", m->total_bytes}, {"seconds", clock.Now() - started},
                           {"sha256", m->file_sha256}, {"version", *v}, {"peer", peer.peer_id()},
                           {"bytes_received", peer.bytes_received()}};
    std::cout << line.dump() << std::endl;
    written = *v;
    next = *v + 1;
  }
  std::cout << nlohmann::json{{"event", "exit"},
                              {"peer", peer.peer_id()},
                              {"bytes_received", peer.bytes_received()},
                              {"uplink", nlohmann::json::parse(net::UplinkSummaryJson(peer.uplink()))}}
                   .dump()
            << std::endl;
  peer.Shutdown();
  if (written == 0) {
    spdlog::error("left before receiving a complete version");
    return 1;
  }
  return 0;
}

}  // namespace

void AddBroadcastCommand(CLI::App& app, int* exit_code) {
  CLI::App* cmd = app.add_subcommand("broadcast", "move a file to many hosts: peer-assisted, pipelined, signed");
  cmd->require_subcommand(1);

  auto o = std::make_shared<OriginArgs>();
  CLI::App* origin = cmd->add_subcommand("origin", "publish a file as a signed snapshot and coordinate its broadcast");
  origin->add_option("--file", o->file, "the file to publish")->required();
  origin->add_option("--listen", o->listen, "HOST:PORT to serve peers on")->required();
  origin->add_option("--key", o->key, "Ed25519 private key (PEM); generated there if missing")->capture_default_str();
  origin->add_option("--mode", o->mode, "peer (peer-assisted) or star (origin sends everything)")->capture_default_str();
  origin->add_option("--chunk-mib", o->chunk_mib,
                     "chunk size in MiB; 0 = auto (about 1024 chunks, a power of two from 1 to 64 MiB)")
      ->capture_default_str();
  origin->add_option("--expect-peers", o->expect_peers, "publish once this many peers joined")->capture_default_str();
  origin->add_option("--upload-slots", o->upload_slots, "concurrent uploads per node (peer mode)")->capture_default_str();
  origin->add_option("--endgame-ratio", o->endgame_ratio,
                     "duplicate a chunk in flight from a slow sender (over 1 s per chunk) this many times slower "
                     "(measured) than an idle uploader; 0 = off")
      ->capture_default_str();
  origin->add_option("--transfers-per-slot", o->transfers_per_slot,
                     "transfers smaller than a chunk (deltas) one upload slot holds at once, at most; 1 = one")
      ->capture_default_str();
  origin->add_option("--start-latency-ms", o->start_latency_ms,
                     "time a transfer takes to start (outcome, next order, fetch request: ~1.5 round trips); "
                     "each node queues enough transfers to cover it")
      ->capture_default_str();
  origin->add_option("--version", o->version, "snapshot version number")->capture_default_str();
  origin->add_option("--token-file", o->token_file, "bearer token peers must present (default: none)");
  origin->add_flag("--exit-when-done", o->exit_when_done, "exit once every live peer holds the file");
  origin->add_option("--delta-from", o->delta_from,
                     "also offer the file as deltas against this older file (peers started with --have it pull those)");
  origin->add_option("--timeout", o->timeout, "give up (exit 3) after this many seconds; 0 = never")->capture_default_str();
  origin->add_option("--trace", o->trace, "once complete, write one JSON line per transfer here (who sent what when)");
  origin->add_flag("--pace", o->pace,
                   "pace uploads as peers do (off: the origin downloads nothing, and a pace under its line rate "
                   "bounds the broadcast); its uplink is estimated and reported either way");
  origin->callback([o, exit_code] { *exit_code = RunOrigin(*o); });

  auto p = std::make_shared<PeerArgs>();
  CLI::App* peer = cmd->add_subcommand("peer", "join an origin, receive and relay, write the verified file");
  peer->add_option("--origin", p->origin, "origin HOST:PORT")->required();
  peer->add_option("--listen", p->listen, "HOST:PORT to serve chunks to other peers on (or --no-listen)");
  peer->add_flag("--no-listen", p->no_listen,
                 "serve nothing (behind NAT): receive by dialling out only, never asked to relay");
  peer->add_option("--out", p->out, "where to write the verified file (atomically)")->required();
  peer->add_option("--origin-key", p->origin_key, "pin the origin's public key (PEM); default: trust on first use");
  peer->add_option("--advertise", p->advertise, "HOST:PORT other peers dial (default: --listen's host and port)");
  peer->add_option("--name", p->name, "name in the origin's logs and report")->capture_default_str();
  peer->add_option("--token-file", p->token_file, "bearer token for the origin (fetches from other peers carry the origin's tickets)");
  peer->add_flag("--exit-when-done", p->exit_when_done, "exit once the origin says every peer holds the file");
  peer->add_option("--upload-mbps", p->upload_mbps,
                   "this host's upload rate, Mbit/s: the origin's first estimate until it measures one, and "
                   "uploads are paced to 95% of it (0 = not declared: the origin starts at 100, and the pace is "
                   "found from the sockets)")
      ->capture_default_str();
  peer->add_flag("--no-pace", p->no_pace, "never pace uploads (a link whose router already sends ACKs first)");
  peer->add_option("--have", p->have, "a file this peer holds already (the origin's --delta-from): pull only deltas");
  peer->add_option("--timeout", p->timeout, "give up (exit 3) after this many seconds; 0 = never")->capture_default_str();
  peer->callback([p, exit_code] { *exit_code = RunPeer(*p); });
}

}  // namespace echelon::cli
