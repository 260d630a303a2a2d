#include "echelon/common/process.h"

#include <fstream>
#include <limits>
#include <string>

namespace echelon {
namespace {

// A "Key: N kB" line of /proc/self/status, in MiB.
double StatusMb(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string word;
  while (in >> word) {
    if (word == key) {
      double kib = 0;
      if (in >> kib) return kib / 1024.0;
      break;
    }
    in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return std::numeric_limits<double>::quiet_NaN();
}

}  // namespace

double ResidentSetMb() { return StatusMb("VmRSS:"); }
double PeakResidentSetMb() { return StatusMb("VmHWM:"); }

bool ResetPeakResidentSet() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return static_cast<bool>(clear);
}

}  // namespace echelon
