// host_adamw.h: AdamW on the host for master shards in host memory (offload.optimizer), run on a
// thread of its own so that it overlaps the next step's forward instead of holding the GPU idle.
//
// What: submit() enqueues, on the compute stream after the step's clip coefficient is written,
// copies of the coefficient and of every unit's gradient shard into pinned staging memory (an
// event after each; no host wait), and hands the step to the worker thread. The worker runs
// cpu::adamw_step unit by unit in `order` (the order the next forward gathers them), each once its
// copies are done (it polls the unit's event: the thread driving the GPU never waits on device
// work), and marks the unit done. The manager's master fence (set here) makes a gather of unit u,
// and master_shard(u), wait until the worker is done with u: the next forward's copies of u's
// masters start as soon as u is updated while the GPU computes the layers before it. finish()
// waits for every unit (before a checkpoint reads the moments).
// Arithmetic: the same cpu::adamw_step on the same values as a synchronous host step (bitwise).
// Memory: pinned staging of the gradient shards' size (allocated here, never in a step).
// Errors on the worker are rethrown by the next wait_unit / finish / submit.
// Thread safety: submit, wait_unit and finish from the one thread that drives the manager.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "optim/adamw.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"
#include "shard/sharded_parameter_manager.h"

namespace qshard {

class HostAdamW {
 public:
  // REQUIRES: mgr finalized, its master shards in host memory. `order`: every unit once.
  HostAdamW(ShardedParameterManager& mgr, std::vector<int> order);
  ~HostAdamW();  // finishes the step in flight, removes the manager's fence
  HostAdamW(const HostAdamW&) = delete;
  HostAdamW& operator=(const HostAdamW&) = delete;

  // One step: exp_avg / exp_avg_sq per unit (host, the master shard's size); scale: the clip
  // coefficient (f32, where the gradients live), final in `stream`'s order; step 1-based.
  void submit(std::vector<Tensor>& exp_avg, std::vector<Tensor>& exp_avg_sq, const float* scale,
              const AdamWParams& params, int64_t step, Stream& stream);
  void wait_unit(int unit);  // unit's masters and moments are final
  void finish();             // every unit's
  uint64_t staging_bytes() const { return staging_.nbytes() + scale_.nbytes(); }  // pinned

 private:
  struct Job {
    float *p = nullptr, *m = nullptr, *v = nullptr;
    const float* g = nullptr;
    int64_t n = 0;
  };
  void run();
  void rethrow_locked();

  ShardedParameterManager& mgr_;
  std::vector<int> order_;
  Tensor staging_;                // pinned f32: every unit's gradient shard back to back
  std::vector<int64_t> offset_;   // per unit, in floats
  Tensor scale_;                  // pinned f32 [1]
  Event scale_copied_;
  std::vector<Event> copied_;     // per unit
  std::vector<Job> jobs_;         // per unit, this step's
  AdamWParams params_;
  int64_t step_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t generation_ = 0;       // steps submitted
  std::vector<uint64_t> done_;    // per unit: the last step it finished
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread worker_;
};

}  // namespace qshard
