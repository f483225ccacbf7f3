#include <gtest/gtest.h>

#include "runtime/error.h"
#include "common/test_util.h"
#include "train/bench.h"
#include "train/config_reference.h"
#include "train/train_config.h"

namespace qshard {
namespace {

using testing_util::error_of;
using testing_util::TempDir;


constexpr const char* kMinimal = R"(
data:
  train: build/data/x.tok
optimizer:
  lr: 1.0e-3
)";

TEST(TrainConfig, DefaultsAndYamlValues) {
  const TrainConfig c = parse_train_config(kMinimal, "x.yaml");
  EXPECT_EQ(c.data.train, "build/data/x.tok");
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-3);
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.999);  // default kept
  EXPECT_EQ(c.lora.target_modules.size(), 7u);
  EXPECT_EQ(c.model.quant_type, QuantType::kNf4);
  EXPECT_NO_THROW(c.validate(1));
}

TEST(TrainConfig, UnknownKeySuggestsNearest) {
  const std::string msg = error_of([] { parse_train_config("optimizer:\n  lrr: 0.1\n", "configs/x.yaml"); });
  EXPECT_EQ(msg, "configs/x.yaml: unknown key 'optimizer.lrr' (did you mean 'optimizer.lr'?)");
  // A leaf in the wrong section suggests where it lives.
  EXPECT_NE(error_of([] { parse_train_config("lr: 0.1\n", "x.yaml"); }).find("did you mean 'optimizer.lr'"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_train_config("optimiser:\n  lr: 0.1\n", "x.yaml"); }).find("unknown key 'optimiser'"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_train_config("model:\n  init:\n    hiden_size: 3\n", "x.yaml"); })
                .find("did you mean 'model.init.hidden_size'"),
            std::string::npos);
}

TEST(TrainConfig, OneDocumentFromARegularFile) {
  // A second YAML document would be dropped without a word: refused.
  EXPECT_NE(error_of([] { parse_train_config("steps: 3\n---\nsteps: 4\n", "two.yaml"); })
                .find("two.yaml: holds 2 YAML documents"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_train_config("---\nsteps: 3\n...\n# c\nsteps: 4\n", "e.yaml"); })
                .find("holds 2 YAML documents"),
            std::string::npos);
  // One document with an explicit start, a directive, comments, a block scalar: accepted.
  EXPECT_EQ(parse_train_config("%YAML 1.2\n# c\n---\nsteps: 3  # x\nmodel:\n  path: |\n    ---x\n", "one.yaml").steps, 3);
  TempDir dir;
  EXPECT_NE(error_of([&] { load_train_config(dir.file("")); }).find("is a folder"), std::string::npos);
  EXPECT_NE(error_of([] { load_train_config("/dev/zero"); }).find("/dev/zero is a character device"),
            std::string::npos);
}

TEST(TrainConfig, SetOverrides) {
  const TrainConfig c = parse_train_config(
      kMinimal, "x.yaml",
      {"optimizer.lr=5e-4", "lora.r=16", "lora.target_modules=[q_proj, v_proj]", "model.double_quant=false",
       "schedule.type=linear", "data.train=other.tok", "device=cuda"});
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 5e-4);
  EXPECT_EQ(c.lora.r, 16);
  EXPECT_EQ(c.lora.target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_FALSE(c.model.double_quant);
  EXPECT_EQ(c.schedule.type, ScheduleType::kLinear);
  EXPECT_EQ(c.data.train, "other.tok");
  EXPECT_EQ(c.device, DeviceChoice::kCuda);
  EXPECT_EQ(error_of([] { parse_train_config(kMinimal, "x.yaml", {"optimizer.lrr=1"}); }),
            "--set optimizer.lrr=1: unknown key 'optimizer.lrr' (did you mean 'optimizer.lr'?)");
  EXPECT_NE(error_of([] { parse_train_config(kMinimal, "x.yaml", {"optimizer.lr"}); }).find("expected key=value"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_train_config(kMinimal, "x.yaml", {"optimizer=1"}); }).find("is a section"),
            std::string::npos);
}

