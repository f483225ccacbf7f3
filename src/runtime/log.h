// log.h: rank-prefixed logging on top of spdlog.
//
// Every line reads "[HH:MM:SS.mmm] [rank R] [level] message". set_log_rank() is called once by
// the World after MPI is up; before that the rank prints as "-". Logging goes to stderr so that
// stdout stays free for command output (JSON, tables). Thread safe (spdlog's _mt sink).
#pragma once

#include <spdlog/spdlog.h>

namespace qshard {

spdlog::logger& logger();
void set_log_rank(int rank);
// "trace" | "debug" | "info" | "warn" | "error" | "off"; unknown names throw InputError.
void set_log_level(const std::string& level);

}  // namespace qshard

#define QS_LOG_INFO(...) ::qshard::logger().info(__VA_ARGS__)
#define QS_LOG_WARN(...) ::qshard::logger().warn(__VA_ARGS__)
#define QS_LOG_ERROR(...) ::qshard::logger().error(__VA_ARGS__)
#define QS_LOG_DEBUG(...) ::qshard::logger().debug(__VA_ARGS__)
