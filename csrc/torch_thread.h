// The torch thread of the native op: one thread runs the CPU kernel's
// callbacks, so torch grows one OpenMP team however many TF threads run the
// op (torchbridge/_runtime/_torch_thread.py explains why; this is its C++ twin, which
// TF's thread hands work to without taking the GIL).
//
// TF's thread queues the call and waits for it: it spins for
// kDoneSpinMicros (most calls are short), then sleeps.
//
// Spinning yields the core at each turn, which costs nothing on a quiet
// machine but a whole scheduler time slice (4 ms here) when another
// process is runnable: a bridged step beside one busy process took 8 ms
// instead of 1. So every spin watches its own yields: one that came back
// after more than kContendedYieldMicros means the core is contended, and
// both sides then sleep at once, without spinning, for kNoSpinSeconds
// before they try again (benchmarks/load.py measures the three ways:
// always spin, never spin, this one). The kernel is not an
// AsyncOpKernel: TF's executor hands an asynchronous kernel's successors to
// its pool, one more thread hop per call (measured: +55 us per call here,
// against +22 us for this hand-over). A call queued while the thread is
// busy waits until the torch thread takes it; if that takes longer than
// kWaitSeconds (a bridged call nested inside another one's torch code would
// wait for ever), TF's thread runs it itself.
//
// The torch thread spins for kSpinMicros after each call before it sleeps,
// since bridged calls come in bursts (a forward, then its backward). After
// kTeamIdleSeconds without work it releases its OpenMP team (through
// `release_team`, torch's omp_pause_resource_all, set by
// torchbridge/_runtime/_omp_team.py): while two teams live, libgomp throttles every
// worker's spinning, and torch code on the user's thread right after the
// bridged calls ran at half speed (measured: 1,100 against 450 us). The
// next call makes a new team. The thread ends after kIdleSeconds without
// work (restarting it costs more than a team: keep it for a while). It keeps a
// Python thread state while it lives and deletes it when it ends.
// TORCHBRIDGE_TORCH_THREAD=0 runs every call on TF's thread.

#ifndef TORCHBRIDGE_TORCH_THREAD_H_
#define TORCHBRIDGE_TORCH_THREAD_H_

#include <Python.h>
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "tensorflow/core/platform/denormal.h"

namespace torchbridge {

class TorchThread {
 public:
  static constexpr double kIdleSeconds = 0.2;
  static constexpr double kTeamIdleSeconds = 0.005;
  static constexpr double kWaitSeconds = 2.0;
  static constexpr int kSpinMicros = 50;
  static constexpr int kDoneSpinMicros = 50;
  static constexpr int kContendedYieldMicros = 200;
  static constexpr double kNoSpinSeconds = 1.0;

  // The process's torch thread (a fresh one in a forked child).
  static TorchThread& Get() {
    static std::once_flag once;
    std::call_once(once, [] {
      instance_ = new TorchThread();
      pthread_atfork(nullptr, nullptr, [] { instance_ = new TorchThread(); });
    });
    return *instance_;
  }

  // torch's omp_pause_resource_all (omp_pause_soft = 1), or null.
  static inline std::atomic<int (*)(int)> release_team{nullptr};
  static constexpr int kOmpPauseSoft = 1;

  // Whether calls are handed over at all (TORCHBRIDGE_TORCH_THREAD != 0).
  bool enabled() const { return enabled_; }

  // Whether the caller is the torch thread.
  bool OnThisThread() const {
    return std::this_thread::get_id() == id_.load(std::memory_order_acquire);
  }

  // Runs `task` on the torch thread and returns when it is done. The
  // caller spins for kDoneSpinMicros first (most calls are short), then
  // sleeps. A task the busy thread does not take within kWaitSeconds, or
  // one for which no thread can start, runs here.
  void Run(const std::function<void()>& task) {
    auto item = std::make_shared<Item>();
    item->task = &task;
    // Decided under the lock, kept in a local: once queued, the torch
    // thread may take the item (and set `taken`) at any moment.
    bool no_thread = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      no_thread = !running_ && !Start();
      if (!no_thread) {
        queue_.push_back(item);
        pending_.fetch_add(1, std::memory_order_release);
      }
    }
    if (no_thread) {
      task();
      return;
    }
    wake_.notify_one();
    if (Spin(kDoneSpinMicros,
             [&] { return item->done.load(std::memory_order_acquire); })) {
      return;
    }
    std::unique_lock<std::mutex> lock(mu_);
    const bool taken = changed_.wait_for(
        lock, std::chrono::duration<double>(kWaitSeconds),
        [&] { return item->taken; });
    if (taken) {
      changed_.wait(lock, [&] { return item->done.load(); });
      return;
    }
    for (auto it = queue_.begin(); it != queue_.end(); ++it) {
      if (*it == item) {
        queue_.erase(it);
        pending_.fetch_sub(1, std::memory_order_relaxed);
        break;
      }
    }
    item->taken = true;
    inline_fallbacks_.fetch_add(1, std::memory_order_relaxed);
    lock.unlock();
    task();
  }

  int64_t started() const { return started_.load(); }
  int64_t inline_fallbacks() const { return inline_fallbacks_.load(); }
  int64_t teams_released() const { return teams_released_.load(); }
  // Times a spin found its core contended (and spinning stopped a while).
  int64_t contended() const { return contended_.load(); }
  // The spin: 0 never, 1 always, -1 adaptive (the default; see above).
  // TORCHBRIDGE_TORCH_THREAD_SPIN sets it at start (benchmarks compare them).
  int spin_mode() const { return spin_mode_; }
  bool alive() {
    std::lock_guard<std::mutex> lock(mu_);
    return running_;
  }

