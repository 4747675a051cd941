// Tree-free block verifier: one launch, one thread block per request.
//
// The rule is verify.py's (the twin), step for step:
//   draft d_j (block column j >= 1, j < block_len) is checked against the target at column j-1;
//   greedy  : kept while d_j == argmax of the target's logits (or its given greedy token);
//   sampling: kept while accept_uniform[j-1] < p_{j-1}(d_j), with p the law of sampling.py's
//             probabilities(): scores = logits / temperature, sorted descending (ties: lower index
//             first), cut to the first top_k, then to the smallest prefix whose mass before each
//             token is < top_p of the top-k mass, renormalised;
//   the target's own token is the argmax at column `kept` (greedy) or an inverse-CDF draw in
//   vocabulary order from p_kept, with the rejected draft removed when that leaves any mass.
// Outputs: accept_len = kept + 1; emitted[i] = block[(i+1) % B] with emitted[kept] = the target's
// token (the twin's torch.roll + scatter); kept_rows[i] = i < accept_len (the block rows, anchor
// included, whose target KV stays valid).
//
// The nucleus is found without sorting: every token gets a unique 64-bit key that orders exactly
// like the twin's stable descending sort, and a radix select (8 bits a pass) finds the key of the
// last token inside the top-k / top-p cut; the nucleus is then "key >= cut_key".
// Masses are summed in double; decisions can only differ from the float32 twin when a uniform
// lies within rounding of a boundary.
//
// This file has no PyTorch dependency (block_verify_binding.cpp holds the torch glue), so CI can
// compile it with a bare `nvcc -c`.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math_constants.h>
#include <stdint.h>

namespace dflash {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 256;

template <typename T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ float to_float<__half>(__half x) { return __half2float(x); }
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

// Larger float -> larger unsigned key (negative floats flip all bits, positive ones the sign).
__device__ __forceinline__ uint32_t float_order_key(float f) {
  uint32_t bits = __float_as_uint(f);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// Unique key, larger = earlier in the twin's order: score descending, then index ascending.
__device__ __forceinline__ uint64_t sort_key(float score, int64_t index) {
  return (static_cast<uint64_t>(float_order_key(score)) << 32) | (0xFFFFFFFFull - static_cast<uint64_t>(index));
}

struct Shared {
  uint32_t bin_count[kBins];
  double bin_mass[kBins];
  double thread_mass[kThreads];
  float warp_float[kWarps];
  double warp_double[kWarps];
  int64_t warp_index[kWarps];
  uint64_t chosen_key;
  double chosen_mass;
  int64_t found_index;
};

__device__ float block_max(float value, Shared& sh) {
  for (int offset = 16; offset > 0; offset >>= 1) value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  if ((threadIdx.x & 31) == 0) sh.warp_float[threadIdx.x >> 5] = value;
  __syncthreads();
  float result = sh.warp_float[0];
  for (int w = 1; w < kWarps; ++w) result = fmaxf(result, sh.warp_float[w]);
  __syncthreads();
  return result;
}

__device__ double block_sum(double value, Shared& sh) {
  for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
  if ((threadIdx.x & 31) == 0) sh.warp_double[threadIdx.x >> 5] = value;
  __syncthreads();
  double result = 0.0;
  for (int w = 0; w < kWarps; ++w) result += sh.warp_double[w];  // fixed order: same on every thread
  __syncthreads();
  return result;
}

// torch.argmax: the first index of the maximum.
template <typename T>
__device__ int64_t block_argmax(const T* row, int64_t vocab, Shared& sh) {
  float best = -CUDART_INF_F;
  int64_t best_index = vocab;  // "none yet"; any real index beats it on ties
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    float v = to_float(row[i]);
    if (v > best || (v == best && i < best_index)) { best = v; best_index = i; }
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    float other = __shfl_xor_sync(0xffffffffu, best, offset);
    int64_t other_index = __shfl_xor_sync(0xffffffffu, best_index, offset);
    if (other > best || (other == best && other_index < best_index)) { best = other; best_index = other_index; }
  }
  if ((threadIdx.x & 31) == 0) {
    sh.warp_float[threadIdx.x >> 5] = best;
    sh.warp_index[threadIdx.x >> 5] = best_index;
  }
  __syncthreads();
  best = sh.warp_float[0];
  best_index = sh.warp_index[0];
  for (int w = 1; w < kWarps; ++w) {
    if (sh.warp_float[w] > best || (sh.warp_float[w] == best && sh.warp_index[w] < best_index)) {
      best = sh.warp_float[w];
      best_index = sh.warp_index[w];
    }
  }
  __syncthreads();
  return best_index < vocab ? best_index : 0;
}

// The target's sampling law at one block column: nucleus = {key >= cut_key}, p = mass / nucleus_mass.
struct ColumnLaw {
  float temperature;
  float max_score;
  uint64_t cut_key;
  double nucleus_mass;
};

template <typename T>
__device__ __forceinline__ float score_of(const T* row, int64_t i, float temperature) {
  return to_float(row[i]) / temperature;  // the twin's logits.float() / temperature, bit for bit
}

// Key of the token at 0-based `rank` in the twin's order.
template <typename T>
__device__ uint64_t select_by_rank(const T* row, int64_t vocab, float temperature, int64_t rank, Shared& sh) {
  uint64_t prefix = 0, prefix_mask = 0;
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < kBins; b += kThreads) sh.bin_count[b] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      uint64_t key = sort_key(score_of(row, i, temperature), i);
      if ((key & prefix_mask) == prefix) atomicAdd(&sh.bin_count[(key >> shift) & 0xFF], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int chosen = 0;
      for (int b = kBins - 1; b >= 0; --b) {
        if (rank < static_cast<int64_t>(sh.bin_count[b])) { chosen = b; break; }
        rank -= sh.bin_count[b];
      }
      sh.chosen_key = static_cast<uint64_t>(chosen);
    }
    __syncthreads();
    prefix |= sh.chosen_key << shift;
    prefix_mask |= 0xFFull << shift;
    __syncthreads();
  }
  return prefix;
}

