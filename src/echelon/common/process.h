// Facts about this process that metrics report.
//
// Thread contract: free functions, safe from any thread.
#pragma once

namespace echelon {

// Resident set size in MiB now (VmRSS of /proc/self/status) and its peak so far (VmHWM);
// NaN where they cannot be read.
double ResidentSetMb();
double PeakResidentSetMb();

}  // namespace echelon
