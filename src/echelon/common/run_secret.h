// RunSecret: 32 bytes only the learner holds, from which every draw a worker must not know
// before its work arrives is derived: each group's sampling seed (contract/group_seed.h, sent
// with the group's assignment), poker's training deals and an environment's training episode
// seeds (the task option `secret`). Draw is HMAC-SHA256 keyed by the secret, so the values a
// worker sees (its groups' seeds) tell it nothing about the key or about any other group's.
//
//   RunSecret s = RunSecret::Random();                 // or FromSeed(seed): reproducible, public
//   uint64_t group_seed = s.Draw("group", group_id);
//   task_options["secret"] = s.Hex();                  // the learner's own adapter only
//
// A learner keeps its secret in the run directory (learn/learner_run.h) so a resumed run draws on
// from where it stopped.
//
// Thread contract: an immutable value; Random reads the OS's generator.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "echelon/common/status.h"

namespace echelon {

class RunSecret {
 public:
  RunSecret() = default;  // all zero bytes: FromSeed's kind of secret, for tests of one component
  // 32 bytes from the OS's generator.
  static Result<RunSecret> Random();
  // Derived from a run seed: a run with the same seed draws the same values, and so can anyone
  // who knows the seed (the `secret: seed` setting, for reproducible runs).
  static RunSecret FromSeed(uint64_t seed);
  // 64 hex characters, as Hex writes them; errors name `where`.
  static Result<RunSecret> FromHex(std::string_view hex, const std::string& where);

  std::string Hex() const;
  // The 64-bit value of (purpose, index): the first 8 bytes of HMAC-SHA256(secret, purpose || index).
  uint64_t Draw(std::string_view purpose, uint64_t index) const;

  bool operator==(const RunSecret& o) const { return key_ == o.key_; }
  bool operator!=(const RunSecret& o) const { return key_ != o.key_; }

 private:
  std::array<unsigned char, 32> key_{};
};

}  // namespace echelon