// Key of the last token (in the twin's order, among key >= floor_key) whose mass before it is < limit.
template <typename T>
__device__ uint64_t select_by_mass(const T* row, int64_t vocab, float temperature, float max_score,
                                   uint64_t floor_key, double limit, Shared& sh) {
  uint64_t prefix = 0, prefix_mask = 0;
  double mass_before_bucket = 0.0;  // mass of candidates ordered before the current bucket
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < kBins; b += kThreads) {
      sh.bin_count[b] = 0;
      sh.bin_mass[b] = 0.0;
    }
    __syncthreads();
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      float score = score_of(row, i, temperature);
      uint64_t key = sort_key(score, i);
      if (key >= floor_key && (key & prefix_mask) == prefix) {
        int bin = (key >> shift) & 0xFF;
        atomicAdd(&sh.bin_count[bin], 1u);
        atomicAdd(&sh.bin_mass[bin], static_cast<double>(expf(score - max_score)));
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int chosen = -1;
      double chosen_before = mass_before_bucket, before = mass_before_bucket;
      for (int b = kBins - 1; b >= 0; --b) {
        if (sh.bin_count[b] == 0) continue;
        if (!(before < limit)) break;
        chosen = b;
        chosen_before = before;
        before += sh.bin_mass[b];
      }
      // The first candidate always qualifies (its mass before is 0 < limit); -1 only if none exist.
      sh.chosen_key = static_cast<uint64_t>(chosen < 0 ? 0 : chosen);
      sh.chosen_mass = chosen_before;
    }
    __syncthreads();
    prefix |= sh.chosen_key << shift;
    prefix_mask |= 0xFFull << shift;
    mass_before_bucket = sh.chosen_mass;
    __syncthreads();
  }
  return prefix;
}

template <typename T>
__device__ double nucleus_mass_of(const T* row, int64_t vocab, float temperature, float max_score, uint64_t cut_key,
                                  Shared& sh) {
  double mass = 0.0;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    float score = score_of(row, i, temperature);
    if (sort_key(score, i) >= cut_key) mass += static_cast<double>(expf(score - max_score));
  }
  return block_sum(mass, sh);
}

