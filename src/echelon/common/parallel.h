// ParallelFor: runs fn(i) for every i in [0, n) on a few short-lived threads and returns the
// error of the lowest failing index (the one a serial loop would have returned first), or Ok.
// For coarse, independent work items (hashing or encoding a chunk each): every item costs
// milliseconds, so plain threads and one atomic counter are enough and nothing is pooled.
//
//   ECHELON_RETURN_IF_ERROR(ParallelFor(m.num_chunks(), threads, [&](size_t i) -> Status {
//     hashes[i] = Sha256Hex(ChunkView(m, blob, i));   // fn writes only its own slot
//     return Status::Ok();
//   }));
//
// threads: 0 = one per core; never more threads than items; 1 runs inline on the caller.
// After a failure the remaining items are skipped (items already started finish).
//
// Thread contract: fn is called concurrently from several threads, each index exactly once
// (or not at all after a failure); ParallelFor returns when every call has returned.
#pragma once

#include <cstddef>
#include <functional>

#include "echelon/common/status.h"

namespace echelon {

// The number of threads ParallelFor runs for `threads` (0: one per core) and n items.
int ParallelThreads(int threads, size_t n);

Status ParallelFor(size_t n, int threads, const std::function<Status(size_t)>& fn);

}  // namespace echelon
