#include "train/train_checkpoint.h"

#include <cmath>
#include <filesystem>

#include <fmt/format.h>

#include "runtime/json_field.h"
#include "runtime/log.h"
#include "train/qlora_model.h"

#ifndef QSHARD_VERSION
#define QSHARD_VERSION "0.0.0"
#endif

namespace qshard {
namespace fs = std::filesystem;
namespace {

std::string absolute_path(const std::string& p) {
  if (p.empty()) return p;
  std::error_code ec;
  const fs::path a = fs::absolute(p, ec);
  return ec ? p : a.lexically_normal().string();
}

std::string canonical_path(const std::string& p) {
  if (p.empty()) return p;
  std::error_code ec;
  const fs::path c = fs::weakly_canonical(p, ec);
  return ec ? absolute_path(p) : c.string();
}

nlohmann::json finite_or_null(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }
double number_or_nan(const nlohmann::json& v) { return v.is_number() ? v.get<double>() : NAN; }

// Keys that fix the model, the adapter or the order of the data (lora.fold and
// lora.fuse_qkv_backward only choose how the step computes: they may change).
const std::vector<std::string>& must_match_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k;
    for (const auto& key : config_keys())
      // lora.fold / lora.fuse_qkv_backward change how the step computes, model.allow_nonfinite what
      // loading lets through: none fixes the model, so each may change on resume.
      if ((key.rfind("model.", 0) == 0 || key.rfind("lora.", 0) == 0) && key != "lora.fold" &&
          key != "lora.fuse_qkv_backward" && key != "model.allow_nonfinite")
        k.push_back(key);
    for (const char* key : {"seed", "data.max_seq_len", "data.seed", "data.eval_fraction", "batch.global_batch_size"})
      k.emplace_back(key);
    return k;
  }();
  return keys;
}

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

std::string checkpoint_config_yaml(const TrainConfig& config) {
  TrainConfig c = config;
  c.model.path = absolute_path(c.model.path);
  c.data.train = absolute_path(c.data.train);
  c.data.eval = absolute_path(c.data.eval);
  c.checkpoint.resume.clear();
  c.checkpoint.allow_schedule_change = false;  // asked for by each resume, never inherited
  return c.to_yaml();
}

nlohmann::json trainer_state_json(const TrainConfig& config, int64_t step, int64_t max_steps, const DataLoader& loader,
                                  const LrSchedule& schedule, const TrainHistory& history) {
  nlohmann::json losses = nlohmann::json::array(), evals = nlohmann::json::array();
  for (double l : history.losses) losses.push_back(finite_or_null(l));
  for (const auto& [s, l] : history.eval_losses) evals.push_back({s, finite_or_null(l)});
  return {{"qshard_version", QSHARD_VERSION},
          {"config", checkpoint_config_yaml(config)},
          {"max_steps", max_steps},
          {"data", loader.state()},
          {"scheduler",
           {{"type", schedule_type_name(schedule.type)},
            {"lr", schedule.lr},
            {"warmup_steps", schedule.warmup_steps},
            {"max_steps", schedule.max_steps},
            {"min_lr_ratio", schedule.min_lr_ratio},
            {"next_step", step}}},
          {"optimizer",
           {{"type", "adamw"},
            {"step", step},
            {"beta1", config.optimizer.beta1},
            {"beta2", config.optimizer.beta2},
            {"eps", config.optimizer.eps},
            {"weight_decay", config.optimizer.weight_decay},
            {"grad_clip", config.optimizer.grad_clip}}},
          {"rng",
           {{"kind", "counter"},
            {"lora_init_seed", config.seed},
            {"dropout_seed", config.seed},
            {"data_seed", config.data.seed},
            {"base_init_seed", config.model.init.seed},
            {"next_step", step}}},
          {"history", {{"loss", losses}, {"eval_loss", evals}}}};
}

TrainConfig checkpoint_train_config(const CheckpointInfo& info) {
  const std::string label = (fs::path(info.dir) / "metadata.json").string() + " (trainer.config)";
  const nlohmann::json& t = info.metadata.at("trainer");
  if (!t.contains("config") || !t.at("config").is_string())
    throw InputError(label + ": missing; not a checkpoint written by `qshard train`");
  return parse_train_config(t.at("config").get<std::string>(), label);
}