template <typename T>
__device__ ColumnLaw column_law(const T* row, int64_t vocab, float temperature, float top_p, int64_t top_k,
                                Shared& sh) {
  ColumnLaw law;
  law.temperature = temperature;
  float local_max = -CUDART_INF_F;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) local_max = fmaxf(local_max, score_of(row, i, temperature));
  law.max_score = block_max(local_max, sh);
  law.cut_key = 0;  // every token
  if (top_k > 0 && top_k < vocab) law.cut_key = select_by_rank(row, vocab, temperature, top_k - 1, sh);
  law.nucleus_mass = nucleus_mass_of(row, vocab, temperature, law.max_score, law.cut_key, sh);
  if (top_p < 1.0f) {
    double limit = static_cast<double>(top_p) * law.nucleus_mass;
    law.cut_key = select_by_mass(row, vocab, temperature, law.max_score, law.cut_key, limit, sh);
    law.nucleus_mass = nucleus_mass_of(row, vocab, temperature, law.max_score, law.cut_key, sh);
  }
  return law;
}

template <typename T>
__device__ float probability_of(const T* row, const ColumnLaw& law, int64_t token) {
  float score = score_of(row, token, law.temperature);
  if (sort_key(score, token) < law.cut_key) return 0.0f;
  return static_cast<float>(static_cast<double>(expf(score - law.max_score)) / law.nucleus_mass);
}

// Inverse-CDF draw in vocabulary order from the nucleus, without `excluded` (-1: none), as the
// twin's draw(): the first token whose cumulative mass exceeds uniform * total. Each thread owns a
// contiguous chunk so that a prefix over chunk sums orders the whole vocabulary.
template <typename T>
__device__ int64_t draw_token(const T* row, int64_t vocab, const ColumnLaw& law, int64_t excluded, float uniform,
                              Shared& sh) {
  const int64_t chunk = (vocab + kThreads - 1) / kThreads;
  const int64_t begin = threadIdx.x * chunk;
  const int64_t end = begin + chunk < vocab ? begin + chunk : vocab;
  auto mass_at = [&](int64_t i) -> double {
    if (i == excluded) return 0.0;
    float score = score_of(row, i, law.temperature);
    return sort_key(score, i) >= law.cut_key ? static_cast<double>(expf(score - law.max_score)) : 0.0;
  };
  double own = 0.0;
  for (int64_t i = begin; i < end; ++i) own += mass_at(i);
  sh.thread_mass[threadIdx.x] = own;
  if (threadIdx.x == 0) sh.found_index = vocab;
  __syncthreads();
  if (threadIdx.x == 0) {  // exclusive prefix over the chunks, in order; thread_mass[kThreads-1] ends as the total
    double running = 0.0;
    for (int t = 0; t < kThreads; ++t) {
      double m = sh.thread_mass[t];
      sh.thread_mass[t] = running;
      running += m;
    }
    sh.chosen_mass = running;
  }
  __syncthreads();
  const double target = static_cast<double>(uniform) * sh.chosen_mass;
  double running = sh.thread_mass[threadIdx.x];
  if (running <= target) {
    for (int64_t i = begin; i < end; ++i) {
      running += mass_at(i);
      if (running > target) {
        atomicMin(reinterpret_cast<unsigned long long*>(&sh.found_index), static_cast<unsigned long long>(i));
        break;
      }
    }
  }
  __syncthreads();
  int64_t token = sh.found_index;
  __syncthreads();
  return token < vocab ? token : vocab - 1;  // the twin clamps a draw past the end to the last id
}

