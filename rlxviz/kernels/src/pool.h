// A small persistent thread pool: parallel_for(n, f) runs f(0..n-1) on the workers and the caller.
//
// One parallel_for runs at a time; a call made while another is running (a second MLX stream, or
// a kernel started from inside a worker) runs serially on its own thread instead of waiting.
// After fork() the child has no workers: the pool notices the new pid and starts its own.
//
// Waits spin, then block: a worker polls for the next job, and the caller for the workers' end, for up to
// RLXVIZ_POOL_SPIN_US microseconds (default 50; 0 blocks at once) before sleeping on a condition variable.
// A model's kernels run back to back (a MiniLM layer: 4 GEMMs, attention, 2 norms, each 0.1-0.6 ms at batch
// 1), and waking a sleeping thread on an idle vCPU costs tens of microseconds in a VM; the spin keeps the
// workers ready across those gaps and costs each worker at most 50 us of its core after the last kernel of a
// call. The setting is clamped to [0, 100000] us (a larger one would keep idle workers spinning for good).
// Measured 2026-12-03, 2-core AMD EPYC (Zen 5, AVX-512), MiniLM B=1 fused with rlxviz's GEMM, own processes
// (`benchmarks/bench_processes.py`): 13.6 -> 12.0 ms median at 50 us; docs/performance.md section 0.4.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <sched.h>
#include <unistd.h>

namespace rlxviz {

class Pool {
 public:
  static Pool& get() {
    static Pool* pool = new Pool();  // never destroyed: workers are detached and outlive static teardown
    return *pool;
  }

  // The CPUs this process may run on (its affinity mask), at least 1.
  static int cpus() {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
    return std::max(1u, std::thread::hardware_concurrency());
  }

  void set_threads(int n) { threads_ = n < 1 ? cpus() : n; }
  int threads() const { return threads_; }

  void parallel_for(int n, const std::function<void(int)>& f) {
    if (n <= 0) return;
    std::unique_lock<std::mutex> run(run_mutex_, std::try_to_lock);
    int want = std::min(threads_, n);
    if (want <= 1 || !run.owns_lock()) {
      for (int i = 0; i < n; ++i) f(i);
      return;
    }
    State* st = state_for(want - 1);
    {
      std::lock_guard<std::mutex> lk(st->m);
      st->job = &f;
      st->total = n;
      st->next.store(0);
      st->pending.store(want - 1);
      st->active = want - 1;
      st->generation.fetch_add(1, std::memory_order_release);
    }
    st->cv.notify_all();
    drain(*st);
    if (!spin_until([st] { return st->pending.load(std::memory_order_acquire) == 0; })) {
      std::unique_lock<std::mutex> lk(st->m);
      st->done.wait(lk, [st] { return st->pending.load() == 0; });
    }
    st->job = nullptr;
  }

 private:
  struct State {
    std::mutex m;
    std::condition_variable cv, done;
    const std::function<void(int)>* job = nullptr;
    std::atomic<int> next{0}, pending{0};
    std::atomic<long> generation{0};
    int total = 0, active = 0, workers = 0;
  };

  Pool() : threads_(cpus()) {}

  static void drain(State& st) {
    for (int i; (i = st.next.fetch_add(1)) < st.total;) (*st.job)(i);
  }

  // RLXVIZ_POOL_SPIN_US, read once: how long a wait polls before it blocks (us; default 50; 0, a negative
  // value or anything but an integer: never; at most 100000).
  static long spin_us() {
    static const long us = [] {
      const char* e = std::getenv("RLXVIZ_POOL_SPIN_US");
      if (!e || !*e) return 50L;
      char* end = nullptr;
      const long v = std::strtol(e, &end, 10);  // not a number: 0 (block at once)
      return *end == '\0' ? std::clamp(v, 0L, 100000L) : 0L;
    }();
    return us;
  }

  static void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }

  // Polls `ready` for up to spin_us(); true as soon as it holds, false when the time ran out first.
  template <class F>
  static bool spin_until(F ready) {
    const long us = spin_us();
    if (us <= 0) return ready();
    const auto end = std::chrono::steady_clock::now() + std::chrono::microseconds(us);
    for (int i = 0;; ++i) {
      if (ready()) return true;
      cpu_relax();
      if ((i & 63) == 63 && std::chrono::steady_clock::now() > end) return ready();
    }
  }

  static void worker(State* st, int index) {
    long seen = 0;
    for (;;) {
      const bool woke = spin_until([&] { return st->generation.load(std::memory_order_acquire) != seen; });
      std::unique_lock<std::mutex> lk(st->m);
      if (!woke) st->cv.wait(lk, [&] { return st->generation.load() != seen; });
      seen = st->generation.load();
      if (index >= st->active) continue;  // not needed for this job
      lk.unlock();
      drain(*st);
      if (st->pending.fetch_sub(1) == 1) {
        std::lock_guard<std::mutex> lk(st->m);
        st->done.notify_one();
      }
    }
  }

  State* state_for(int workers) {
    if (state_ == nullptr || pid_ != getpid()) {  // first use, or a forked child: fresh state, fresh workers
      state_ = new State();  // the parent's state (if any) is left to its threads, which the child lacks
      pid_ = getpid();
    }
    while (state_->workers < workers) {
      std::thread(worker, state_, state_->workers++).detach();
    }
    return state_;
  }

  std::mutex run_mutex_;
  State* state_ = nullptr;
  pid_t pid_ = 0;
  int threads_;
};

}  // namespace rlxviz
