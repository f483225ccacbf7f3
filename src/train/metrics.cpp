#include "train/metrics.h"

#include <unistd.h>

#include <chrono>
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/error.h"
#include "runtime/input_file.h"
#include "train/tensorboard_writer.h"

namespace qshard {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string metrics_json_line(const StepMetrics& m) {
  nlohmann::ordered_json j;
  j["step"] = m.step;
  j["loss"] = m.loss;
  if (m.eval_loss) j["eval_loss"] = *m.eval_loss;
  j["lr"] = m.lr;
  j["grad_norm"] = m.grad_norm;
  j["tokens_per_s"] = m.tokens_per_s;
  j["target_tokens_per_s"] = m.target_tokens_per_s;
  j["step_time_s"] = m.step_time_s;
  j["peak_mem_bytes"] = m.peak_mem_bytes;
  if (m.peak_gpu_mem_bytes) j["peak_gpu_mem_bytes"] = *m.peak_gpu_mem_bytes;
  if (m.mfu) j["mfu"] = *m.mfu;
  j["elapsed_s"] = m.elapsed_s;
  return j.dump();  // a NaN loss is written as null
}

std::vector<TfScalar> tensorboard_scalars(const std::string& json_line) {
  const auto j = nlohmann::ordered_json::parse(json_line);
  std::vector<TfScalar> out;
  for (const auto& [key, value] : j.items()) {
    if (key == "step") continue;
    if (value.is_number()) out.push_back({key, value.get<float>()});
    else if (value.is_null()) out.push_back({key, std::nanf("")});
  }
  return out;
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const auto t = static_cast<int64_t>(std::llround(s));
  if (t < 60) return fmt::format("{}s", t);
  if (t < 3600) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}h{:02}m", t / 3600, (t % 3600) / 60);
}

std::string format_bytes(int64_t b) {
  if (b < 1024) return fmt::format("{} B", b);
  const char* units[] = {"KB", "MB", "GB", "TB"};
  double v = static_cast<double>(b) / 1024.0;
  int u = 0;
  while (v >= 1024.0 && u < 3) v /= 1024.0, ++u;
  return fmt::format("{:.1f} {}", v, units[u]);
}

std::string progress_bar(int64_t step, int64_t total, int width) {
  const int64_t filled = total > 0 ? std::min<int64_t>(width, step * width / total) : 0;
  return "[" + std::string(static_cast<size_t>(filled), '#') + std::string(static_cast<size_t>(width - filled), '.') +
         "] ";
}

std::string progress_line(const StepMetrics& m, int64_t total) {
  std::string s = fmt::format("step {}/{} | loss {:.4f}", m.step, total, m.loss);
  if (m.eval_loss) s += fmt::format(" | eval {:.4f}", *m.eval_loss);
  const double eta = m.step > 0 ? m.elapsed_s / static_cast<double>(m.step) * static_cast<double>(total - m.step) : -1;
  s += fmt::format(" | lr {:.1e} | grad {:.2f} | {:.0f} tok/s ({:.0f} target) | {:.2f} s/step | mem {}", m.lr,
                   m.grad_norm, m.tokens_per_s, m.target_tokens_per_s, m.step_time_s, format_bytes(m.peak_mem_bytes));
  if (m.peak_gpu_mem_bytes) s += fmt::format(" | gpu {}", format_bytes(*m.peak_gpu_mem_bytes));
  if (m.mfu) s += fmt::format(" | mfu {:.1f}%", *m.mfu * 100.0);
  s += fmt::format(" | eta {}", format_duration(eta));
  return s;
}

MetricsLogger::MetricsLogger(const std::string& jsonl_path, int64_t total_steps, bool append, std::FILE* out)
    : path_(jsonl_path), out_(out), tty_(out != nullptr && ::isatty(::fileno(out)) == 1), total_steps_(total_steps),
      start_(now_s()) {
  if (path_.empty()) return;
  const auto parent = std::filesystem::path(path_).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  check_output_file(path_, "metrics log (logging.metrics_jsonl)");
  file_ = std::fopen(path_.c_str(), append ? "a" : "w");
  if (file_ == nullptr) throw InputError(fmt::format("{}: cannot open metrics file: {}", path_, std::strerror(errno)));
}

MetricsLogger::~MetricsLogger() {
  if (file_ != nullptr) std::fclose(file_);
}

std::string MetricsLogger::open_tensorboard(const std::string& dir, int64_t first_step) {
  tensorboard_ = std::make_unique<TensorBoardWriter>(dir, first_step);
  return tensorboard_->path();
}

double MetricsLogger::elapsed_s() const { return now_s() - start_; }

void MetricsLogger::log(StepMetrics m) {
  if (m.elapsed_s == 0.0) m.elapsed_s = elapsed_s();
  const std::string json = metrics_json_line(m);
  if (file_ != nullptr) {
    const std::string line = json + "\n";
    if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0)
      throw InputError(fmt::format("{}: writing metrics failed: {}", path_, std::strerror(errno)));
  }
  if (tensorboard_) tensorboard_->write_scalars(m.step, unix_time_s(), tensorboard_scalars(json));
  if (out_ != nullptr) {
    const std::string line = (tty_ ? progress_bar(m.step, total_steps_) : std::string()) + progress_line(m, total_steps_);
    std::fprintf(out_, "%s\n", line.c_str());
    std::fflush(out_);
  }
}

}  // namespace qshard
