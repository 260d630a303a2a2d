#include "echelon/common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace echelon {

void InitLogging(const std::string& level) {
  auto logger = spdlog::stderr_color_mt("echelon");
  logger->set_pattern("%^[%H:%M:%S.%e %L]%$ %v");
  logger->set_level(spdlog::level::from_str(level));
  spdlog::set_default_logger(logger);
}

}  // namespace echelon
