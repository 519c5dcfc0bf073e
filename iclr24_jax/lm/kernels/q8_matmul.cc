// y[R, O] = x[R, I] @ W^T for a matrix stored as 8-bit codes in groups of 32 inputs (an XLA:CPU FFI kernel).
//
// The weights are the `quant.convert_params` 8-bit layout, [O, I] row major with one float32 scale per output and
// group of 32 inputs:
//   affine    (`Q8MatmulAffine`):    w = q * scale + minimum, q uint8 (the layer kernels);
//   symmetric (`Q8MatmulSymmetric`): w = q * scale,           q int8  (the tied embedding / output head).
// The activations are rounded to 16-bit integers per row and group of 32 inputs, held as two int8 codes:
//   d = max|x| / 127,  a1 = round(x / d),  a2 = clip(round(256 (x / d - a1)), -127, 127),  c = 256 a1 + a2,
// so x ~ c d / 256 (one int8 code, llama.cpp's Q8 activations, moved SmolLM2's per-token log-probabilities by
// 0.12 nats; the second code brings that to the weights' own rounding). Each group's product is then an exact
// integer dot, sum_i q_i c_i = 256 sum_i q_i a1_i + sum_i q_i a2_i, two AVX-512 VNNI instructions (vpdpbusd:
// unsigned codes times signed activations) where the CPU has them:
//   y[r, o] = sum_g scale[o, g] (d[r, g] / 256) sum_{i in g} q[o, i] c[r, i]  +  bias term,
//   affine bias term:    sum_g minimum[o, g] X[r, g],                 X = the exact float sum of x over the group;
//   symmetric bias term: sum_g scale[o, g] (-128 (d[r, g] / 256) C[r, g]), C = sum of c over the group (the codes
//                        are flipped to unsigned, q + 128, for vpdpbusd).
// `native.q8_matmul_reference` is the same arithmetic in XLA (the fallback and the tests' reference).
// Outputs are split into runs of rows of W that the calling thread and the pool's workers take in turn (`Pool`).
#include <atomic>
#include <cmath>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#ifdef __linux__
#include <sched.h>
#endif

#include "xla/ffi/api/ffi.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define Q8_AVX512 1
#else
#define Q8_AVX512 0
#endif

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kGroup = 32;
constexpr int64_t kL1Budget = 24 << 10;  // bytes of activation blocks a row block keeps in L1
constexpr int64_t kAhead = 4;   // outputs ahead whose codes a row prefetches

// One pair of groups (64 inputs) of one row: its two int8 codes and each group's step (d / 256) repeated over the
// 8 lanes its dot fills. Blocks are stored pair-major ([pair][row]), so the rows a load of codes serves sit
// together.
struct alignas(64) Block {
  int8_t a1[64];
  int8_t a2[64];
  float d[16];
};

struct Activations {
  int64_t rows, in, groups, pairs;
  std::vector<Block> blocks;  // [pairs, R]; a missing last group (odd G) has zero codes
  std::vector<float> bias;    // [R, G]: X (affine) or -128 (d / 256) C (symmetric)
  const Block* at(int64_t p, int64_t r) const { return blocks.data() + p * rows + r; }
  Block* at(int64_t p, int64_t r) { return blocks.data() + p * rows + r; }
};

void QuantizeActivations(const float* x, int64_t rows, int64_t in, bool symmetric, Activations* act) {
  const int64_t groups = in / kGroup;
  const int64_t pairs = (groups + 1) / 2;
  act->rows = rows;
  act->in = in;
  act->groups = groups;
  act->pairs = pairs;
  act->blocks.resize(pairs * rows);
  act->bias.resize(rows * groups);
  for (int64_t r = 0; r < rows; ++r) {
    if (groups % 2) {  // the padding group of the last pair multiplies zero codes
      Block* b = act->at(pairs - 1, r);
      std::memset(b->a1 + kGroup, 0, kGroup);
      std::memset(b->a2 + kGroup, 0, kGroup);
      std::fill_n(b->d + 8, 8, 0.0f);
    }
    for (int64_t g = 0; g < groups; ++g) {
      const float* xg = x + r * in + g * kGroup;
      Block* b = act->at(g / 2, r);
      int8_t* a1 = b->a1 + (g % 2) * kGroup;
      int8_t* a2 = b->a2 + (g % 2) * kGroup;
      float d, sum, csum;
#if Q8_AVX512
      const __m512 x0 = _mm512_loadu_ps(xg), x1 = _mm512_loadu_ps(xg + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
      sum = _mm512_reduce_add_ps(_mm512_add_ps(x0, x1));
      d = amax / 127.0f;
      const __m512 inv = _mm512_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
      __m512 c = _mm512_setzero_ps();
      for (int h = 0; h < 2; ++h) {
        const __m512 v = _mm512_mul_ps(h ? x1 : x0, inv);
        const __m512 hi = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);  // ties to even
        __m512 lo = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_sub_ps(v, hi), _mm512_set1_ps(256.0f)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        lo = _mm512_min_ps(_mm512_set1_ps(127.0f), _mm512_max_ps(_mm512_set1_ps(-127.0f), lo));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(a1 + 16 * h), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(hi)));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(a2 + 16 * h), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(lo)));
        c = _mm512_add_ps(c, _mm512_fmadd_ps(hi, _mm512_set1_ps(256.0f), lo));  // integers < 2^24: exact
      }
      csum = _mm512_reduce_add_ps(c);
