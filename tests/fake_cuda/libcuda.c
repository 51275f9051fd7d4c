/* A stand-in for the CUDA driver (libcuda.so.1) on machines without a GPU, for tests/test_staged.py:
 * "device" memory is host memory, a copy is a memcpy. It checks what hfr/_cuda.pyx promises: a copy runs
 * with the device's primary context current (else it aborts the process), and every push is popped
 * (fake_depth). FAKE_CUDA_FAIL_AT=N fails this process's Nth copy with CUDA_ERROR_ILLEGAL_ADDRESS. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ILLEGAL_ADDRESS = 700, INVALID_CONTEXT = 201 };
static int primary[16];  /* a device's primary context is the address of its entry */
static __thread void *current = NULL, *stack[16];
static __thread int depth = 0;
static int copies = 0;

int cuInit(unsigned int flags) { return 0; }
int cuDeviceGet(int *device, int ordinal) { *device = ordinal; return 0; }
int cuDevicePrimaryCtxRetain(void **context, int device) { *context = &primary[device]; return 0; }
int cuDevicePrimaryCtxRelease_v2(int device) { return 0; }
int cuCtxGetCurrent(void **context) { *context = current; return 0; }
int cuCtxPushCurrent_v2(void *context) { stack[depth++] = current; current = context; return 0; }
int cuCtxPopCurrent_v2(void **context) {
    if (depth == 0) return INVALID_CONTEXT;
    *context = current;
    current = stack[--depth];
    return 0;
}
static int copy(void *dst, const void *src, size_t nbytes) {
    const char *fail = getenv("FAKE_CUDA_FAIL_AT");
    if (++copies == (fail ? atoi(fail) : -1)) return ILLEGAL_ADDRESS;
    if (current != &primary[0]) { fprintf(stderr, "fake libcuda: a copy without device 0's primary context\n"); abort(); }
    memcpy(dst, src, nbytes);
    return 0;
}
int cuMemcpyDtoHAsync_v2(void *dst, uintptr_t src, size_t nbytes, uintptr_t stream) { return copy(dst, (void *)src, nbytes); }
int cuMemcpyHtoDAsync_v2(uintptr_t dst, const void *src, size_t nbytes, uintptr_t stream) { return copy((void *)dst, src, nbytes); }
int cuStreamSynchronize(uintptr_t stream) { return 0; }
int cuGetErrorName(int error, const char **text) { *text = error == ILLEGAL_ADDRESS ? "CUDA_ERROR_ILLEGAL_ADDRESS" : "CUDA_ERROR_UNKNOWN"; return 0; }
int cuGetErrorString(int error, const char **text) { *text = "an illegal memory access was encountered (fake)"; return 0; }
int fake_copies(void) { return copies; }
int fake_depth(void) { return depth; }