TEST(TrainConfig, TypeErrorsNameKeyAndValue) {
  EXPECT_EQ(error_of([] { parse_train_config("optimizer:\n  lr: fast\n", "x.yaml"); }),
            "x.yaml: key 'optimizer.lr': expected a number, got 'fast'");
  EXPECT_EQ(error_of([] { parse_train_config("lora:\n  r: 8.5\n", "x.yaml"); }),
            "x.yaml: key 'lora.r': expected an integer, got '8.5'");
  // YAML nested 100k deep: yaml-cpp's depth guard, named as such (its own message is "bad file").
  EXPECT_NE(error_of([] { parse_train_config("x: " + std::string(100000, '[') + std::string(100000, ']') + "\n", "x.yaml"); })
                .find("x.yaml: YAML nested more than"),
            std::string::npos);
  // Integers in base 10, as on the command line: YAML 1.1's octal and hex are refused, not read as 8 / 16.
  EXPECT_EQ(error_of([] { parse_train_config("lora:\n  r: 0x10\n", "x.yaml"); }),
            "x.yaml: key 'lora.r': expected an integer, got '0x10'");
  EXPECT_EQ(error_of([] { parse_train_config(kMinimal, "x.yaml", {"steps=010"}); }),
            "--set steps=010: key 'steps': expected an integer without a leading 0 (YAML reads 010 as octal 8), got '010'");
  EXPECT_EQ(error_of([] { parse_train_config("model:\n  double_quant: maybe\n", "x.yaml"); }),
            "x.yaml: key 'model.double_quant': expected true or false, got 'maybe'");
  EXPECT_EQ(error_of([] { parse_train_config("schedule:\n  type: cosine\n", "x.yaml"); }),
            "x.yaml: key 'schedule.type': expected one of warmup_cosine, linear, constant, got 'cosine'");
  EXPECT_EQ(error_of([] { parse_train_config("lora:\n  target_modules: q_proj\n", "x.yaml"); }),
            "x.yaml: key 'lora.target_modules': expected a list of strings, got 'q_proj'");
  EXPECT_EQ(error_of([] { parse_train_config("optimizer: 3\n", "x.yaml"); }),
            "x.yaml: key 'optimizer' is a section: expected a mapping");
  EXPECT_EQ(error_of([] { parse_train_config("optimizer:\n  lr: 1\n  lr: 2\n", "x.yaml"); }),
            "x.yaml: duplicate key 'optimizer.lr'");
  EXPECT_EQ(error_of([] { parse_train_config(kMinimal, "x.yaml", {"optimizer.lr=abc"}); }),
            "--set optimizer.lr=abc: key 'optimizer.lr': expected a number, got 'abc'");
  EXPECT_NE(error_of([] { parse_train_config("optimizer: [1, \n", "bad.yaml"); }).find("bad.yaml: not valid YAML"),
            std::string::npos);
}

// YAML's "\0" escape puts a NUL in a string; as a path it was cut there ("x.tok\0junk" read x.tok).
TEST(TrainConfig, StringsWithNulAreRefused) {
  EXPECT_EQ(error_of([] { parse_train_config("data:\n  train: \"x.tok\\0junk\"\n", "x.yaml"); }),
            "x.yaml: key 'data.train': expected a string without a NUL character (\\0), got 'x.tok\\0junk'");
  EXPECT_EQ(error_of([] { parse_train_config(kMinimal, "x.yaml", {"lora.target_modules=[\"q_proj\\0\"]"}); }),
            "--set lora.target_modules=[\"q_proj\\0\"]: key 'lora.target_modules': expected a list of strings without a "
            "NUL character (\\0), got 'q_proj\\0'");
  EXPECT_EQ(parse_train_config("data:\n  train: \"x\\ty.tok\"\n", "x.yaml").data.train, "x\ty.tok");  // other escapes stay
}

// A number or a bool is a plain YAML scalar: a quoted or !!str-tagged one is a string, refused
// naming the key and the value (yaml-cpp converted "1e-4" to a number in silence). Strings and
// enums may be quoted; the core schema's own tags are numbers.
TEST(TrainConfig, QuotedNumbersAndBoolsAreRefused) {
  EXPECT_EQ(error_of([] { parse_train_config("optimizer:\n  lr: \"1e-4\"\n", "x.yaml"); }),
            "x.yaml: key 'optimizer.lr': expected a number, got the quoted string '1e-4' (write it without quotes)");
  EXPECT_EQ(error_of([] { parse_train_config("steps: '10'\n", "x.yaml"); }),
            "x.yaml: key 'steps': expected an integer, got the quoted string '10' (write it without quotes)");
  EXPECT_EQ(error_of([] { parse_train_config("seed: \"7\"\n", "x.yaml"); }),
            "x.yaml: key 'seed': expected a non-negative integer, got the quoted string '7' (write it without quotes)");
  EXPECT_EQ(error_of([] { parse_train_config("model:\n  double_quant: \"false\"\n", "x.yaml"); }),
            "x.yaml: key 'model.double_quant': expected true or false, got the quoted string 'false' (write it without "
            "quotes)");
  EXPECT_EQ(error_of([] { parse_train_config("lora:\n  r: !!str 8\n", "x.yaml"); }),
            "x.yaml: key 'lora.r': expected an integer, got '8' tagged tag:yaml.org,2002:str");
  EXPECT_EQ(error_of([] { parse_train_config(kMinimal, "x.yaml", {"optimizer.lr='5e-4'"}); }),
            "--set optimizer.lr='5e-4': key 'optimizer.lr': expected a number, got the quoted string '5e-4' (write it "
            "without quotes)");
  // Plain scalars and the core schema's tags are numbers; strings and enums may be quoted.
  const TrainConfig c = parse_train_config(
      "steps: !!int 12\noptimizer:\n  lr: !!float 2e-4\nmodel:\n  path: \"10\"\n  quant_type: 'fp4'\n", "x.yaml");
  EXPECT_EQ(c.steps, 12);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 2e-4);
  EXPECT_EQ(c.model.path, "10");
  EXPECT_EQ(c.model.quant_type, QuantType::kFp4);
}