#else
      float amax = 0.0f;
      sum = 0.0f;
      for (int64_t i = 0; i < kGroup; ++i) {
        amax = std::fmax(amax, std::fabs(xg[i]));
        sum += xg[i];
      }
      d = amax / 127.0f;
      const float inv = d > 0.0f ? 1.0f / d : 0.0f;
      csum = 0.0f;
      for (int64_t i = 0; i < kGroup; ++i) {
        const float v = xg[i] * inv;
        const float hi = std::nearbyint(v);  // ties to even, like jnp.round
        const float lo = std::fmin(127.0f, std::fmax(-127.0f, std::nearbyint((v - hi) * 256.0f)));
        a1[i] = static_cast<int8_t>(hi);
        a2[i] = static_cast<int8_t>(lo);
        csum += 256.0f * hi + lo;
      }
#endif
      const float d256 = d / 256.0f;
      std::fill_n(b->d + (g % 2) * 8, 8, d256);
      act->bias[r * groups + g] = symmetric ? -128.0f * d256 * csum : sum;
    }
  }
}

#if Q8_AVX512
// Rows [r0, r0 + RB) of outputs [o0, o1): each 64-byte load of codes (two groups) and its scales serve RB rows.
template <int RB, bool kSymmetric>
void RowBlock(const Activations& act, const uint8_t* q, const float* scale, const float* bias_w,
              int64_t o0, int64_t o1, int64_t r0, float* y, int64_t out) {
  const int64_t in = act.in, groups = act.groups, pairs = act.pairs;
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512i pair_idx[8];
  for (int j = 0; j < 8; ++j) {
    alignas(64) int32_t idx[16];
    for (int l = 0; l < 16; ++l) idx[l] = 2 * j + (l >= 8);
    pair_idx[j] = _mm512_load_si512(idx);
  }
  const __mmask64 last = (groups % 2) ? 0xFFFFFFFFull : ~0ull;  // an odd G's last pair holds one group
  for (int64_t o = o0; o < o1; ++o) {
    const uint8_t* qo = q + o * in;
    const float* so = scale + o * groups;
    const float* bo = bias_w + o * groups;
    // The stream of codes is the bottleneck at one row: ask for a later output's codes now.
    for (int64_t k = 0; k < in; k += 64) _mm_prefetch(reinterpret_cast<const char*>(qo + kAhead * in + k), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(so + kAhead * groups), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(bo + kAhead * groups), _MM_HINT_T0);
    __m512 acc[RB];
    for (int j = 0; j < RB; ++j) acc[j] = _mm512_setzero_ps();
    for (int64_t p0 = 0; p0 < pairs; p0 += 8) {
      const int64_t left = groups - 2 * p0;
      const __mmask16 m = left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
      const __m512 s16 = _mm512_maskz_loadu_ps(m, so + 2 * p0);
      const int64_t p1 = std::min<int64_t>(pairs, p0 + 8);
      for (int64_t p = p0; p < p1; ++p) {
        __m512i w = _mm512_maskz_loadu_epi8(p == pairs - 1 ? last : ~0ull, qo + p * 2 * kGroup);
        if (kSymmetric) w = _mm512_xor_si512(w, flip);
        const __m512 sp = _mm512_permutexvar_ps(pair_idx[p - p0], s16);
        const Block* blk = act.at(p, r0);
        for (int j = 0; j < RB; ++j) {
          // 256 (q . a1) + q . a2, exact in int32 (|.| < 2^28)
          __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, _mm512_load_si512(blk[j].a1));
          dot = _mm512_dpbusd_epi32(_mm512_slli_epi32(dot, 8), w, _mm512_load_si512(blk[j].a2));
          acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(sp, _mm512_load_ps(blk[j].d)), acc[j]);
        }
      }
    }
    for (int j = 0; j < RB; ++j) {
      const float* br = act.bias.data() + (r0 + j) * groups;
      int64_t g = 0;
      for (; g + 16 <= groups; g += 16) {
        acc[j] = _mm512_fmadd_ps(_mm512_loadu_ps(bo + g), _mm512_loadu_ps(br + g), acc[j]);
      }
      if (g < groups) {
        const __mmask16 m = static_cast<__mmask16>((1u << (groups - g)) - 1);
        acc[j] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, bo + g), _mm512_maskz_loadu_ps(m, br + g), acc[j]);
      }
      y[(r0 + j) * out + o] = _mm512_reduce_add_ps(acc[j]);
    }
  }
}