template <typename T>
__device__ double total_mass_without(const T* row, int64_t vocab, const ColumnLaw& law, int64_t excluded, Shared& sh) {
  double mass = 0.0;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    if (i == excluded) continue;
    float score = score_of(row, i, law.temperature);
    if (sort_key(score, i) >= law.cut_key) mass += static_cast<double>(expf(score - law.max_score));
  }
  return block_sum(mass, sh);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) block_verify_kernel(
    const T* __restrict__ logits,                 // [bs, B, V] or null (greedy tokens given)
    const int64_t* __restrict__ target_tokens,    // [bs, B] or null
    const int64_t* __restrict__ block_tokens,     // [bs, B]
    const int64_t* __restrict__ block_lens,       // [bs]
    const float* __restrict__ temperature,        // [bs]; 0 = greedy
    const float* __restrict__ top_p,              // [bs]
    const int64_t* __restrict__ top_k,            // [bs]; 0 = no cut
    const float* __restrict__ accept_uniforms,    // [bs, B-1]
    const float* __restrict__ token_uniforms,     // [bs]
    int64_t width, int64_t vocab,
    int64_t* __restrict__ accept_lens,            // [bs]
    int64_t* __restrict__ emitted,                // [bs, B]
    bool* __restrict__ kept_rows) {               // [bs, B]
  __shared__ Shared sh;
  const int64_t request = blockIdx.x;
  const int64_t* block = block_tokens + request * width;
  const int64_t block_len = block_lens[request];
  const float temp = temperature[request];
  const bool greedy = temp == 0.0f || logits == nullptr;

  int64_t kept = 0, next_token = 0;
  for (int64_t column = 0; column < width; ++column) {
    const T* row = logits == nullptr ? nullptr : logits + (request * width + column) * vocab;
    const bool has_draft = column + 1 < block_len;
    const int64_t draft = has_draft ? block[column + 1] : -1;
    if (greedy) {
      const int64_t target = target_tokens != nullptr ? target_tokens[request * width + column]
                                                      : block_argmax(row, vocab, sh);
      if (has_draft && draft == target) { ++kept; continue; }
      next_token = target;
      break;
    }
    ColumnLaw law = column_law(row, vocab, temp, top_p[request], top_k[request], sh);
    if (has_draft && accept_uniforms[request * (width - 1) + column] < probability_of(row, law, draft)) {
      ++kept;
      continue;
    }
    int64_t excluded = -1;
    if (has_draft && total_mass_without(row, vocab, law, draft, sh) > 0.0) excluded = draft;  // the residual law
    next_token = draw_token(row, vocab, law, excluded, token_uniforms[request], sh);
    break;
  }

  for (int64_t i = threadIdx.x; i < width; i += kThreads) {
    emitted[request * width + i] = i == kept ? next_token : block[(i + 1) % width];
    kept_rows[request * width + i] = i <= kept;
  }
  if (threadIdx.x == 0) accept_lens[request] = kept + 1;
}

}  // namespace dflash

// Logits dtype codes: 0 float32, 1 float16, 2 bfloat16.
cudaError_t dflash_block_verify_launch(const void* logits, int logits_dtype, const int64_t* target_tokens,
                                       const int64_t* block_tokens, const int64_t* block_lens,
                                       const float* temperature, const float* top_p, const int64_t* top_k,
                                       const float* accept_uniforms, const float* token_uniforms, int64_t batch,
                                       int64_t width, int64_t vocab, int64_t* accept_lens, int64_t* emitted,
                                       bool* kept_rows, cudaStream_t stream) {
  if (batch == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(batch)), block(dflash::kThreads);
#define DFLASH_LAUNCH(T)                                                                                      \
  dflash::block_verify_kernel<T><<<grid, block, 0, stream>>>(                                                \
      static_cast<const T*>(logits), target_tokens, block_tokens, block_lens, temperature, top_p, top_k,      \
      accept_uniforms, token_uniforms, width, vocab, accept_lens, emitted, kept_rows)
  switch (logits_dtype) {
    case 0: DFLASH_LAUNCH(float); break;
    case 1: DFLASH_LAUNCH(__half); break;
    case 2: DFLASH_LAUNCH(__nv_bfloat16); break;
    default: return cudaErrorInvalidValue;
  }
#undef DFLASH_LAUNCH
  return cudaGetLastError();
}