// Values whose products would wrap int64 (micro_batch_size 2^62 at 4 ranks used to wrap to 0 and
// divide by zero on every rank; huge epochs overflowed the step count): clear errors naming the key.
TEST(TrainConfig, HugeValuesAreRefusedNotWrapped) {
  auto bad = [](const std::vector<std::string>& sets, int world = 1) {
    return error_of([&] { parse_train_config(kMinimal, "x.yaml", sets).validate(world); });
  };
  const std::string huge = std::to_string(int64_t{1} << 62);
  EXPECT_NE(bad({"batch.micro_batch_size=" + huge, "batch.global_batch_size=" + huge}, 4)
                .find("batch.global_batch_size = " + huge + ": expected <= "),
            std::string::npos);
  EXPECT_NE(bad({"batch.micro_batch_size=" + huge}, 4).find("batch.micro_batch_size = " + huge), std::string::npos);
  EXPECT_NE(bad({"data.max_seq_len=" + huge}).find("data.max_seq_len"), std::string::npos);
  EXPECT_NE(bad({"steps=0", "epochs=" + huge}).find("epochs = " + huge), std::string::npos);
  EXPECT_NE(bad({"model.init.num_hidden_layers=1000000000"}).find("model.init.num_hidden_layers = 1000000000"),
            std::string::npos);
  // The step count from epochs is checked too.
  TrainConfig c = parse_train_config(kMinimal, "x.yaml", {"steps=0", "epochs=1000000", "schedule.warmup_steps=0"});
  EXPECT_NE(error_of([&] { c.max_steps(int64_t{1} << 62); }).find("optimizer steps"), std::string::npos);
}

TEST(TrainConfig, ValidateRejectsBadValues) {
  auto bad = [](const std::vector<std::string>& sets, int world = 1) {
    return error_of([&] { parse_train_config(kMinimal, "x.yaml", sets).validate(world); });
  };
  EXPECT_NE(bad({"optimizer.lr=-0.001"}).find("optimizer.lr = -0.001: expected > 0"), std::string::npos);
  EXPECT_NE(bad({"steps=10", "schedule.warmup_steps=20"}).find("schedule.warmup_steps = 20: expected <= steps (10)"),
            std::string::npos);
  EXPECT_NE(bad({"lora.r=0"}).find("lora.r = 0: expected in [1, 65536]"), std::string::npos);
  EXPECT_NE(bad({"lora.r=36028797018963968"}).find("lora.r = 36028797018963968: expected in [1, 65536]"), std::string::npos);
  EXPECT_NE(bad({"lora.alpha=1e308"}).find("lora.alpha = 1e+308: expected in (0, 1e+06]"), std::string::npos);
  EXPECT_NE(bad({"data.max_seq_len=0"}).find("data.max_seq_len = 0"), std::string::npos);
  EXPECT_NE(bad({"data.max_seq_len=1024"}).find("<= model.init.max_position_embeddings (512)"), std::string::npos);
  EXPECT_NE(bad({"lora.target_modules=[q_proj, qkv]"}).find("lora.target_modules = qkv"), std::string::npos);
  EXPECT_NE(bad({"model.blocksize=48"}).find("a power of two"), std::string::npos);
  EXPECT_NE(bad({"epochs=2"}).find("exactly one of steps and epochs"), std::string::npos);
  EXPECT_NE(bad({"data.eval=e.tok", "data.eval_fraction=0.1"}).find("data.eval_fraction"), std::string::npos);
  EXPECT_NE(bad({"model.init.num_key_value_heads=3"}).find("model.init.num_key_value_heads = 3"), std::string::npos);
  // Global batch 8, micro 2: fine for 1, 2 and 4 ranks, not for 3 or 8.
  EXPECT_NO_THROW(parse_train_config(kMinimal, "x.yaml", {"batch.micro_batch_size=2"}).validate(4));
  EXPECT_NE(bad({"batch.micro_batch_size=2"}, 3)
                .find("batch.global_batch_size = 8: expected a multiple of batch.micro_batch_size x world size = 2 x 3 = 6"),
            std::string::npos);
  EXPECT_NE(bad({"batch.micro_batch_size=2"}, 8).find("2 x 8 = 16"), std::string::npos);
  // The source of an override is named.
  EXPECT_EQ(bad({"optimizer.lr=-1"}).rfind("x.yaml + --set optimizer.lr: ", 0), 0u);
}