template <bool kSymmetric>
void RowBlocks(const Activations& act, const uint8_t* q, const float* scale, const float* bias_w,
               int64_t o0, int64_t o1, float* y, int64_t out) {
  int64_t r = 0;
  // Eight rows share each load of codes while their activation codes stay in L1.
  const bool eight = act.pairs * 8 * static_cast<int64_t>(sizeof(Block)) <= kL1Budget;
  for (; eight && r + 8 <= act.rows; r += 8) RowBlock<8, kSymmetric>(act, q, scale, bias_w, o0, o1, r, y, out);
  for (; r + 4 <= act.rows; r += 4) RowBlock<4, kSymmetric>(act, q, scale, bias_w, o0, o1, r, y, out);
  for (; r + 2 <= act.rows; r += 2) RowBlock<2, kSymmetric>(act, q, scale, bias_w, o0, o1, r, y, out);
  for (; r < act.rows; ++r) RowBlock<1, kSymmetric>(act, q, scale, bias_w, o0, o1, r, y, out);
}
#endif

// Outputs [o0, o1) of every row.
void Rows(const Activations& act, const uint8_t* q, const float* scale, const float* minimum, bool symmetric,
          int64_t o0, int64_t o1, float* y, int64_t out) {
  const float* bias_w = symmetric ? scale : minimum;  // the weight-side factor of the bias term
#if Q8_AVX512
  if (symmetric) {
    RowBlocks<true>(act, q, scale, bias_w, o0, o1, y, out);
  } else {
    RowBlocks<false>(act, q, scale, bias_w, o0, o1, y, out);
  }
#else
  const int64_t in = act.in, groups = act.groups;
  for (int64_t o = o0; o < o1; ++o) {
    const uint8_t* qo = q + o * in;
    for (int64_t r = 0; r < act.rows; ++r) {
      const float* br = act.bias.data() + r * groups;
      float acc = 0.0f;
      for (int64_t g = 0; g < groups; ++g) {
        const Block* blk = act.at(g / 2, r);
        const int64_t h = (g % 2) * kGroup;
        int32_t dot = 0;
        for (int64_t i = 0; i < kGroup; ++i) {
          const int32_t code = symmetric ? static_cast<int32_t>(static_cast<uint8_t>(qo[g * kGroup + i] ^ 0x80))
                                         : static_cast<int32_t>(qo[g * kGroup + i]);
          dot += code * (256 * static_cast<int32_t>(blk->a1[h + i]) + static_cast<int32_t>(blk->a2[h + i]));
        }
        acc += static_cast<float>(dot) * scale[o * groups + g] * blk->d[(g % 2) * 8];
        acc += bias_w[o * groups + g] * br[g];
      }
      y[r * out + o] = acc;
    }
  }
#endif
}

