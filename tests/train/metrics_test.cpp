#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/test_util.h"
#include "train/metrics.h"

namespace qshard {
namespace {

using testing_util::read_bytes;
using testing_util::TempDir;

TEST(Metrics, JsonLineFormat) {
  StepMetrics m;
  m.step = 12;
  m.loss = 3.25;
  m.lr = 3e-4;
  m.grad_norm = 1.5;
  m.tokens_per_s = 1234.5;
  m.target_tokens_per_s = 617.25;  // prompt tokens masked: half the tokens are loss targets
  m.step_time_s = 0.5;
  m.peak_mem_bytes = 12345678;
  m.elapsed_s = 83.25;
  EXPECT_EQ(metrics_json_line(m),
            R"({"step":12,"loss":3.25,"lr":0.0003,"grad_norm":1.5,"tokens_per_s":1234.5,"target_tokens_per_s":617.25,)"
            R"("step_time_s":0.5,"peak_mem_bytes":12345678,"elapsed_s":83.25})");
  m.eval_loss = 3.5;
  m.peak_gpu_mem_bytes = 2000000000;
  m.mfu = 0.25;
  EXPECT_EQ(metrics_json_line(m),
            R"({"step":12,"loss":3.25,"eval_loss":3.5,"lr":0.0003,"grad_norm":1.5,"tokens_per_s":1234.5,)"
            R"("target_tokens_per_s":617.25,"step_time_s":0.5,"peak_mem_bytes":12345678,"peak_gpu_mem_bytes":2000000000,"mfu":0.25,)"
            R"("elapsed_s":83.25})");
}

TEST(Metrics, ProgressLine) {
  StepMetrics m;
  m.step = 12;
  m.loss = 3.12344;
  m.lr = 3e-4;
  m.grad_norm = 1.234;
  m.tokens_per_s = 1234.4;
  m.target_tokens_per_s = 1.4;  // chat data: few loss targets among the tokens processed
  m.peak_mem_bytes = static_cast<int64_t>(12.3 * 1024 * 1024);
  m.step_time_s = 0.4441;
  m.elapsed_s = 12 * 0.4441;  // eta = 188 * 0.4441 s = 83.5 s
  EXPECT_EQ(progress_line(m, 200),
            "step 12/200 | loss 3.1234 | lr 3.0e-04 | grad 1.23 | 1234 tok/s (1 target) | 0.44 s/step | mem 12.3 MB | "
            "eta 1m23s");
  m.eval_loss = 3.21;
  EXPECT_NE(progress_line(m, 200).find("loss 3.1234 | eval 3.2100 | lr"), std::string::npos);
  m.peak_gpu_mem_bytes = int64_t{20} << 30;
  m.mfu = 0.4123;
  EXPECT_NE(progress_line(m, 200).find("| mem 12.3 MB | gpu 20.0 GB | mfu 41.2% | eta 1m23s"), std::string::npos);
  EXPECT_EQ(format_duration(45), "45s");
  EXPECT_EQ(format_duration(3600 * 2 + 5 * 60 + 3), "2h05m");
  EXPECT_EQ(format_duration(-1), "?");
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.5 KB");
  EXPECT_EQ(format_bytes(int64_t{3} << 30), "3.0 GB");
  EXPECT_EQ(progress_bar(5, 20, 10), "[##........] ");
  EXPECT_EQ(progress_bar(20, 20, 10), "[##########] ");
}

TEST(Metrics, LoggerWritesJsonlAndProgress) {
  TempDir dir;
  const std::string path = dir.file("runs/x/metrics.jsonl");  // parent directories are created
  std::FILE* out = std::tmpfile();
  {
    MetricsLogger log(path, 100, false, out);
    StepMetrics m;
    m.step = 1;
    m.loss = 5.0;
    m.elapsed_s = 1.0;
    log.log(m);
    m.step = 2;
    m.eval_loss = 4.0;
    m.elapsed_s = 0.0;  // filled in by the logger
    log.log(m);
  }
  {
    MetricsLogger log(path, 100, /*append=*/true, nullptr);
    StepMetrics m;
    m.step = 3;
    log.log(m);
  }
  const std::string text = read_bytes(path);
  std::vector<nlohmann::json> lines;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t e = text.find('\n', pos);
    lines.push_back(nlohmann::json::parse(text.substr(pos, e - pos)));
    pos = e + 1;
  }
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["step"], 1);
  EXPECT_FALSE(lines[0].contains("eval_loss"));
  EXPECT_EQ(lines[1]["eval_loss"], 4.0);
  EXPECT_GE(lines[1]["elapsed_s"].get<double>(), 0.0);
  EXPECT_EQ(lines[2]["step"], 3);
  std::rewind(out);
  char buf[512] = {};
  ASSERT_NE(std::fgets(buf, sizeof(buf), out), nullptr);
  EXPECT_EQ(std::string(buf).rfind("step 1/100 | loss 5.0000", 0), 0u);  // a file, not a tty: no bar
  std::fclose(out);
}

}  // namespace
}  // namespace qshard