// Defaults that cannot lose work or speed (issue 26): device auto; a job file without
// checkpoint.dir saves into runs/<its stem>; saving nothing is `none`, written back as `none`.
TEST(TrainConfig, DefaultsThatKeepTheWork) {
  EXPECT_EQ(TrainConfig().device, DeviceChoice::kAuto);
  EXPECT_EQ(parse_train_config(kMinimal, "x.yaml").device, DeviceChoice::kAuto);
  EXPECT_EQ(default_run_dir("configs/tiny.yaml"), "runs/tiny");
  EXPECT_EQ(default_run_dir("/abs/my.job.yaml"), "runs/my.job");
  TempDir dir;
  const std::string job = dir.file("chat_sft.yaml");
  testing_util::write_bytes(job, kMinimal);
  EXPECT_EQ(load_train_config(job).checkpoint.dir, "runs/chat_sft");                           // unset
  EXPECT_EQ(load_train_config(job, {"checkpoint.dir="}).checkpoint.dir, "runs/chat_sft");      // empty
  EXPECT_EQ(load_train_config(job, {"checkpoint.dir=out/ck"}).checkpoint.dir, "out/ck");       // given
  const TrainConfig none = load_train_config(job, {"checkpoint.dir=none"});
  EXPECT_EQ(none.checkpoint.dir, "");  // nothing saved, asked for
  testing_util::write_bytes(job, std::string(kMinimal) + "checkpoint:\n  dir: none\n");
  EXPECT_EQ(load_train_config(job).checkpoint.dir, "");
  // Written as `none`, so the resolved config reads back to the same job, file or text.
  const std::string y = none.to_yaml();
  EXPECT_NE(y.find("dir: none"), std::string::npos) << y;
  testing_util::write_bytes(job, y);
  EXPECT_EQ(load_train_config(job).checkpoint.dir, "");
  EXPECT_EQ(parse_train_config(y, "round-trip").to_yaml(), y);
  // Text that is not a job file has no run folder: unset and none are both "".
  EXPECT_EQ(parse_train_config(kMinimal, "x.yaml").checkpoint.dir, "");
  // Stopping early needs a folder: the message says how to save nothing.
  EXPECT_NE(error_of([&] { load_train_config(job, {"checkpoint.stop_after_steps=3"}).validate(1); })
                .find("0 when checkpoint.dir is none"),
            std::string::npos);
  // A resume may change the LR schedule only when asked (--allow-schedule-change).
  EXPECT_FALSE(none.checkpoint.allow_schedule_change);
  EXPECT_TRUE(load_train_config(job, {"checkpoint.allow_schedule_change=true"}).checkpoint.allow_schedule_change);
}

