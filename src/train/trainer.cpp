#include "train/trainer.h"

#include "train/train_job.h"

namespace qshard {

TrainSummary train(const TrainConfig& config, Communicator& comm) {
  DeviceContext ctx(Backend::kCpu, -1);
  if (config.device == DeviceChoice::kCuda)
    throw InputError(config.source + ": device 'cuda': train(config, comm) runs the CPU backend; "
                     "use train(config, runtime)");
  Runtime rt{ctx, comm, comm};
  return train(config, rt);
}

// The job's table of contents; each phase is a method of TrainJob (train/train_job.h).
TrainSummary train(const TrainConfig& config, Runtime& rt, const TrainCallbacks* callbacks) {
  TrainJob job(config, rt, callbacks);
  // Validate; resume or fresh start; memory plan and model; data; resumed state; logger; GEMM rate.
  job.open();
  for (int64_t step = job.start_step(); step < job.stop_step(); ++step) {
    StepRecord r = job.run_step(step);                         // one optimizer step
    if (job.eval_due(r.step)) r.eval_loss = job.evaluate(r.step);  // eval every N steps and at the end
    job.log(r);                                                // rank 0: progress line, JSONL
    if (job.save_due(r.step)) job.save(r.step);                // checkpoint every N steps and at the stop
  }
  // The compute stream's split; then, unless stopped early, the final exports.
  return job.finish();
}

}  // namespace qshard
