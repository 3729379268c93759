// Stand-alone timing of rlxviz's GEMM core (rlxviz/kernels/src/gemm_core.h, without MLX) against the system
// OpenBLAS's cblas_sgemm at all-MiniLM-L6-v2's dense-layer shapes, one thread, best CPU time of 12 runs with
// caches hot and after flushing 64 MB (cold). Used to choose the block sizes (pass -DRLXVIZ_GEMM_KC=...
// -DRLXVIZ_GEMM_MC_GROUPS=... -DRLXVIZ_GEMM_PANELS=... to try others; docs/performance.md section 0.1).
//
// Build and run (Debian's OpenBLAS; any libopenblas works):
//   g++ -std=c++20 -O3 -march=native -ffp-contract=fast -fno-math-errno -fno-trapping-math -fopenmp-simd \
//       -Irlxviz/kernels/src benchmarks/gemm_core_bench.cpp -o /tmp/gemm_core_bench \
//       /usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0 -lpthread && /tmp/gemm_core_bench
#include "gemm_core.h"
#include <cstdio>
#include <ctime>
#include <random>
extern "C" void cblas_sgemm(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*, int);
extern "C" void openblas_set_num_threads(int);
using namespace rlxviz; using namespace rlxviz::gemm_core;
static std::vector<float> junk(16 << 20);
void flush() { for (size_t i = 0; i < junk.size(); i += 16) junk[i] += 1.0f; }
int main() {
  openblas_set_num_threads(1); Pool::get().set_threads(1);
  int shapes[][3] = {{128,384,1152},{128,384,1536},{128,1536,384},{1024,384,1152},{1024,384,1536},{1024,1536,384}};
  std::mt19937 rng(1); std::normal_distribution<float> nd;
  printf("tile %d x %d, KC %d, MC %d rows\n", kMR, kNR, kc_block(), kMC);
  for (auto& s : shapes) {
    int M=s[0],K=s[1],N=s[2];
    std::vector<float> a(M*K), w(K*N), b(N), c(M*N);
    for (auto& v:a) v=nd(rng); for (auto& v:w) v=nd(rng); for (auto& v:b) v=nd(rng);
    int P=(N+kNR-1)/kNR; std::vector<float> pk((size_t)P*K*kNR); pack_panels(w.data(),N,1,K,N,pk.data());
    GemmArgs g{}; g.a=a.data(); g.b=pk.data(); g.bias=b.data(); g.out=c.data(); g.rs=K; g.cs=1; g.m=M; g.n=N; g.k=K; g.panels=P; g.act=Act::none;
    double best[2][2]={{1e9,1e9},{1e9,1e9}};
    for (int r=0;r<12;++r) for (int cold=0; cold<2; ++cold) {
      if (cold) flush();
      auto t0=std::clock(); run_gemm(g); double t=double(std::clock()-t0)/CLOCKS_PER_SEC; best[0][cold]=std::min(best[0][cold],t);
      if (cold) flush();
      t0=std::clock(); cblas_sgemm(101,111,111,M,N,K,1.0f,a.data(),K,w.data(),N,0.0f,c.data(),N); t=double(std::clock()-t0)/CLOCKS_PER_SEC; best[1][cold]=std::min(best[1][cold],t);
    }
    printf("%5d x %4d x %4d  hot: rlxviz %.2f blas %.2f   cold: rlxviz %.2f blas %.2f ms\n",M,K,N,best[0][0]*1e3,best[1][0]*1e3,best[0][1]*1e3,best[1][1]*1e3);
  }
}