// The measurement knobs (once environment variables): logging.profile, lora.fold, logging.gemm_tflops,
// lora.fuse_qkv_backward.
TEST(TrainConfig, MeasurementKnobs) {
  const TrainConfig d = parse_train_config(kMinimal, "x.yaml");
  EXPECT_FALSE(d.logging.profile);
  EXPECT_TRUE(d.lora.fold);
  EXPECT_FALSE(d.lora.fuse_qkv_backward);
  EXPECT_EQ(d.logging.gemm_tflops, -1.0);  // measure at start
  EXPECT_NO_THROW(d.validate(1));
  // In the file and as overrides, typed like every key.
  const TrainConfig f = parse_train_config(
      "data:\n  train: x.tok\nlogging:\n  profile: true\n  gemm_tflops: 989.5\nlora:\n  fold: false\n", "f.yaml");
  EXPECT_TRUE(f.logging.profile);
  EXPECT_FALSE(f.lora.fold);
  EXPECT_DOUBLE_EQ(f.logging.gemm_tflops, 989.5);
  const TrainConfig o = parse_train_config(kMinimal, "x.yaml",
                                           {"logging.profile=true", "lora.fold=false", "logging.gemm_tflops=0",
                                            "lora.fuse_qkv_backward=true"});
  EXPECT_TRUE(o.logging.profile);
  EXPECT_FALSE(o.lora.fold);
  EXPECT_TRUE(o.lora.fuse_qkv_backward);
  EXPECT_EQ(o.logging.gemm_tflops, 0.0);  // no MFU
  EXPECT_NO_THROW(o.validate(1));
  EXPECT_NO_THROW(parse_train_config(kMinimal, "x.yaml", {"logging.gemm_tflops=1e-3"}).validate(1));
  // Printed in the resolved config, and read back.
  const std::string y = o.to_yaml();
  EXPECT_NE(y.find("profile: true"), std::string::npos) << y;
  EXPECT_NE(y.find("fold: false"), std::string::npos) << y;
  EXPECT_NE(y.find("fuse_qkv_backward: true"), std::string::npos) << y;
  EXPECT_NE(y.find("gemm_tflops: 0"), std::string::npos) << y;
  EXPECT_NE(d.to_yaml().find("gemm_tflops: -1"), std::string::npos);
  EXPECT_EQ(config_value(d, "logging.gemm_tflops"), "-1");
  EXPECT_EQ(parse_train_config(y, "round-trip").to_yaml(), y);
  // Bad values name the key.
  EXPECT_EQ(error_of([] { parse_train_config(kMinimal, "x.yaml", {"logging.profile=1x"}); }),
            "--set logging.profile=1x: key 'logging.profile': expected true or false, got '1x'");
  EXPECT_EQ(error_of([] { parse_train_config(kMinimal, "x.yaml", {"lora.fold=0.5"}); }),
            "--set lora.fold=0.5: key 'lora.fold': expected true or false, got '0.5'");
  EXPECT_EQ(error_of([] { parse_train_config(kMinimal, "x.yaml", {"logging.gemm_tflops=fast"}); }),
            "--set logging.gemm_tflops=fast: key 'logging.gemm_tflops': expected a number, got 'fast'");
  EXPECT_NE(error_of([] { parse_train_config(kMinimal, "x.yaml", {"logging.gemm_tflops=.inf"}); })
                .find("key 'logging.gemm_tflops': expected a finite number"),
            std::string::npos);
  for (const char* v : {"-2", "-0.5", "-1.5"})
    EXPECT_NE(error_of([&] { parse_train_config(kMinimal, "x.yaml", {std::string("logging.gemm_tflops=") + v}).validate(1); })
                  .find(std::string("logging.gemm_tflops = ") + v + ": expected -1 (measure at start), 0 (no MFU)"),
              std::string::npos)
        << v;
  // Misspelt: the nearest key is suggested.
  EXPECT_EQ(error_of([] { parse_train_config(kMinimal, "x.yaml", {"logging.gemm_tflop=1"}); }),
            "--set logging.gemm_tflop=1: unknown key 'logging.gemm_tflop' (did you mean 'logging.gemm_tflops'?)");
  EXPECT_EQ(error_of([] { parse_train_config("logging:\n  profil: true\n", "x.yaml"); }),
            "x.yaml: unknown key 'logging.profil' (did you mean 'logging.profile'?)");
  EXPECT_EQ(error_of([] { parse_train_config("lora:\n  folded: true\n", "x.yaml"); }),
            "x.yaml: unknown key 'lora.folded' (did you mean 'lora.fold'?)");
}

// model.init.draw_4bit: off unless asked (every existing base keeps its bytes), typed, printed;
// qshard bench turns it on.
TEST(TrainConfig, Draw4bitKey) {
  const TrainConfig d = parse_train_config(kMinimal, "x.yaml");
  EXPECT_FALSE(d.model.init.draw_4bit);
  EXPECT_NE(d.to_yaml().find("draw_4bit: false"), std::string::npos) << d.to_yaml();
  const TrainConfig f = parse_train_config("data:\n  train: x.tok\nmodel:\n  init:\n    draw_4bit: true\n", "f.yaml");
  EXPECT_TRUE(f.model.init.draw_4bit);
  EXPECT_NO_THROW(f.validate(1));
  EXPECT_NE(f.describe().find("draw_4bit: true"), std::string::npos) << f.describe();
  EXPECT_EQ(config_value(f, "model.init.draw_4bit"), "true");
  EXPECT_TRUE(parse_train_config(f.to_yaml(), "round-trip").model.init.draw_4bit);
  EXPECT_TRUE(parse_train_config(kMinimal, "x.yaml", {"model.init.draw_4bit=true"}).model.init.draw_4bit);
  EXPECT_EQ(error_of([] { parse_train_config(kMinimal, "x.yaml", {"model.init.draw_4bit=2"}); }),
            "--set model.init.draw_4bit=2: key 'model.init.draw_4bit': expected true or false, got '2'");
  EXPECT_EQ(error_of([] { parse_train_config("model:\n  init:\n    draw_4bit: [1]\n", "x.yaml"); }),
            "x.yaml: key 'model.init.draw_4bit': expected true or false, got a list");
  EXPECT_EQ(error_of([] { parse_train_config(kMinimal, "x.yaml", {"model.init.draw4bit=true"}); }),
            "--set model.init.draw4bit=true: unknown key 'model.init.draw4bit' (did you mean 'model.init.draw_4bit'?)");
  BenchOptions b;
  b.preset = "tiny";
  EXPECT_TRUE(bench_config(b, "x.tok", 1).model.init.draw_4bit);
}

