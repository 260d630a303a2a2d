// ECHELON_CPU_CLONES before a function builds it twice, for x86-64-v3 (AVX2 + FMA) and for the
// baseline, and lets the loader pick by the CPU (GCC's function multi-versioning): the CPU
// kernels vectorise with 256-bit FMAs where the machine has them, while the binary still runs on
// any x86-64. Other compilers and targets get one build.
#pragma once

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define ECHELON_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define ECHELON_CPU_CLONES
#endif
