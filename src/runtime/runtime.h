// runtime.h: what a collective job runs on, passed as one value: the World, the DeviceContext,
// the host (control) communicator and the data communicator.
//
//   host  MPI. Strings, flags, scalars (token counts in i64, loss sums and squared norms in f64),
//         the "did any rank fail" agreement (collective_status.h). Host buffers only.
//   data  parameters and gradients: NCCL when every rank has a GPU of its own, MPI with pinned
//         staging where ranks share a GPU (NCCL refuses that), MPI on the CPU backend. Buffers
//         live on ctx's compute device.
// On the CPU backend both may be the same MPI communicator.
// Ownership: borrowed references; whoever builds a Runtime (apps/, tests) owns the parts and
// keeps them alive for the job. make_data_communicator() picks the data communicator.
#pragma once

#include <memory>
#include <string>

#include "runtime/communicator.h"
#include "runtime/device_context.h"

namespace qshard {

class World;

struct Runtime {
  DeviceContext& ctx;
  Communicator& host;
  Communicator& data;
  int rank() const { return host.rank(); }
  int size() const { return host.size(); }
};

// Owns the parts of a Runtime for a job: the DeviceContext made from `choice`, an MPI host
// communicator over the World, and the data communicator (make_data_communicator, or the host
// one on the CPU). Collective: every rank constructs it. `setting` names the config key in errors.
class JobRuntime {
 public:
  JobRuntime(const World& world, DeviceChoice choice, const std::string& setting);
  ~JobRuntime();
  Runtime& get() { return *rt_; }

 private:
  std::unique_ptr<DeviceContext> ctx_;
  std::unique_ptr<Communicator> host_;
  std::unique_ptr<Communicator> data_;
  std::unique_ptr<Runtime> rt_;
};

// The data communicator for `ctx` on the ranks of `world`: nullptr when `host` serves (the CPU
// backend); a SelfCommunicator for a one-rank GPU job (runtime/self_communicator.h); an NcclCommunicator when every rank of the node has a GPU of its own; otherwise an
// MpiCommunicator over MPI_COMM_WORLD (pinned staging). Collective: every rank calls it.
std::unique_ptr<Communicator> make_data_communicator(const World& world, const DeviceContext& ctx);

}  // namespace qshard