TEST(TrainConfig, MaxStepsFromEpochs) {
  const TrainConfig c = parse_train_config(kMinimal, "x.yaml", {"steps=0", "epochs=3", "schedule.warmup_steps=5"});
  EXPECT_NO_THROW(c.validate(1));
  EXPECT_EQ(c.max_steps(100), 3 * (100 / 8));
  EXPECT_THROW(c.max_steps(7), InputError);   // no full global batch
  EXPECT_THROW(c.max_steps(10), InputError);  // 3 steps < 5 warmup
  EXPECT_EQ(parse_train_config(kMinimal, "x.yaml").max_steps(1), 100);
}

TEST(TrainConfig, ToYamlRoundTrips) {
  const TrainConfig c = parse_train_config(
      kMinimal, "x.yaml", {"optimizer.eps=1e-7", "lora.target_modules=[q_proj]", "model.quant_type=fp4", "seed=7"});
  const std::string y = c.to_yaml();
  const TrainConfig d = parse_train_config(y, "round-trip");
  EXPECT_EQ(d.to_yaml(), y);
  EXPECT_DOUBLE_EQ(d.optimizer.eps, 1e-7);
  EXPECT_EQ(d.model.quant_type, QuantType::kFp4);
  EXPECT_EQ(d.seed, 7u);
  EXPECT_EQ(d.model.path, "");
  EXPECT_NE(c.describe().find("resolved config (from x.yaml + --set optimizer.eps"), std::string::npos);
  // Every key appears in the YAML.
  for (const auto& key : config_keys()) {
    const auto leaf = key.substr(key.rfind('.') + 1);
    EXPECT_NE(y.find(leaf + ":"), std::string::npos) << key;
  }
}

// logging.tensorboard_dir: off by default; a path in the file or an override; a near miss is
// suggested.
TEST(TrainConfig, TensorBoardDir) {
  EXPECT_EQ(parse_train_config(kMinimal, "x.yaml").logging.tensorboard_dir, "");
  const TrainConfig f =
      parse_train_config("data:\n  train: x.tok\nlogging:\n  tensorboard_dir: runs/tb\n", "f.yaml");
  EXPECT_EQ(f.logging.tensorboard_dir, "runs/tb");
  EXPECT_NE(f.to_yaml().find("tensorboard_dir: runs/tb"), std::string::npos);
  EXPECT_EQ(parse_train_config(kMinimal, "x.yaml", {"logging.tensorboard_dir=/tmp/tb"}).logging.tensorboard_dir,
            "/tmp/tb");
  EXPECT_NE(error_of([] { parse_train_config(kMinimal, "x.yaml", {"logging.tensorboard=/tmp/tb"}); })
                .find("did you mean 'logging.tensorboard_dir'?"),
            std::string::npos);
}

TEST(TrainConfig, ShippedTinyConfigLoadsAndValidates) {
  const TrainConfig c = load_train_config(std::string(QSHARD_SOURCE_DIR) + "/configs/tiny.yaml");
  for (int world : {1, 2, 4}) EXPECT_NO_THROW(c.validate(world)) << world;
  EXPECT_EQ(c.model.init.vocab_size, 258);
  EXPECT_EQ(c.steps, 200);
}

TEST(TrainConfig, LoadFromFileNamesTheFile) {
  TempDir dir;
  const std::string path = dir.file("x.yaml");
  testing_util::write_bytes(path, "optimizer:\n  lrr: 1\n");
  EXPECT_EQ(error_of([&] { load_train_config(path); }),
            path + ": unknown key 'optimizer.lrr' (did you mean 'optimizer.lr'?)");
  EXPECT_NE(error_of([&] { load_train_config(dir.file("missing.yaml")); }).find("cannot open config file"),
            std::string::npos);
}

TEST(TrainConfig, EditDistance) {
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("lr", "lr"), 0u);
}

// Suggestions come from the nearest full dotted key, leaf against leaf, the user's section
// preferred (issue 26: learning_rate suggested model.quant_type, targets offload.params).
TEST(TrainConfig, SuggestionComparesFullDottedKeys) {
  const std::pair<const char*, const char*> cases[] = {
      {"optimizer.learning_rate", "optimizer.lr"},    // initials of the words
      {"lora.targets", "lora.target_modules"},        // the words of one among the other's
      {"optimizer.lrr", "optimizer.lr"},              // a typo in the leaf
      {"lr", "optimizer.lr"},                         // a leaf without its section
      {"chekpoint.dir", "checkpoint.dir"},            // a typo in the section
      {"optimiser", "optimizer"},                     // a section
      {"data.seq_len", "data.max_seq_len"},
      {"train.steps", "steps"},                       // an invented section: the leaf decides
      {"checkpoint.every", "checkpoint.every_steps"}, // not logging.every_steps: the same section first
      {"logging.every_step", "logging.every_steps"},
      {"model.init.hiden_size", "model.init.hidden_size"},
      {"lora.folded", "lora.fold"},
  };
  for (const auto& [typed, expected] : cases) {
    std::printf("%-26s -> %s\n", typed, nearest_config_key(typed).c_str());
    EXPECT_EQ(nearest_config_key(typed), expected) << typed;
  }
  EXPECT_EQ(error_of([] { parse_train_config("optimizer:\n  learning_rate: 0.1\n", "x.yaml"); }),
            "x.yaml: unknown key 'optimizer.learning_rate' (did you mean 'optimizer.lr'?)");
  EXPECT_EQ(error_of([] { parse_train_config(kMinimal, "x.yaml", {"lora.targets=[q_proj]"}); }),
            "--set lora.targets=[q_proj]: unknown key 'lora.targets' (did you mean 'lora.target_modules'?)");
}

