// The kernel's phases, for a timeline of every bridged call.
//
// Each phase is a span: a TraceMe, which TF's profiler (TensorBoard's trace
// viewer) records while it runs and which costs one atomic load otherwise;
// and, while torchbridge's own recording is on (torchbridge_timeline_set,
// from torchbridge/_runtime/_timeline.py), an event kept here until Python drains
// it: the phase, the thread (its Linux id, as Python's
// threading.get_native_id()) and CLOCK_MONOTONIC nanoseconds (Python's
// time.perf_counter_ns()), so the C++ phases and the Python ones line up
// in one trace.

#ifndef TORCHBRIDGE_CSRC_TIMELINE_H_
#define TORCHBRIDGE_CSRC_TIMELINE_H_

#include <atomic>
#include <cstdint>

#include "tsl/profiler/lib/traceme.h"

namespace torchbridge {
namespace timeline {

// In the order a CPU call meets them (torchbridge/_runtime/_timeline.py names them
// through torchbridge_timeline_phase_name).
enum Phase : int {
  kKernel = 0,       // TorchbridgeCallOp::Compute, entered to left
  kWaitTorchThread,  // TF's thread hands the call over and waits for it
  kTorchThreadRun,   // the torch thread runs the call
  kWrapInputs,       // the inputs as DLPack tensors
  kAcquireGil,       // waiting for the GIL
  kCallback,         // with the GIL: inputs to torch, the Python call,
                     // outputs checked and exported
  kAdoptOutputs,     // the outputs adopted as TF buffers
  kNativeCallback,   // a C++ callback (native_callback.h), in place of
                     // kAcquireGil and kCallback: no GIL, no Python
  kNumPhases,
};

extern std::atomic<bool> g_recording;

const char* PhaseName(int phase);
int64_t NowNs();
void Record(int phase, int64_t begin_ns, int64_t end_ns);

class Span {
 public:
  explicit Span(Phase phase)
      : phase_(phase),
        begin_ns_(g_recording.load(std::memory_order_relaxed) ? NowNs() : -1),
        traceme_(PhaseName(phase)) {}
  ~Span() { Stop(); }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

  void Stop() {
    if (stopped_) return;
    stopped_ = true;
    traceme_.Stop();
    if (begin_ns_ >= 0) Record(phase_, begin_ns_, NowNs());
  }

 private:
  Phase phase_;
  int64_t begin_ns_;
  bool stopped_ = false;
  tsl::profiler::TraceMe traceme_;
};

}  // namespace timeline
}  // namespace torchbridge

#endif  // TORCHBRIDGE_CSRC_TIMELINE_H_
