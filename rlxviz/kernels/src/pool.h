// A small persistent thread pool: parallel_for(n, f) runs f(0..n-1) on the workers and the caller.
//
// One parallel_for runs at a time; a call made while another is running (a second MLX stream, or
// a kernel started from inside a worker) runs serially on its own thread instead of waiting.
// After fork() the child has no workers: the pool notices the new pid and starts its own.
#pragma once

#include <atomic>
#include <condition_variable>
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
      st->pending = want - 1;
      st->active = want - 1;
      ++st->generation;
    }
    st->cv.notify_all();
    drain(*st);
    std::unique_lock<std::mutex> lk(st->m);
    st->done.wait(lk, [st] { return st->pending == 0; });
    st->job = nullptr;
  }

 private:
  struct State {
    std::mutex m;
    std::condition_variable cv, done;
    const std::function<void(int)>* job = nullptr;
    std::atomic<int> next{0};
    int total = 0, pending = 0, active = 0, workers = 0;
    long generation = 0;
  };

  Pool() : threads_(cpus()) {}

  static void drain(State& st) {
    for (int i; (i = st.next.fetch_add(1)) < st.total;) (*st.job)(i);
  }

  static void worker(State* st, int index) {
    long seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lk(st->m);
        st->cv.wait(lk, [&] { return st->generation != seen; });
        seen = st->generation;
        if (index >= st->active) continue;  // not needed for this job
      }
      drain(*st);
      std::lock_guard<std::mutex> lk(st->m);
      if (--st->pending == 0) st->done.notify_one();
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
