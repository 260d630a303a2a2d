// Facts about this process that metrics report.
//
// Thread contract: free functions, safe from any thread.
#pragma once

namespace echelon {

// Resident set size in MiB now (VmRSS of /proc/self/status) and its peak so far (VmHWM);
// NaN where they cannot be read.
double ResidentSetMb();
double PeakResidentSetMb();
// Starts the peak (VmHWM) over from the resident set now (Linux's /proc/self/clear_refs "5"),
// so a benchmark measures one phase's peak; false where the kernel does not allow it.
bool ResetPeakResidentSet();

}  // namespace echelon
