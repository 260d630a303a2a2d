// What publishing a snapshot costs the origin, before a byte moves: BroadcastOrigin::Publish of a
// bf16 safetensors blob whole (version 1), then of the next version as deltas against it
// (delta_from_previous, as a run publishes), each against one SHA-256 pass over the blob
// measured in the same run (so the ratio says how many passes over the model a publish costs,
// whatever the machine's speed). The next version moves --delta of the elements by one bf16 step
// (the netns bench's delta files, built in memory).
//
//   broadcast_publish_bench --mib 1024 --delta 0.02 [--threads N]
//
// Prints one JSON line: seconds of one SHA-256 pass, of each publish, the ratios, the deltas'
// bytes and the number of chunks.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "echelon/common/sha256.h"
#include "echelon/net/broadcast_origin.h"

namespace {

double Seconds(const std::chrono::steady_clock::time_point& t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A safetensors file holding one BF16 tensor of `mib` MiB (weights ~ N(0, 0.02)), and the same
// file with `fraction` of its elements moved one bf16 step up or down.
std::pair<std::string, std::string> Snapshots(int mib, double fraction) {
  const uint64_t n = ((static_cast<uint64_t>(mib) << 20) / 2) - 64;
  std::string header = nlohmann::json{{"w", {{"dtype", "BF16"}, {"shape", {n}}, {"data_offsets", {0, n * 2}}}}}.dump();
  header.append((8 - (8 + header.size()) % 8) % 8, ' ');
  std::string base(8 + header.size() + n * 2, '\0');
  const uint64_t header_size = header.size();
  std::memcpy(base.data(), &header_size, 8);
  std::memcpy(base.data() + 8, header.data(), header.size());
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  char* data = base.data() + 8 + header.size();
  for (uint64_t i = 0; i < n; ++i) {
    const float w = normal(rng);
    uint32_t bits;
    std::memcpy(&bits, &w, 4);
    const uint16_t bf16 = static_cast<uint16_t>(bits >> 16);
    std::memcpy(data + 2 * i, &bf16, 2);
  }
  std::string next = base;
  char* out = next.data() + 8 + header.size();
  std::uniform_int_distribution<uint64_t> pick(0, n - 1);
  const uint64_t moved = static_cast<uint64_t>(fraction * static_cast<double>(n));
  for (uint64_t k = 0; k < moved; ++k) {
    const uint64_t i = pick(rng);
    uint16_t v;
    std::memcpy(&v, out + 2 * i, 2);
    v = static_cast<uint16_t>(v + ((rng() & 1) ? 1 : -1));
    std::memcpy(out + 2 * i, &v, 2);
  }
  return {std::move(base), std::move(next)};
}

}  // namespace

int main(int argc, char** argv) {
  using namespace echelon;
  CLI::App app{"origin publish cost: whole and as deltas, against one SHA-256 pass"};
  int mib = 512;
  double fraction = 0.02;
  int threads = 0;
  app.add_option("--mib", mib, "snapshot size, MiB")->check(CLI::Range(1, 1 << 16));
  app.add_option("--delta", fraction, "fraction of elements the next version moves")->check(CLI::Range(0.0, 1.0));
  app.add_option("--threads", threads, "hashing and delta threads (0 = one per core)")->check(CLI::Range(0, 1024));
  CLI11_PARSE(app, argc, argv);

  auto [base, next] = Snapshots(mib, fraction);
  auto t0 = std::chrono::steady_clock::now();
  const std::string digest = Sha256Hex(next);
  const double sha_s = Seconds(t0);

  net::BroadcastOriginOptions options;
  options.delta_from_previous = true;
  options.log_each_version = false;
  options.threads = threads;
  RealClock clock;
  Result<broadcast::SigningKey> key = broadcast::SigningKey::Generate();
  if (!key.ok()) {
    std::fprintf(stderr, "%s\n", key.status().message().c_str());
    return 1;
  }
  net::BroadcastOrigin origin(options, std::move(key).value(), &clock);
  t0 = std::chrono::steady_clock::now();
  Result<broadcast::Manifest> whole = origin.Publish(1, base);
  const double whole_s = Seconds(t0);
  t0 = std::chrono::steady_clock::now();
  Result<broadcast::Manifest> delta = origin.Publish(2, next);
  const double delta_s = Seconds(t0);
  if (!whole.ok() || !delta.ok()) {
    std::fprintf(stderr, "publish failed: %s\n", (whole.ok() ? delta.status() : whole.status()).message().c_str());
    return 1;
  }
  if (delta->file_sha256 != digest) {
    std::fprintf(stderr, "the delta version's digest is not the file's\n");
    return 1;
  }
  uint64_t delta_bytes = 0;
  for (uint64_t d : delta->delta_bytes) delta_bytes += d;
  nlohmann::json line{{"mib", mib},
                      {"delta_fraction", fraction},
                      {"sha256_pass_s", sha_s},
                      {"publish_whole_s", whole_s},
                      {"publish_delta_s", delta_s},
                      {"whole_in_sha_passes", whole_s / sha_s},
                      {"delta_in_sha_passes", delta_s / sha_s},
                      {"delta_bytes", delta_bytes},
                      {"delta_of_file", static_cast<double>(delta_bytes) / static_cast<double>(next.size())},
                      {"chunks", delta->num_chunks()}};
  std::printf("%s\n", line.dump().c_str());
  return 0;
}
