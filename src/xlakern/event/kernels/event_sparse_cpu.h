// The CSR / fixed-count loops of xlakern.event's CPU products (see event_cpu.cc's header), shared by
// event_cpu.cc and event_indexed_cpu.cc. They read synapse slot p's weight at data[p], or at
// data[perm[p]] when Permuted (binary_csr*_indexed: weights kept in another order).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "event_common.h"

namespace xk_event {

inline float widen(float x) { return x; }
inline double widen(double x) { return x; }
inline float widen(xk::bfloat16_t x) {
  uint32_t u = uint32_t(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float widen(xk::float16_t x) {
  uint32_t h = x.bits, sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: renormalise the mantissa
      uint32_t shift = 0;
      while (!(man & 0x400u)) { man <<= 1; ++shift; }
      u = sign | (113u - shift) << 23 | (man & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | man << 13;
  } else {
    u = sign | (exp + 112u) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Slot p's weight in the accumulation type: data[p], or data[perm[p]] when Permuted (a perm entry
// outside [0, nse) reads 0, never outside data).
template <bool Permuted, typename A, typename W, typename I>
inline A slot_weight(const W* data, const I* perm, int64_t nse, int64_t p) {
  if constexpr (Permuted) {
    const int64_t q = int64_t(perm[p]);
    return uint64_t(q) < uint64_t(nse) ? A(widen(data[q])) : A(0);
  } else {
    return A(widen(data[p]));
  }
}

// Raw bits that decide activity, repeated over the spikes of a 64-bit word: a word with none of them
// set holds no active spike (a binary rule tests its mask; a float spike is active when it is not
// +-0, i.e. when a bit outside its sign is set, the same test).
template <typename S, bool Binary>
inline uint64_t activity_bits(SpikeRule<S, Binary> rule) {
  uint64_t one;
  if constexpr (Binary) one = uint64_t(rule.mask);
  else one = sizeof(S) == 8 ? ~(uint64_t(1) << 63) : ((uint64_t(1) << (8 * sizeof(S) - 1)) - 1);
  uint64_t word = 0;
  for (size_t i = 0; i < 8 / sizeof(S); ++i) word |= one << (8 * sizeof(S) * i);
  return word;
}

// Whether any of spikes s[0 .. n) is active: 64-bit words at a time where the type allows, so a silent
// row of a batch costs a test per 8 bytes.
template <typename S, bool Binary>
inline bool any_active(const S* s, int64_t n, SpikeRule<S, Binary> rule) {
  int64_t b = 0;
  if constexpr (sizeof(S) <= 8 && 8 % sizeof(S) == 0) {
    constexpr int64_t per = 8 / sizeof(S);
    const uint64_t bits = activity_bits(rule);
    for (; b + per <= n; b += per) {
      uint64_t word;
      std::memcpy(&word, s + b, 8);
      if (word & bits) return true;
    }
  }
  for (; b < n; ++b)
    if (rule.active(s[b])) return true;
  return false;
}

// The rows with at least one active spike, ascending. One spike column is scanned a 64-bit word at a
// time, so a silent stretch (most of a 1%-active vector) costs a test per 8 bytes, not a branch a spike;
// a batch is scanned a row at a time, by words too.
template <typename S, bool Binary>
void find_active_rows(const S* spk, int64_t nrows, int64_t batch, SpikeRule<S, Binary> rule,
                      std::vector<int64_t>& active) {
  if (batch != 1) {
    for (int64_t r = 0; r < nrows; ++r)
      if (any_active(spk + r * batch, batch, rule)) active.push_back(r);
    return;
  }
  constexpr int64_t per = sizeof(S) <= 8 && 8 % sizeof(S) == 0 ? 8 / sizeof(S) : 1;  // spikes a word
  int64_t r = 0;
  for (; r + per <= nrows; r += per) {
    if (!any_active(spk + r, per, rule)) continue;
    for (int64_t i = 0; i < per; ++i)
      if (rule.active(spk[r + i])) active.push_back(r + i);
  }
  for (; r < nrows; ++r)
    if (rule.active(spk[r])) active.push_back(r);
}

struct Geometry {
  int64_t nrows, ncols, batch, nse;
  bool homo;
};

// Runs scatter(lo, hi, dst) over items [0, n) that add into out (out_size values, already cleared).
// Threads take shares of the items into private buffers (thread 0 into out), summed afterwards; worth
// it when the adds (`work`, in units of one synapse add) outnumber the buffers and pay for two trips
// through the thread pool: from 16k adds, a share at least 4k adds (counted in work, not in items). On
// the 2-core development VM, once the scatter requested its rows ahead, two threads took 40k neurons at
// 1% active, 80 synapses (32k adds) from 138-221 to 81-116 us a step, and a generated 4k at 5% (128k in
// work) from 171-216 to 114-142 us. (Before the requests, with limits of 128k and 16k, the serial walk
// had been the faster there: 280 against 403 us.)
// Each part past the first clears and sums a buffer of out_size values. An output that fits in a core's
// cache (up to 1 MiB) takes its adds about as cheaply as those passes, so there the buffers hold at most
// twice the adds. On a 16-core Xeon (the GPU host), 40k neurons at 5% active, 80 synapses (160k adds into
// 40k values) took 367-488 us a step in 16 parts and 186-343 in the 9 this allows. A larger output's adds
// miss the caches and the split pays with far more buffer than adds: 16 batch columns of 40k (2.5 MB),
// 1% active, 1.8 ms in 16 parts, 4.0 in 2.
template <typename A, typename F>
void scatter_in_parts(int64_t n, int64_t work, A* out, int64_t out_size, F&& scatter) {
  int64_t parts = std::min<int64_t>({xk::num_threads(), n, work >> 12});
  if (out_size > 0 && out_size * int64_t(sizeof(A)) <= (int64_t(1) << 20))
    parts = std::min<int64_t>(parts, 1 + 2 * work / out_size);
  if (parts > 1 && (work < (int64_t(1) << 14) || out_size * parts > 64 * work)) parts = 1;
  if (parts <= 1) {
    scatter(int64_t(0), n, out);
    return;
  }
  std::vector<std::vector<A>> partial(parts - 1);
  xk::parallel_for(parts, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      A* dst = out;
      if (t > 0) {
        partial[t - 1].assign(out_size, A(0));
        dst = partial[t - 1].data();
      }
      scatter(n * t / parts, n * (t + 1) / parts, dst);
    }
  });
  xk::parallel_for(out_size, 1 << 14, [&](int64_t lo, int64_t hi) {
    for (const auto& part : partial)
      for (int64_t i = lo; i < hi; ++i) out[i] += part[i];
  });
}

// The gather of one spike column (an mv). Each row's slots are summed into four partial sums, so that
// consecutive slots' adds do not wait on each other. Weights kept in slot order are read for every slot
// and a select keeps or drops each: they then stream in order, where a weight read only for an active
// slot was mostly a cache miss of its own. On the 2-core development VM (bench_event's `CSR @ s`, rows
// of 80, two rounds) 40k rows went from 7.6-9.6 to 4.9-6.2 ms a call, 4k rows from 0.62-0.78 to 0.53-0.60.
// A permuted weight (binary_csr*_indexed) is a random read either way, so it is read only for an active
// slot.
template <bool Permuted, typename W, typename I, typename S, bool Binary>
void sparse_gather_mv(const W* data, const I* perm, const I* idx, const I* indptr, const S* spk,
                      typename AccOf<W>::type* out, const Geometry& g, int64_t nconn, SpikeRule<S, Binary> rule) {
  using A = typename AccOf<W>::type;
  if (g.ncols == 0) {  // no spike to read (an out-of-range slot reads spike 0 below)
    std::fill(out, out + g.nrows, A(0));
    return;
  }
  const A w0 = g.homo ? A(widen(data[0])) : A(0);
  const uint64_t ncols = uint64_t(g.ncols);
  xk::parallel_for(g.nrows, 256, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      int64_t begin, end;
      row_range(indptr, nconn, g.nse, r, begin, end);
      // slot p's term: its weight times f(spike) where the spike is active and the column in range
      // (an out-of-range column is dropped), else 0, chosen by a select (a non-finite weight of an
      // inactive slot adds nothing, as in the batched gather)
      auto term = [&](int64_t p) -> A {
        const uint64_t j = uint64_t(int64_t(idx[p]));
        const bool in = j < ncols;
        const S s = spk[in ? j : 0];
        const bool on = in & rule.active(s);
        if constexpr (Permuted)
          if (!on) return A(0);
        const A v = (g.homo ? w0 : slot_weight<Permuted, A>(data, perm, g.nse, p)) * rule.template value<A>(s);
        return on ? v : A(0);
      };
      A acc0 = A(0), acc1 = A(0), acc2 = A(0), acc3 = A(0);
      int64_t p = begin;
      for (; p + 4 <= end; p += 4) {
        acc0 += term(p);
        acc1 += term(p + 1);
        acc2 += term(p + 2);
        acc3 += term(p + 3);
      }
      for (; p < end; ++p) acc0 += term(p);
      out[r] = (acc0 + acc1) + (acc2 + acc3);
    }
  });
}

// The active spikes of a (rows, batch) spike matrix as bits: word t of row j holds columns 64t .. 64t + 63
// of spike row j (`words` words a row).
template <typename S, bool Binary>
void pack_active_bits(const S* spk, int64_t nrows, int64_t batch, int64_t words, SpikeRule<S, Binary> rule,
                      uint64_t* bits) {
  xk::parallel_for(nrows, 1024, [&](int64_t lo, int64_t hi) {
    for (int64_t j = lo; j < hi; ++j) {
      const S* s = spk + j * batch;
      for (int64_t t = 0; t < words; ++t) {
        uint64_t word = 0;
        const int64_t b1 = std::min<int64_t>(batch, 64 * t + 64);
        for (int64_t b = 64 * t; b < b1; ++b) word |= uint64_t(rule.active(s[b])) << (b - 64 * t);
        bits[j * words + t] = word;
      }
    }
  });
}

// The gather of several spike columns (an mm). The spikes are packed into bits first (a word a slot and
// 64 columns, instead of a column's spike each: 40k rows of 16 columns take 80 KB instead of 640 KB, so
// the random reads hit the near caches), and a slot adds its weight only to the columns whose bits are set,
// walked with a count of trailing zeros. The loop before tested every column's spike with a branch. On the
// 2-core development VM (bench_event's `CSR @ S16`, rows of 80, 2 threads) 40k rows went from 32-33 to 11-12
// ms a call at 1% active and from 47-49 to 27 ms at 5%; 4k rows from 2.75 to 1.04-1.07 ms and 4.1 to 2.3-2.4.
// The adds of each column keep slot order (the sums of a loop that skips the inactive spikes).
template <bool Permuted, typename W, typename I, typename S, bool Binary>
void sparse_gather(const W* data, const I* perm, const I* idx, const I* indptr, const S* spk,
                   typename AccOf<W>::type* out, const Geometry& g, int64_t nconn, SpikeRule<S, Binary> rule) {
  using A = typename AccOf<W>::type;
  if (g.batch == 1) {
    sparse_gather_mv<Permuted>(data, perm, idx, indptr, spk, out, g, nconn, rule);
    return;
  }
  const int64_t words = (g.batch + 63) / 64;
  std::vector<uint64_t> bits(size_t(g.ncols * words));
  pack_active_bits(spk, g.ncols, g.batch, words, rule, bits.data());
  const A w0 = g.homo ? A(widen(data[0])) : A(0);
  xk::parallel_for(g.nrows, 256, [&](int64_t lo, int64_t hi) {
    std::vector<A> acc(g.batch);
    for (int64_t r = lo; r < hi; ++r) {
      std::fill(acc.begin(), acc.end(), A(0));
      int64_t begin, end;
      row_range(indptr, nconn, g.nse, r, begin, end);
      for (int64_t p = begin; p < end; ++p) {
        const int64_t j = int64_t(idx[p]);
        if (uint64_t(j) >= uint64_t(g.ncols)) continue;  // out of range: dropped
        const uint64_t* word = bits.data() + j * words;
        const S* s = spk + j * g.batch;
        for (int64_t t = 0; t < words; ++t) {
          uint64_t x = word[t];
          if (x == 0) continue;
          const A w = g.homo ? w0 : slot_weight<Permuted, A>(data, perm, g.nse, p);
          do {
            const int64_t b = 64 * t + __builtin_ctzll(x);
            acc[b] += w * rule.template value<A>(s[b]);
            x &= x - 1;
          } while (x != 0);
        }
      }
      std::memcpy(out + r * g.batch, acc.data(), sizeof(A) * g.batch);
    }
  });
}

// The scatter walks its rows with the slots of the row four ahead requested (prefetch_values). On the
// 2-core development VM (bench_event, rows of 80, 40k rows: 26 MB of indices and weights) a 5%-active
// step went from 430-500 to 290-325 us (s @ CSR) and a 16-column batch at 1% from 2.6-3.1 to 1.6-2.0 ms;
// 4k rows, whose slots stay cached, and rows of 1,000, which the hardware prefetcher follows on its own,
// neither gained nor lost.
template <bool Permuted, typename W, typename I, typename S, bool Binary>
void sparse_scatter(const W* data, const I* perm, const I* idx, const I* indptr, const S* spk,
                    typename AccOf<W>::type* out, const Geometry& g, int64_t nconn, SpikeRule<S, Binary> rule) {
  using A = typename AccOf<W>::type;
  const int64_t out_size = g.ncols * g.batch;
  std::memset(out, 0, sizeof(A) * out_size);
  std::vector<int64_t> active;  // rows with at least one active spike: the only rows touched
  find_active_rows(spk, g.nrows, g.batch, rule, active);
  const A w0 = g.homo ? A(widen(data[0])) : A(0);
  constexpr int64_t kAhead = 4;  // rows whose slots are requested ahead of the walk
  auto prefetch_row = [&](int64_t k, int64_t hi) {
    if (k >= hi) return;
    int64_t begin, end;
    row_range(indptr, nconn, g.nse, active[k], begin, end);
    prefetch_values(idx + begin, end - begin);
    if (g.homo) return;
    if constexpr (Permuted) prefetch_values(perm + begin, end - begin);  // the weights themselves lie anywhere
    else prefetch_values(data + begin, end - begin);
  };
  auto scatter_rows = [&](int64_t lo, int64_t hi, A* dst) {
    for (int64_t k = lo; k < lo + kAhead; ++k) prefetch_row(k, hi);
    if (g.batch == 1) {  // one spike column: no batch loop, no stride
      for (int64_t k = lo; k < hi; ++k) {
        prefetch_row(k + kAhead, hi);
        const int64_t r = active[k];
        int64_t begin, end;
        row_range(indptr, nconn, g.nse, r, begin, end);
        const A v = rule.template value<A>(spk[r]);
        for (int64_t p = begin; p < end; ++p) {
          const int64_t j = int64_t(idx[p]);
          if (uint64_t(j) < uint64_t(g.ncols))
            dst[j] += (g.homo ? w0 : slot_weight<Permuted, A>(data, perm, g.nse, p)) * v;
        }
      }
      return;
    }
    for (int64_t k = lo; k < hi; ++k) {
      prefetch_row(k + kAhead, hi);
      const int64_t r = active[k];
      int64_t begin, end;
      row_range(indptr, nconn, g.nse, r, begin, end);
      const S* s = spk + r * g.batch;
      for (int64_t b = 0; b < g.batch; ++b) {
        if (!rule.active(s[b])) continue;
        const A v = rule.template value<A>(s[b]);
        for (int64_t p = begin; p < end; ++p) {
          const int64_t j = int64_t(idx[p]);
          if (uint64_t(j) >= uint64_t(g.ncols)) continue;
          dst[j * g.batch + b] += (g.homo ? w0 : slot_weight<Permuted, A>(data, perm, g.nse, p)) * v;
        }
      }
    }
  };
  const int64_t n = int64_t(active.size());
  const int64_t per_row = nconn >= 0 ? nconn : g.nse / std::max<int64_t>(1, g.nrows);
  scatter_in_parts(n, n * std::max<int64_t>(1, per_row), out, out_size, scatter_rows);
}

}  // namespace xk_event
