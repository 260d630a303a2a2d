#include "echelon/common/version.h"

namespace echelon {

const char* Version() { return ECHELON_VERSION; }

}  // namespace echelon
