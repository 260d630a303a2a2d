// WorkItem: one hand-out of a prompt group under a lease (sched/dispatcher.h makes them; an
// actor carries one through contract/transport.h). Kept apart so the transport contract does
// not include the dispatcher.
//
// Thread contract: a plain value.
#pragma once

#include <cstdint>

namespace echelon::sched {

struct WorkItem {
  uint64_t group_id = 0;
  uint64_t lease_id = 0;
  int64_t dispatch_version = 0;  // learner version when handed out
  bool reissue = false;          // this group was handed out before
};

}  // namespace echelon::sched
