// The recorder behind timeline.h, and its C entry points (read with ctypes
// by torchbridge/_runtime/_timeline.py).

#include "timeline.h"

#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

namespace torchbridge {
namespace timeline {

std::atomic<bool> g_recording{false};

namespace {

struct Event {
  int64_t phase, thread, begin_ns, end_ns;
};

// Bounded, so that a recording nobody drains cannot grow without limit.
constexpr size_t kMaxEvents = 1 << 20;
std::mutex g_mutex;
std::vector<Event> g_events;

const char* const kNames[kNumPhases] = {
    "torchbridge/kernel",      "torchbridge/wait for torch thread",
    "torchbridge/torch thread", "torchbridge/wrap inputs",
    "torchbridge/acquire GIL",  "torchbridge/callback (GIL held)",
    "torchbridge/adopt outputs", "torchbridge/C++ callback",
};

}  // namespace

const char* PhaseName(int phase) {
  return phase >= 0 && phase < kNumPhases ? kNames[phase] : "";
}

int64_t NowNs() {
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
}

void Record(int phase, int64_t begin_ns, int64_t end_ns) {
  static thread_local const int64_t thread = syscall(SYS_gettid);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_events.size() < kMaxEvents) {
    g_events.push_back(Event{phase, thread, begin_ns, end_ns});
  }
}

}  // namespace timeline
}  // namespace torchbridge

extern "C" {

void torchbridge_timeline_set(int on) {
  torchbridge::timeline::g_recording.store(on != 0, std::memory_order_relaxed);
}

int torchbridge_timeline_num_phases() {
  return torchbridge::timeline::kNumPhases;
}

const char* torchbridge_timeline_phase_name(int phase) {
  return torchbridge::timeline::PhaseName(phase);
}

// Moves up to `capacity` recorded events into `out` (4 int64 each: phase,
// thread, begin, end); returns how many.
int64_t torchbridge_timeline_drain(int64_t* out, int64_t capacity) {
  using torchbridge::timeline::g_events;
  std::lock_guard<std::mutex> lock(torchbridge::timeline::g_mutex);
  const size_t n = std::min(g_events.size(), static_cast<size_t>(capacity));
  std::memcpy(out, g_events.data(), n * 4 * sizeof(int64_t));
  g_events.erase(g_events.begin(), g_events.begin() + n);
  return static_cast<int64_t>(n);
}

}  // extern "C"
