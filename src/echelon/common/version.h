// Which build this is: the release version (CMake's project version) and `git describe` of the
// source tree it was built from ("unknown" outside a git checkout). `echelon --version` prints
// both with the LibTorch version; every run records them in its config.yaml.
#pragma once

namespace echelon {

const char* Version();      // "0.3.0"
const char* GitDescribe();  // "91ba92d", "v0.3.0-4-g91ba92d-dirty", or "unknown"

}  // namespace echelon