// docs/CONFIG.md's source: every key has a type, allowed values and a meaning, and the page lists
// every key (tests/apps diffs the page against the file).
TEST(TrainConfig, EveryKeyIsDocumented) {
  const std::string md = config_reference_markdown();
  const auto infos = config_key_infos();
  ASSERT_EQ(infos.size(), config_keys().size());
  for (const ConfigKeyInfo& k : infos) {
    EXPECT_FALSE(k.type.empty()) << k.key;
    EXPECT_FALSE(k.allowed.empty()) << k.key << ": no allowed values (QS_FIELD's third argument)";
    EXPECT_FALSE(k.doc.empty()) << k.key << ": no meaning (QS_FIELD's fourth argument)";
    EXPECT_NE(md.find("| `" + k.key + "` | " + k.type + " | "), std::string::npos) << k.key;
  }
  EXPECT_NE(md.find("| `optimizer.lr` | number | `0.0002` | > 0 |"), std::string::npos);
  EXPECT_NE(md.find("| `schedule.type` | enum | `warmup_cosine` | warmup_cosine, linear, constant |"),
            std::string::npos);
  for (const char* env : {"QSHARD_COLLECTIVE_TIMEOUT_S", "QSHARD_HOST_MEMORY_BYTES", "QSHARD_NCCL_BLOCKING",
                          "QSHARD_TEMPLATE_LIMITS"})
    EXPECT_NE(md.find(env), std::string::npos) << env;
}

// The environment knobs as keys, checked like the variables.
TEST(TrainConfig, RuntimeKeys) {
  const TrainConfig c = parse_train_config(kMinimal, "x.yaml",
                                           {"runtime.collective_timeout_s=60", "runtime.host_memory_bytes=4e9",
                                            "runtime.nccl_blocking=true"});
  EXPECT_DOUBLE_EQ(c.runtime.collective_timeout_s, 60);
  EXPECT_DOUBLE_EQ(c.runtime.host_memory_bytes, 4e9);
  EXPECT_TRUE(c.runtime.nccl_blocking);
  EXPECT_NO_THROW(c.validate(1));
  EXPECT_NO_THROW(parse_train_config(kMinimal, "x.yaml", {"runtime.collective_timeout_s=0"}).validate(1));
  EXPECT_NE(error_of([] { parse_train_config(kMinimal, "x.yaml", {"runtime.collective_timeout_s=0.5"}).validate(1); })
                .find("runtime.collective_timeout_s = 0.5: expected 0 (off) or a number of seconds in [1, 86400]"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_train_config(kMinimal, "x.yaml", {"runtime.host_memory_bytes=-1"}).validate(1); })
                .find("runtime.host_memory_bytes = -1"),
            std::string::npos);
}

// memory.kept_mlp: true, false, device (the device-kept layers whole, the host tier's lean) or auto.
TEST(TrainConfig, KeptMlpIsChecked) {
  for (const char* ok : {"memory.kept_mlp=true", "memory.kept_mlp=false", "memory.kept_mlp=device", "memory.kept_mlp=auto"})
    EXPECT_NO_THROW(parse_train_config(kMinimal, "x.yaml", {ok}).validate(1)) << ok;
  EXPECT_NE(error_of([] { parse_train_config(kMinimal, "x.yaml", {"memory.kept_mlp=host"}).validate(1); })
                .find("memory.kept_mlp = host: expected auto, true, false or device"),
            std::string::npos);
}

// memory.host_staging_sets: 1 to 8.
TEST(TrainConfig, HostStagingSetsIsChecked) {
  EXPECT_EQ(parse_train_config(kMinimal, "x.yaml", {}).memory.host_staging_sets, 2);
  for (const char* ok : {"memory.host_staging_sets=1", "memory.host_staging_sets=8"})
    EXPECT_NO_THROW(parse_train_config(kMinimal, "x.yaml", {ok}).validate(1)) << ok;
  for (const char* bad : {"memory.host_staging_sets=0", "memory.host_staging_sets=9"})
    EXPECT_NE(error_of([&] { parse_train_config(kMinimal, "x.yaml", {bad}).validate(1); })
                  .find("memory.host_staging_sets = "),
              std::string::npos)
        << bad;
}

