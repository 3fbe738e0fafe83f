// xlakern/config.h -- portability macros shared by every public header.
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#define XK_HOST_DEVICE __host__ __device__
#define XK_INLINE __host__ __device__ __forceinline__
#else
#define XK_HOST_DEVICE
#define XK_INLINE inline
#endif

// True while compiling device code (the device pass of nvcc).
#if defined(__CUDA_ARCH__)
#define XK_DEVICE_PASS 1
#else
#define XK_DEVICE_PASS 0
#endif

#define XK_MAX_DIMS 8

// Error paths (a failed check, a frame that does not fit): kept out of line and out of the
// way of the code that runs. Inlined at every check they were most of what g++ spent on a
// kernel file with a few checks (event_cpu.cc: a third of its code), and a failing call is
// not on anyone's hot path.
#if defined(__GNUC__)
#define XK_COLD __attribute__((noinline, cold))
#else
#define XK_COLD
#endif

// The out-of-line pieces each library defines once (parallel_run, the frame glue's error paths):
// hidden, so a module never binds another loaded module's copy.
#if defined(__GNUC__)
#define XK_HIDDEN __attribute__((visibility("hidden")))
#else
#define XK_HIDDEN
#endif
