// Software prefetch hints, and the rule that keeps them in the binary.
//
// GCC treats a prefetch as free of side effects, so it deduces a function whose only work is
// prefetching to be "looping const", and with C++'s -ffinite-loops (on by default at -O2) it
// deletes a call to such a function whose result is unused. The _mm_prefetch intrinsic is such
// a function itself whenever it is not inlined first, which happens across target attributes
// (the AMX and AVX-512 kernels'); so were helpers like "prefetch the next panel". Until
// 2026-12-05 linear_amx.cc, linear_amx_vector.cc and linear_panel.cc compiled to objects holding
// none of the prefetches they asked for, and nothing but their speed showed it.
// The rule: prefetch through these (builtins, always inlined), and mark a helper that does
// nothing but prefetch always_inline too. The test `kernel_objects_hold_prefetches`
// (tests/backend/check_prefetches.sh) counts the prefetch instructions in the kernel objects.
// (A volatile asm would make any enclosing function non-const, but it also constrains the
// scheduling around it: the AVX-512 BF16 kernels measured 3-5 % slower with it.)
#pragma once

namespace dsinfer {

// The line holding p into every cache level (prefetcht0 on x86-64). Never faults.
__attribute__((always_inline)) inline void PrefetchToL1(const void* p) {
  __builtin_prefetch(p, 0, 3);
}

// The line holding p into L2 and the levels below it (prefetcht1 on x86-64). Never faults.
__attribute__((always_inline)) inline void PrefetchToL2(const void* p) {
  __builtin_prefetch(p, 0, 2);
}

}  // namespace dsinfer
