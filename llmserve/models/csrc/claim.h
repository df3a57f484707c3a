// Work shared by claiming, not by a fixed split. at::parallel_for gives each thread a fixed
// half of a product; on a shared 2-core host, a thread descheduled for a moment (the API
// process, a client) holds its whole half back while the other waits at the join. Here the
// range comes in ~4 chunks a thread, taken in turn by whichever thread is free (as ggml's
// matrix products do), so a late thread finds the work done. Which thread computes a chunk
// never changes what it computes: the same bits either way.
#pragma once
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace llmserve {

// On by default; off (for the A/B and the tests) gives at::parallel_for's fixed split.
inline std::atomic<bool>& claiming() {
  static std::atomic<bool> on{true};
  return on;
}

template <class F>
void claim_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  const int64_t n = end - begin, threads = at::get_num_threads();
  if (!claiming().load(std::memory_order_relaxed) || threads < 2 || n <= grain || at::in_parallel_region()) {
    at::parallel_for(begin, end, grain, f);
    return;
  }
  // guided: a claim takes 1 / (2 threads) of what is left (at least grain), so the first
  // claims are long runs of the weights and only the tail is cut fine
  std::atomic<int64_t> next{begin};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    int64_t s = next.load(std::memory_order_relaxed), e = s;
    for (;;) {
      do {
        if (s >= end) return;
        e = std::min(end, s + std::max(grain, (end - s) / (2 * threads)));
      } while (!next.compare_exchange_weak(s, e, std::memory_order_relaxed));
      f(s, e);
      s = next.load(std::memory_order_relaxed);
    }
  });
}

}  // namespace llmserve