TrainHistory checkpoint_history(const CheckpointInfo& info) {
  const std::string label = (fs::path(info.dir) / "metadata.json").string();
  TrainHistory h;
  const JsonField history = JsonField(info.metadata, label).at("trainer").at("history", "an object");
  for (const JsonField& v : history.at("loss", "an array").elements()) h.losses.push_back(number_or_nan(v.json()));
  for (const JsonField& e : history.at("eval_loss", "an array").elements()) {
    if (e.array().json().size() != 2) e.expected("[step, loss]");
    h.eval_losses.emplace_back(e.elements()[0].integer(0), number_or_nan(e.json()[1]));
  }
  if (static_cast<int64_t>(h.losses.size()) != info.step)
    throw InputError(label + ": trainer.history.loss holds " + std::to_string(h.losses.size()) + " steps, the checkpoint " +
                     std::to_string(info.step));
  return h;
}

std::optional<CheckpointInfo> resolve_resume(const TrainConfig& config) {
  const std::string& r = config.checkpoint.resume;
  if (r.empty()) return std::nullopt;
  if (r == "auto") {
    if (list_checkpoints(config.checkpoint.dir).empty()) {
      QS_LOG_INFO("resume auto: no complete checkpoint in {}; starting fresh", config.checkpoint.dir);
      return std::nullopt;
    }
    return read_checkpoint_metadata(config.checkpoint.dir);
  }
  return read_checkpoint_metadata(r);
}

void check_resume_config(const TrainConfig& job, const TrainConfig& saved, const std::string& checkpoint_dir) {
  for (const std::string& key : must_match_keys()) {
    if (key.rfind("model.init.", 0) == 0 && !job.model.path.empty() && !saved.model.path.empty()) continue;
    std::string a = trimmed(config_value(saved, key)), b = trimmed(config_value(job, key));
    if (key == "model.path") a = canonical_path(saved.model.path), b = canonical_path(job.model.path);
    if (a != b)
      throw InputError("resume from " + checkpoint_dir + ": key '" + key + "' is " + (a.empty() ? "''" : a) +
                       " in the checkpoint but " + (b.empty() ? "''" : b) + " in this job (" + job.source +
                       "); it fixes the model, adapter or data order, so it must not change on resume");
  }
}

std::string check_resume_schedule(const CheckpointInfo& info, const LrSchedule& job, bool allow_change) {
  const nlohmann::json& t = info.metadata.at("trainer");
  if (!t.contains("scheduler")) return "";
  const std::string label = (fs::path(info.dir) / "metadata.json").string();
  std::string diff;
  const JsonField s = JsonField(info.metadata, label).at("trainer").at("scheduler").object();
  auto differs = [&](const char* key, const std::string& saved, const std::string& now) {
    if (saved != now) diff += fmt::format("{}{} {} -> {}", diff.empty() ? "" : ", ", key, saved, now);
  };
  differs("schedule.type", s.at("type", "a string").string(), schedule_type_name(job.type));
  differs("optimizer.lr", fmt::format("{}", s.at("lr", "a number").number()), fmt::format("{}", job.lr));
  differs("schedule.warmup_steps", std::to_string(s.at("warmup_steps", "an integer").integer()),
          std::to_string(job.warmup_steps));
  differs("steps", std::to_string(s.at("max_steps", "an integer").integer()), std::to_string(job.max_steps));
  differs("schedule.min_lr_ratio", fmt::format("{}", s.at("min_lr_ratio", "a number").number()),
          fmt::format("{}", job.min_lr_ratio));
  if (diff.empty()) return diff;
  if (!allow_change)
    throw InputError("resume from " + info.dir + ": the LR schedule differs from the checkpoint's (checkpoint -> " +
                     "this job): " + diff + "; every later step's learning rate would change. Resume with the " +
                     "checkpoint's values, or pass --allow-schedule-change (checkpoint.allow_schedule_change: true) " +
                     "to continue under the new schedule, e.g. to extend the run by more steps");
  return diff;
}

