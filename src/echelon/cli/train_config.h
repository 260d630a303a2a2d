// The schema of a training config (every key, its default, range and why), read into the typed
// learn::RunOptions. `echelon train --help` prints the table.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "echelon/common/config.h"
#include "echelon/learn/run_options.h"

namespace echelon::cli {

const ConfigSchema& TrainSchema();

using learn::RunOptions;

Result<RunOptions> RunOptionsFromConfig(const Config& cfg);

}  // namespace echelon::cli