// memory.full_kept_layers: -1 (the plan's choice) or a count.
TEST(TrainConfig, FullKeptLayersIsChecked) {
  for (const char* ok : {"memory.full_kept_layers=-1", "memory.full_kept_layers=0", "memory.full_kept_layers=31"})
    EXPECT_NO_THROW(parse_train_config(kMinimal, "x.yaml", {ok}).validate(1)) << ok;
  EXPECT_EQ(parse_train_config(kMinimal, "x.yaml", {}).memory.full_kept_layers, -1);
  EXPECT_NE(error_of([] { parse_train_config(kMinimal, "x.yaml", {"memory.full_kept_layers=-2"}).validate(1); })
                .find("memory.full_kept_layers = -2"),
            std::string::npos);
}

// memory.dequantized_layers: -1 (the plan's choice) or a count.
TEST(TrainConfig, DequantizedLayersIsChecked) {
  for (const char* ok : {"memory.dequantized_layers=-1", "memory.dequantized_layers=0", "memory.dequantized_layers=80"})
    EXPECT_NO_THROW(parse_train_config(kMinimal, "x.yaml", {ok}).validate(1)) << ok;
  EXPECT_EQ(parse_train_config(kMinimal, "x.yaml", {}).memory.dequantized_layers, -1);
  EXPECT_NE(error_of([] { parse_train_config(kMinimal, "x.yaml", {"memory.dequantized_layers=-3"}).validate(1); })
                .find("memory.dequantized_layers = -3"),
            std::string::npos);
}

// memory.checkpoint_every: 0, 1 or 2, and 2 only where every layer is recomputed.
TEST(TrainConfig, CheckpointEveryIsChecked) {
  for (const char* ok : {"memory.checkpoint_every=0", "memory.checkpoint_every=1", "memory.checkpoint_every=2"})
    EXPECT_NO_THROW(parse_train_config(kMinimal, "x.yaml", {ok}).validate(1)) << ok;
  EXPECT_NO_THROW(parse_train_config(kMinimal, "x.yaml", {"memory.checkpoint_every=2", "memory.keep_layers=1"}).validate(1));
  EXPECT_NE(error_of([] { parse_train_config(kMinimal, "x.yaml", {"memory.checkpoint_every=3"}).validate(1); })
                .find("memory.checkpoint_every = 3: expected 0, 1 or 2"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              parse_train_config(kMinimal, "x.yaml", {"memory.checkpoint_every=2", "memory.keep_layers=4"}).validate(1);
            }).find("memory.keep_layers = 4"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              parse_train_config(kMinimal, "x.yaml", {"memory.checkpoint_every=2", "memory.host_keep_layers=2"})
                  .validate(1);
            }).find("memory.host_keep_layers = 2"),
            std::string::npos);
}

// Every input is checked (there, and of the right kind) by check_inputs, naming the key and path.
TEST(TrainConfig, CheckInputsNamesKeyAndPath) {
  TempDir dir;
  const std::string tok = dir.file("t.tok"), model = dir.file("model"), adapter = dir.file("adapter");
  testing_util::write_bytes(tok, "x");
  std::filesystem::create_directories(model);
  std::filesystem::create_directories(adapter);
  auto check = [&](std::vector<std::string> sets) {
    sets.insert(sets.begin(), "data.train=" + tok);
    return error_of([&] { parse_train_config("", "x.yaml", sets).check_inputs(); });
  };
  EXPECT_NO_THROW(parse_train_config("", "x.yaml", {"data.train=" + tok}).check_inputs());
  EXPECT_NE(check({"data.train=" + dir.file("none.tok")}).find("data.train: cannot open token file " + dir.file("none.tok")),
            std::string::npos);
  EXPECT_NE(check({"data.eval=" + model}).find("data.eval: token file " + model + " is a folder, not a regular file"),
            std::string::npos);
  EXPECT_NE(check({"model.path=" + model}).find("model.path: cannot open model config " + model + "/config.json"),
            std::string::npos);
  EXPECT_NE(check({"model.path=" + tok}).find("model.path: model folder " + tok + " is a regular file"),
            std::string::npos);
  EXPECT_NE(check({"lora.init_adapter=" + adapter}).find("lora.init_adapter: cannot open adapter config"),
            std::string::npos);
  EXPECT_NE(check({"checkpoint.resume=" + dir.file("step-9")}).find("checkpoint.resume: cannot open checkpoint " + dir.file("step-9")),
            std::string::npos);
  EXPECT_NO_THROW(
      parse_train_config("", "x.yaml", {"data.train=" + tok, "checkpoint.resume=auto", "checkpoint.dir=" + model})
          .check_inputs());
}

}  // namespace
}  // namespace qshard
