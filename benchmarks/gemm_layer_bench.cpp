// A MiniLM layer's four dense GEMMs (QKV 384 x 1152, output 384 x 384, FFN up 384 x 1536, FFN down 1536 x 384)
// through rlxviz's GEMM core (rlxviz/kernels/src/gemm_core.h, without MLX) at M rows on T threads, wall-clock
// medians of 200 calls each, and this core's FMA peak, so the GEMM's GFLOP/s can be read as a share of it.
//
//   hot:  one copy of each weight (it stays in the caches between calls)
//   cold: 24 copies rotated per call (more than a 32 MB L3 holds), as in a model call where each layer's weights
//         come from DRAM
//   peak: 24 independent chains of `a = a * b + c` on full vectors, one thread (no loads): FMA units x lanes x 2
//         flops x clock
//
// Build against a checkout's header, so two checkouts can be alternated (A/B of a change):
//   g++ -std=c++20 -O3 -march=native -ffp-contract=fast -fno-math-errno -fno-trapping-math -fopenmp-simd \
//       -Irlxviz/kernels/src benchmarks/gemm_layer_bench.cpp -o /tmp/gemm_layer_bench -lpthread
//   /tmp/gemm_layer_bench [threads=2] [rows=128]
#include "gemm_core.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>

using namespace rlxviz;
using namespace rlxviz::gemm_core;
using Clock = std::chrono::steady_clock;

// One thread's FMA peak in GFLOP/s: 24 independent accumulators of one vector each, kept in registers.
#define RLXVIZ_FMA24(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15) \
  X(16) X(17) X(18) X(19) X(20) X(21) X(22) X(23)
static double fma_peak(float seed) {
  typedef float v __attribute__((vector_size(kVec * sizeof(float))));
  const v b = v{} + 0.9999f, c = v{} + 1e-4f * seed;
#define RLXVIZ_INIT(i) v a##i = v{} + 0.01f * (i) * seed;
#define RLXVIZ_STEP(i) a##i = a##i * b + c;
#define RLXVIZ_SUM(i) + a##i
  RLXVIZ_FMA24(RLXVIZ_INIT)
  const long n = 20000000;
  const auto t0 = Clock::now();
  for (long k = 0; k < n; ++k) {
    RLXVIZ_FMA24(RLXVIZ_STEP)
  }
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  const v sum = v{} RLXVIZ_FMA24(RLXVIZ_SUM);
  if (sum[0] == 12345.0f) std::puts("");  // the chains are live
  return n * 24.0 * kVec * 2 / s / 1e9;
}

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2, m = argc > 2 ? std::atoi(argv[2]) : 128;
  Pool::get().set_threads(threads);
  const int shapes[][2] = {{384, 1152}, {384, 384}, {384, 1536}, {1536, 384}};
  std::printf("tile %d x %d; %d thread(s), %d rows; one thread's FMA peak %.1f GFLOP/s\n", kMR, kNR, threads, m,
              fma_peak(argc > 0 ? 1.0f : 2.0f));
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  for (const int copies : {1, 24}) {
    double total = 0, flops = 0;
    std::printf("%s:", copies == 1 ? "hot " : "cold");
    for (const auto& s : shapes) {
      const int k = s[0], n = s[1], panels = (n + kNR - 1) / kNR;
      std::vector<float> a(static_cast<size_t>(m) * k), w(static_cast<size_t>(k) * n), b(n), c(static_cast<size_t>(m) * n);
      for (auto& x : a) x = nd(rng);
      for (auto& x : w) x = nd(rng);
      for (auto& x : b) x = nd(rng);
      std::vector<std::vector<float>> packed(copies, std::vector<float>(static_cast<size_t>(panels) * k * kNR));
      for (auto& p : packed) pack_panels(w.data(), n, 1, k, n, p.data());
      GemmArgs g{};
      g.a = a.data(), g.bias = b.data(), g.out = c.data(), g.rs = k, g.cs = 1, g.m = m, g.n = n, g.k = k;
      g.panels = panels, g.act = Act::none;
      std::vector<double> ms;
      for (int r = 0; r < 200; ++r) {
        g.b = packed[r % copies].data();
        const auto t0 = Clock::now();
        run_gemm(g);
        ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      }
      std::sort(ms.begin(), ms.end());
      std::printf("  %dx%dx%d %.3f", m, k, n, ms[100]);
      total += ms[100];
      flops += 2.0 * m * k * n;
    }
    std::printf("  | layer %.3f ms, %.1f GFLOP/s\n", total, flops / total / 1e6);
  }
}