 private:
  struct Item {
    const std::function<void()>* task;  // the caller's, alive until done
    bool taken = false;                 // guarded by mu_
    std::atomic<bool> done{false};      // written under mu_
  };

  TorchThread() {
    const char* setting = std::getenv("TORCHBRIDGE_TORCH_THREAD");
    enabled_ = setting == nullptr || std::strcmp(setting, "0") != 0;
    const char* spin = std::getenv("TORCHBRIDGE_TORCH_THREAD_SPIN");
    if (spin != nullptr && std::strcmp(spin, "never") == 0) spin_mode_ = 0;
    if (spin != nullptr && std::strcmp(spin, "always") == 0) spin_mode_ = 1;
  }

  // Spins up to `micros` until `ready()`, yielding the core at each turn;
  // returns ready(). Not at all while the core is contended (see above).
  template <typename Ready>
  bool Spin(int micros, const Ready& ready) {
    using Clock = std::chrono::steady_clock;
    auto now = Clock::now();
    if (spin_mode_ == 0 ||
        now.time_since_epoch().count() <
            no_spin_until_.load(std::memory_order_relaxed)) {
      return ready();
    }
    const auto end = now + std::chrono::microseconds(micros);
    while (!ready() && now < end) {
      std::this_thread::yield();
      const auto after = Clock::now();
      if (spin_mode_ < 0 &&
          after - now > std::chrono::microseconds(kContendedYieldMicros)) {
        const auto until = after + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(kNoSpinSeconds));
        no_spin_until_.store(until.time_since_epoch().count(),
                             std::memory_order_relaxed);
        contended_.fetch_add(1, std::memory_order_relaxed);
        break;
      }
      now = after;
    }
    return ready();
  }

  bool Start() {  // with mu_ held
    try {
      std::thread([this] { Loop(); }).detach();
    } catch (const std::system_error&) {
      return false;
    }
    running_ = true;
    started_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }

  void Loop() {
    id_.store(std::this_thread::get_id(), std::memory_order_release);
    pthread_setname_np(pthread_self(), "torchbridge-tor");
    // Created from one of TF's threads, which flush subnormal floats to zero
    // (TF's thread pools set FTZ/DAZ), this thread would inherit the flag,
    // and so would the OpenMP team it starts: torch code would then give
    // other bits than the same code outside the bridge. Torch's own default
    // (subnormals kept) holds here for the thread's life.
    tensorflow::port::ScopedDontFlushDenormal keep_subnormals;
    while (true) {
      // A short spin catches the next call of a burst without a wake-up.
      Spin(kSpinMicros,
           [&] { return pending_.load(std::memory_order_acquire) != 0; });
      std::shared_ptr<Item> item;
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (queue_.empty() && team_) {
          // Idle for a moment: release the team (outside the lock; a call
          // queued meanwhile is found below).
          wake_.wait_for(lock, std::chrono::duration<double>(kTeamIdleSeconds),
                         [&] { return !queue_.empty(); });
          if (queue_.empty()) {
            lock.unlock();
            ReleaseTeam();
            lock.lock();
          }
        }
        if (queue_.empty()) {
          wake_.wait_for(lock, std::chrono::duration<double>(kIdleSeconds),
                         [&] { return !queue_.empty(); });
        }
        if (queue_.empty()) {
          running_ = false;
          id_.store(std::thread::id(), std::memory_order_release);
          break;
        }
        item = queue_.front();
        queue_.pop_front();
        pending_.fetch_sub(1, std::memory_order_relaxed);
        item->taken = true;
        busy_ = true;
      }
      changed_.notify_all();
      team_ = true;
      (*item->task)();
      {
        std::lock_guard<std::mutex> lock(mu_);
        item->done.store(true, std::memory_order_release);
        busy_ = false;
      }
      changed_.notify_all();
      item.reset();
    }
    DropPythonThreadState();
  }

  void ReleaseTeam() {
    team_ = false;
    if (auto* release = release_team.load(std::memory_order_acquire)) {
      release(kOmpPauseSoft);
      teams_released_.fetch_add(1, std::memory_order_relaxed);
    }
  }

  // The callbacks' GilLock kept a Python thread state for this thread (see
  // GilLock in torchbridge_op.cc); it goes with the thread.
  static void DropPythonThreadState() {
    if (!Py_IsInitialized() || PyGILState_GetThisThreadState() == nullptr) {
      return;
    }
#if PY_VERSION_HEX >= 0x030D0000
    if (Py_IsFinalizing()) return;
#else
    if (_Py_IsFinalizing()) return;
#endif
    PyGILState_STATE state = PyGILState_Ensure();
    PyGILState_Release(PyGILState_LOCKED);  // GilLock's kept one
    PyGILState_Release(state);  // the last: deletes the thread state
  }

  static TorchThread* instance_;

  bool enabled_ = true;
  std::mutex mu_;
  std::condition_variable wake_;     // a call was queued
  std::condition_variable changed_;  // a call was taken or done
  std::deque<std::shared_ptr<Item>> queue_;
  std::atomic<int> pending_{0};  // queue_.size(), read while spinning
  bool running_ = false;         // a thread is running Loop
  bool busy_ = false;            // it is running a call
  std::atomic<std::thread::id> id_{};
  std::atomic<int64_t> started_{0};
  std::atomic<int64_t> inline_fallbacks_{0};
  std::atomic<int64_t> teams_released_{0};
  std::atomic<int64_t> contended_{0};
  int spin_mode_ = -1;
  // steady_clock ticks before which nobody spins (a contended core).
  std::atomic<int64_t> no_spin_until_{0};
  bool team_ = false;  // this thread ran a call since its team was released
};

inline TorchThread* TorchThread::instance_ = nullptr;

}  // namespace torchbridge

#endif  // TORCHBRIDGE_TORCH_THREAD_H_
