#include "runtime/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include "runtime/error.h"

namespace qshard {
namespace {
std::shared_ptr<spdlog::logger> make_logger() {
  auto l = std::make_shared<spdlog::logger>("qshard", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  l->set_pattern("[%H:%M:%S.%e] [rank -] [%l] %v");
  return l;
}
}  // namespace

spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> l = make_logger();
  return *l;
}

void set_log_rank(int rank) {
  logger().set_pattern("[%H:%M:%S.%e] [rank " + std::to_string(rank) + "] [%l] %v");
}

void set_log_level(const std::string& level) {
  auto lv = spdlog::level::from_str(level);
  if (lv == spdlog::level::off && level != "off")
    throw InputError("log level '" + level + "' is not one of trace, debug, info, warn, error, off");
  logger().set_level(lv);
}

}  // namespace qshard
