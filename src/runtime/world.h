// world.h: the process's place in the job: MPI bootstrap, ranks, nodes and the GPU it uses.
//
// What: `World` wraps MPI_COMM_WORLD. init() starts MPI (MPI_Init_thread asking for
// MPI_THREAD_FUNNELED: MPI is called from the main thread; failure.h's watchdog and signal
// thread call only MPI_Abort) unless someone else already did, works with and without mpirun
// (a process started alone is a singleton world of size 1), and finds:
//   rank, size        MPI_COMM_WORLD
//   local_rank/size   the rank's place among the ranks of its node (MPI_Comm_split_type SHARED)
//   num_nodes         how many shared-memory nodes the job spans
//   device            the CUDA device this rank uses: local_rank % visible GPUs, made current
//                     with cudaSetDevice; -1 in a CPU build or when no GPU is visible.
// It sets MPI_ERRORS_RETURN on MPI_COMM_WORLD (so QS_MPI_CHECK sees errors instead of MPI
// aborting on its own) and the rank used by error messages and log lines.
// Ownership: one World per process (a singleton); init() returns it, get() finds it again.
// It owns the node-local communicator. finalize() frees it and calls MPI_Finalize when init()
// started MPI. Every Communicator must be destroyed before finalize().
// Thread safety: init() and finalize() from the main thread; the accessors are const and safe
// from any thread.
// REQUIRES: init() before any other qshard MPI use; init() again returns the same World
// (argc/argv ignored); after finalize() init() throws (MPI cannot be restarted).
#pragma once

#include <mpi.h>

namespace qshard {

class World {
 public:
  // Starts MPI if needed and discovers the layout. Idempotent.
  static World& init(int* argc, char*** argv);
  // The World made by init(); throws qshard::Error before init() or after finalize().
  static World& get();
  // True between init() and finalize().
  static bool initialized();
  // Frees the World's communicators and finalizes MPI if init() started it. Idempotent; a no-op
  // before init().
  static void finalize();

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  int num_nodes() const { return num_nodes_; }
  // CUDA device of this rank, or -1 (CPU build or no visible GPU).
  int device() const { return device_; }
  // MPI_COMM_WORLD (errors return). Communicators duplicate it.
  MPI_Comm comm() const { return MPI_COMM_WORLD; }
  // Ranks of this node (MPI_Comm_split_type SHARED), owned by the World.
  MPI_Comm local_comm() const { return local_comm_; }
  bool is_root() const { return rank_ == 0; }
  // The thread level MPI provided.
  int thread_level() const { return thread_level_; }

  World(const World&) = delete;
  World& operator=(const World&) = delete;

 private:
  World() = default;
  void discover();

  int rank_ = 0;
  int size_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
  int num_nodes_ = 1;
  int device_ = -1;
  int thread_level_ = MPI_THREAD_SINGLE;
  bool owns_mpi_ = false;
  MPI_Comm local_comm_ = MPI_COMM_NULL;
};

}  // namespace qshard