struct Job {
  const Activations* act;  // the calling thread's; only read by chunks taken before the call returns
  const uint8_t* q;
  const float* scale;
  const float* minimum;
  bool symmetric;
  float* y;
  int64_t out, chunk, chunks;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};

  // Takes chunks until none is left.
  void Work() {
    for (;;) {
      const int64_t c = next.fetch_add(1, std::memory_order_relaxed);
      if (c >= chunks) return;
      const int64_t o0 = c * chunk, o1 = std::min(out, o0 + chunk);
      Rows(*act, q, scale, minimum, symmetric, o0, o1, y, out);
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

// A small pool of our own: XLA's intra-op pool wakes a sleeping thread tens of microseconds late, which at one
// row (a decoding step makes ~120 of these calls, each 10-100 us) costs more than the work. Each worker spins
// for a short while after a job (the next call of the same step usually comes within microseconds), then
// sleeps on a futex. A call that finds the pool busy (another device's or thunk's call) runs alone.
class Pool {
 public:
  static Pool& Get() {
    static Pool* pool = new Pool();  // never destroyed: workers may outlive static destructors at exit
    return *pool;
  }
  int workers() const { return static_cast<int>(threads_.size()); }

  // Runs job->Work() on the calling thread and every worker; returns when every chunk is done.
  void RunAll(const std::shared_ptr<Job>& job) {
    std::unique_lock<std::mutex> lock(busy_, std::try_to_lock);
    if (lock.owns_lock() && !threads_.empty()) {
      std::atomic_store(&job_, job);
      generation_.fetch_add(1, std::memory_order_release);
      generation_.notify_all();
    }
    job->Work();
    while (job->done.load(std::memory_order_acquire) < job->chunks) Relax();
    if (lock.owns_lock()) std::atomic_store(&job_, std::shared_ptr<Job>());  // workers hold their own copy
  }

 private:
  Pool() {
    int n = static_cast<int>(std::thread::hardware_concurrency());
#ifdef __linux__
    cpu_set_t set;  // the cores this process may run on (taskset, containers), not the machine's
    if (sched_getaffinity(0, sizeof(set), &set) == 0) n = CPU_COUNT(&set);
#endif
    if (const char* env = std::getenv("ICLR24_Q8_THREADS")) n = std::atoi(env);
    for (int i = 1; i < n; ++i) threads_.emplace_back([this] { Loop(); });
    for (auto& t : threads_) t.detach();
  }

  static void Relax() {
#if Q8_AVX512
    _mm_pause();
#else
    std::this_thread::yield();
#endif
  }

  void Loop() {
    uint64_t seen = generation_.load(std::memory_order_acquire);
    for (;;) {
      uint64_t now = generation_.load(std::memory_order_acquire);
      for (int spin = 0; now == seen && spin < kSpins; ++spin) {
        Relax();
        now = generation_.load(std::memory_order_acquire);
      }
      if (now == seen) {
        generation_.wait(seen, std::memory_order_acquire);
        continue;
      }
      seen = now;
      std::shared_ptr<Job> job = std::atomic_load(&job_);
      if (job) job->Work();
    }
  }

  static constexpr int kSpins = 20000;  // ~0.1-0.3 ms of pause instructions
  std::vector<std::thread> threads_;
  std::mutex busy_;
  std::atomic<uint64_t> generation_{0};
  std::shared_ptr<Job> job_;
};

// Outputs per piece of work. One row streams the codes: long contiguous runs (the prefetchers follow them), a few
// pieces per thread. Several rows are bound by arithmetic: short pieces, so that no thread waits long at the end.
int64_t ChunkSize(int64_t out, int64_t rows, int64_t threads) {
  const int64_t pieces = rows >= 4 ? 16 * threads : 4 * threads;
  return std::max<int64_t>(rows >= 4 ? 4 : 16, std::min<int64_t>(256, out / pieces));
}

ffi::Error Run(ffi::Buffer<ffi::F32> x, const uint8_t* q, ffi::Buffer<ffi::F32> scale,
               const float* minimum, bool symmetric, ffi::ResultBuffer<ffi::F32> y, int64_t out, int64_t in) {
  const auto xd = x.dimensions();
  if (xd.size() != 2 || xd[1] != in) return ffi::Error::InvalidArgument("q8_matmul: x must be [R, I]");
  if (in % kGroup) return ffi::Error::InvalidArgument("q8_matmul: the input width must be a multiple of 32");
  const auto sd = scale.dimensions();
  if (sd.size() != 2 || sd[0] != out || sd[1] != in / kGroup)
    return ffi::Error::InvalidArgument("q8_matmul: scale must be [O, I / 32]");
  const int64_t rows = xd[0];
  static thread_local Activations act;  // reused: a call's buffers are free again once it returns
  QuantizeActivations(x.typed_data(), rows, in, symmetric, &act);
  auto job = std::make_shared<Job>();
  job->act = &act;
  job->q = q;
  job->scale = scale.typed_data();
  job->minimum = minimum;
  job->symmetric = symmetric;
  job->y = y->typed_data();
  job->out = out;
  job->chunk = ChunkSize(out, rows, Pool::Get().workers() + 1);
  job->chunks = (out + job->chunk - 1) / job->chunk;
  Pool::Get().RunAll(job);
  return ffi::Error::Success();
}

ffi::Error AffineImpl(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::U8> q,
                      ffi::Buffer<ffi::F32> scale, ffi::Buffer<ffi::F32> minimum, ffi::ResultBuffer<ffi::F32> y) {
  const auto qd = q.dimensions();
  if (qd.size() != 2) return ffi::Error::InvalidArgument("q8_matmul: codes must be [O, I]");
  if (minimum.element_count() != scale.element_count())
    return ffi::Error::InvalidArgument("q8_matmul: minimum must have the shape of scale");
  return Run(x, q.typed_data(), scale, minimum.typed_data(), false, y, qd[0], qd[1]);
}

ffi::Error SymmetricImpl(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S8> q,
                         ffi::Buffer<ffi::F32> scale, ffi::ResultBuffer<ffi::F32> y) {
  const auto qd = q.dimensions();
  if (qd.size() != 2) return ffi::Error::InvalidArgument("q8_matmul: codes must be [O, I]");
  return Run(x, reinterpret_cast<const uint8_t*>(q.typed_data()), scale, nullptr, true, y, qd[0], qd[1]);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(Q8MatmulAffine, AffineImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(Q8MatmulSymmetric, SymmetricImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

extern "C" int q8_matmul_has_vnni() { return Q8_AVX512; }