std::vector<std::string> check_resume_state(const CheckpointInfo& info, const TrainConfig& job) {
  const std::string label = (fs::path(info.dir) / "metadata.json").string();
  const nlohmann::json& t = info.metadata.at("trainer");
  // The value at trainer.<section>.<key>, of the JSON type asked for, else an InputError naming it.
  auto at = [&](const char* section, const char* key, bool text) -> const nlohmann::json& {
    const std::string name = std::string("trainer.") + section + "." + key;
    if (!t.contains(section) || !t.at(section).is_object() || !t.at(section).contains(key))
      throw InputError(label + ": " + name + " is missing; not a checkpoint written by `qshard train`");
    const nlohmann::json& v = t.at(section).at(key);
    if (text ? !v.is_string() : !v.is_number_integer())
      throw InputError(label + ": " + name + " is " + v.dump() + ", expected " + (text ? "a string" : "an integer"));
    return v;
  };
  auto same_text = [&](const char* section, const char* key, const std::string& want, const char* what) {
    const std::string got = at(section, key, true).get<std::string>();
    if (got != want)
      throw InputError(label + ": trainer." + section + "." + key + " is '" + got + "', this job's " + what + " is '" +
                       want + "' (a checkpoint of another trainer?); refusing to resume from it");
  };
  auto same_int = [&](const char* section, const char* key, const nlohmann::json& want, const std::string& what) {
    const nlohmann::json& got = at(section, key, false);
    if (got != want)
      throw InputError(label + ": trainer." + section + "." + key + " is " + got.dump() + ", expected " + want.dump() +
                       " (" + what + "); refusing to resume from it");
  };
  same_text("optimizer", "type", "adamw", "optimizer");
  same_text("rng", "kind", "counter", "random number scheme");
  const nlohmann::json step = info.step;
  same_int("optimizer", "step", step, "the checkpoint's step");
  same_int("rng", "next_step", step, "the checkpoint's step");
  same_int("scheduler", "next_step", step, "the checkpoint's step");
  same_int("rng", "lora_init_seed", job.seed, "this job's seed");
  same_int("rng", "dropout_seed", job.seed, "this job's seed");
  same_int("rng", "data_seed", job.data.seed, "this job's data.seed");
  if (job.model.path.empty())  // the random base is drawn from it
    same_int("rng", "base_init_seed", job.model.init.seed, "this job's model.init.seed");
  if (!t.contains("data") || !t.at("data").is_object())
    throw InputError(label + ": trainer.data is missing; not a checkpoint written by `qshard train`");
  // AdamW's hyper-parameters may change on resume (optimizer.* is not a key that fixes the model),
  // but never in silence: the differences come back for a warning.
  std::vector<std::string> changed;
  const std::pair<const char*, double> hyper[] = {{"beta1", job.optimizer.beta1},
                                                  {"beta2", job.optimizer.beta2},
                                                  {"eps", job.optimizer.eps},
                                                  {"weight_decay", job.optimizer.weight_decay},
                                                  {"grad_clip", job.optimizer.grad_clip}};
  for (const auto& [key, now] : hyper) {
    const nlohmann::json& o = t.at("optimizer");
    if (!o.contains(key) || !o.at(key).is_number())
      throw InputError(label + ": trainer.optimizer." + key + " is " + (o.contains(key) ? o.at(key).dump() : "missing") +
                       ", expected a number");
    const double saved = o.at(key).get<double>();
    if (saved != now) changed.push_back(fmt::format("optimizer.{} {} -> {}", key, saved, now));
  }
  return changed;
}

ExportReport export_checkpoint(const std::string& checkpoint, ExportOptions options, Runtime& rt) {
  Communicator& comm = rt.host;
  const CheckpointInfo info = read_checkpoint_metadata(checkpoint);
  const TrainConfig cfg = checkpoint_train_config(info);
  if (comm.rank() == 0)
    QS_LOG_INFO("export {} (step {}, saved by {} ranks) as {} to {}", info.dir, info.step, info.world_size,
                export_format_name(options.format), options.out_dir);
  std::unique_ptr<QloraModel> model = build_qlora_model(cfg, rt, BuildFor::kExport);
  load_sharded_checkpoint(comm, info, state_shards(*model), cfg.model.allow_nonfinite);
  options.r = cfg.lora.r;
  options.lora_alpha = cfg.lora.alpha;
  options.use_rslora = cfg.lora.rslora;
  options.lora_dropout = cfg.lora.dropout;
  options.target_modules = cfg.lora.target_modules;
  if (options.base_model_name_or_path.empty()) options.base_model_name_or_path = cfg.model.path;
  return export_model(comm, *model->tree, model->config, *model->mgr, model->units, options);
}

}  // namespace qshard
