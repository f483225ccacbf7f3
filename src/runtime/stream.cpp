#include "runtime/stream.h"

#include <utility>

#include "runtime/sync_counters.h"
#include "runtime/tensor.h"
#if QSHARD_WITH_CUDA
#include "runtime/cuda_check.h"
#endif

namespace qshard {
namespace {
#if QSHARD_WITH_CUDA
bool have_gpu() {
  static const bool ok = cuda_available();
  return ok;
}
#endif
}  // namespace

int current_device() {
#if QSHARD_WITH_CUDA
  if (have_gpu()) {
    int d = -1;
    QS_CUDA_CHECK(cudaGetDevice(&d));
    return d;
  }
#endif
  return -1;
}

void use_device_on_this_thread(int device) {
#if QSHARD_WITH_CUDA
  if (device >= 0 && have_gpu()) QS_CUDA_CHECK(cudaSetDevice(device));
#else
  (void)device;
#endif
}

// ---- Event -------------------------------------------------------------------------------------

Event::Event(bool timing) {
#if QSHARD_WITH_CUDA
  if (have_gpu()) {
    cudaEvent_t e = nullptr;
    QS_CUDA_CHECK(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
    event_ = e;
  }
#else
  (void)timing;
#endif
}

Event::~Event() { destroy(); }

void Event::destroy() noexcept {
#if QSHARD_WITH_CUDA
  if (event_) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
#endif
  event_ = nullptr;
}

Event::Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    destroy();
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

void Event::synchronize() const {
#if QSHARD_WITH_CUDA
  if (event_) {
    count_host_sync();
    QS_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)));
  }
#endif
}

bool Event::query() const {
#if QSHARD_WITH_CUDA
  if (!event_) return true;
  cudaError_t st = cudaEventQuery(static_cast<cudaEvent_t>(event_));
  if (st == cudaErrorNotReady) return false;
  QS_CUDA_CHECK(st);
#endif
  return true;
}

float Event::elapsed_ms_since(const Event& start) const {
  float ms = 0.0f;
#if QSHARD_WITH_CUDA
  if (event_ && start.event_)
    QS_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start.event_), static_cast<cudaEvent_t>(event_)));
#else
  (void)start;
#endif
  return ms;
}

// ---- Stream ------------------------------------------------------------------------------------

Stream::Stream(std::string name) : name_(std::move(name)) {
#if QSHARD_WITH_CUDA
  if (have_gpu()) {
    cudaStream_t s = nullptr;
    QS_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    stream_ = s;
  }
#endif
}

Stream::~Stream() { destroy(); }

void Stream::destroy() noexcept {
#if QSHARD_WITH_CUDA
  if (stream_) {
    cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
    cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  }
#endif
  stream_ = nullptr;
}

Stream::Stream(Stream&& other) noexcept
    : name_(std::move(other.name_)), stream_(std::exchange(other.stream_, nullptr)) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    destroy();
    name_ = std::move(other.name_);
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

void Stream::record(Event& event) const {
#if QSHARD_WITH_CUDA
  if (event.handle())
    QS_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event.handle()), static_cast<cudaStream_t>(stream_)));
#else
  (void)event;
#endif
}

void Stream::wait(const Event& event) const {
#if QSHARD_WITH_CUDA
  if (event.handle())
    QS_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream_), static_cast<cudaEvent_t>(event.handle()), 0));
#else
  (void)event;
#endif
}

void Stream::synchronize() const {
#if QSHARD_WITH_CUDA
  if (stream_) {
    count_host_sync();
    QS_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)));
  }
#endif
}

}  // namespace qshard
