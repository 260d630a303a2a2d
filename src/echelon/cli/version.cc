#include <torch/version.h>

#include "echelon/cli/commands.h"
#include "echelon/common/version.h"

namespace echelon::cli {

std::string VersionLine() {
  return std::string("echelon ") + Version() + " (git " + GitDescribe() + ", LibTorch " + TORCH_VERSION + ")";
}

}  // namespace echelon::cli
