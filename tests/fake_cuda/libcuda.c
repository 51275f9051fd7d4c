/* A stand-in for the CUDA driver (libcuda.so.1) on machines without a GPU, for tests/test_staged.py:
 * "device" memory is host memory. It checks what hfr/_cuda.pyx promises: a copy is queued with the device's
 * primary context current (else it aborts the process), and every push is popped (fake_depth). A copy runs
 * late, as a GPU's may: only when its stream is synchronized, or an event recorded after it is waited for,
 * so a reader that does not wait finds the bytes from before. FAKE_CUDA_FAIL_AT=N fails this process's Nth
 * copy with CUDA_ERROR_ILLEGAL_ADDRESS. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ILLEGAL_ADDRESS = 700, INVALID_CONTEXT = 201, STREAMS = 16, QUEUED = 256 };
static int primary[16];  /* a device's primary context is the address of its entry */
static __thread void *current = NULL, *stack[16];
static __thread int depth = 0;
static int copies = 0;

struct copy { void *dst; const void *src; size_t nbytes; };
struct stream { uintptr_t handle; int used; long queued, ran; struct copy ring[QUEUED]; };
struct event { struct stream *stream; long after; };  /* the copies queued on stream before it, in number */
static struct stream streams[STREAMS];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

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

static void in_context(const char *what) {
    if (current != &primary[0]) { fprintf(stderr, "fake libcuda: %s without device 0's primary context\n", what); abort(); }
}
static struct stream *stream_of(uintptr_t handle) {  /* under lock */
    for (int i = 0; i < STREAMS; i++)
        if (streams[i].used && streams[i].handle == handle) return &streams[i];
    for (int i = 0; i < STREAMS; i++)
        if (!streams[i].used) { streams[i].used = 1; streams[i].handle = handle; return &streams[i]; }
    fprintf(stderr, "fake libcuda: more than %d streams\n", STREAMS);
    abort();
}
static void run_until(struct stream *s, long until) {  /* under lock: the copies queued before `until` */
    for (; s->ran < until; s->ran++) {
        struct copy *c = &s->ring[s->ran % QUEUED];
        memcpy(c->dst, c->src, c->nbytes);
    }
}
static int copy(void *dst, const void *src, size_t nbytes, uintptr_t handle) {
    const char *fail = getenv("FAKE_CUDA_FAIL_AT");
    if (++copies == (fail ? atoi(fail) : -1)) return ILLEGAL_ADDRESS;
    in_context("a copy");
    pthread_mutex_lock(&lock);
    struct stream *s = stream_of(handle);
    if (s->queued - s->ran == QUEUED) run_until(s, s->ran + 1);  /* the queue is full: the oldest runs */
    s->ring[s->queued++ % QUEUED] = (struct copy){dst, src, nbytes};
    pthread_mutex_unlock(&lock);
    return 0;
}
int cuMemcpyDtoHAsync_v2(void *dst, uintptr_t src, size_t nbytes, uintptr_t stream) { return copy(dst, (void *)src, nbytes, stream); }
int cuMemcpyHtoDAsync_v2(uintptr_t dst, const void *src, size_t nbytes, uintptr_t stream) { return copy((void *)dst, src, nbytes, stream); }
int cuStreamSynchronize(uintptr_t handle) {
    pthread_mutex_lock(&lock);
    struct stream *s = stream_of(handle);
    run_until(s, s->queued);
    pthread_mutex_unlock(&lock);
    return 0;
}
int cuStreamCreate(uintptr_t *handle, unsigned int flags) {
    static uintptr_t made = 0x10000;  /* apart from the fake cupy's handles */
    in_context("a stream");
    pthread_mutex_lock(&lock);
    *handle = made++;
    pthread_mutex_unlock(&lock);
    return 0;
}
int cuStreamDestroy_v2(uintptr_t handle) {
    pthread_mutex_lock(&lock);
    struct stream *s = stream_of(handle);
    run_until(s, s->queued);
    s->used = 0;
    pthread_mutex_unlock(&lock);
    return 0;
}
/* The caller's work on a fake cupy stream is done as it is queued: a wait for it has nothing to wait for. */
int cuStreamWaitEvent(uintptr_t handle, void *event, unsigned int flags) { in_context("a stream's wait"); return 0; }
int cuEventCreate(void **event, unsigned int flags) {
    in_context("an event");
    *event = calloc(1, sizeof(struct event));
    return 0;
}
int cuEventRecord(void *event, uintptr_t handle) {
    pthread_mutex_lock(&lock);
    struct event *e = event;
    e->stream = stream_of(handle);
    e->after = e->stream->queued;
    pthread_mutex_unlock(&lock);
    return 0;
}
int cuEventSynchronize(void *event) {
    struct event *e = event;
    pthread_mutex_lock(&lock);
    if (e->stream) run_until(e->stream, e->after > e->stream->ran ? e->after : e->stream->ran);
    pthread_mutex_unlock(&lock);
    return 0;
}
int cuEventDestroy_v2(void *event) { free(event); return 0; }
int cuGetErrorName(int error, const char **text) { *text = error == ILLEGAL_ADDRESS ? "CUDA_ERROR_ILLEGAL_ADDRESS" : "CUDA_ERROR_UNKNOWN"; return 0; }
int cuGetErrorString(int error, const char **text) { *text = "an illegal memory access was encountered (fake)"; return 0; }
int fake_copies(void) { return copies; }
int fake_depth(void) { return depth; }
