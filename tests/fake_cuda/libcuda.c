/* A stand-in for the CUDA driver (libcuda.so.1) on machines without a GPU, for tests/test_staged.py:
 * "device" memory is host memory. It checks what hfr/_cuda.pyx promises: a copy is queued with the device's
 * primary context current (else it aborts the process), and every push is popped (fake_depth). A copy
 * between host and device runs late, as a GPU's may: only once its stream, or an event recorded after it, is
 * found done (queried), so a reader that does not wait finds the bytes from before. Copies
 * between device buffers and kernels run as they are queued, after their stream's earlier copies: another
 * process (a GPU pair's partner) may read what they wrote as soon as it learns they were queued, and its
 * waits on our events have nothing to wait for. cuMemAlloc's memory is a memfd another process maps by its
 * IPC handle; the only kernels are hfr/pairs.py's adds, run on the host by name. FAKE_CUDA_FAIL_AT=N fails
 * this process's Nth copy, FAKE_CUDA_FAIL_LAUNCH=N its Nth kernel launch, with CUDA_ERROR_ILLEGAL_ADDRESS;
 * FAKE_CUDA_PARTNER_STALLS=1 makes a stream that waits on another process's event never run on (a GPU pair
 * partner whose push never runs): what is recorded on it after is never done. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#pragma GCC diagnostic ignored "-Wunused-parameter"  /* the driver's signatures, of which a fake uses a part */

enum { ILLEGAL_ADDRESS = 700, INVALID_CONTEXT = 201, NOT_READY = 600, STREAMS = 16, QUEUED = 256 };
static int primary[16];  /* a device's primary context is the address of its entry */
static __thread void *current = NULL, *stack[16];
static __thread int depth = 0;
static int copies = 0, launches = 0;

struct copy { void *dst; const void *src; size_t nbytes; };
struct stream { uintptr_t handle; int used, stalled; long queued, ran; struct copy ring[QUEUED]; };
struct event {
    struct stream *stream;
    long after;  /* the copies queued on stream before it, in number */
    int stalled;  /* recorded on a stalled stream */
};
enum { OPENED = 64 };
static void *opened[OPENED];  /* the events opened by an IPC handle (a partner's); the fake cupy's are no struct event */
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
static int failing(int *count, const char *variable) {  /* this call is the one the variable names */
    const char *fail = getenv(variable);
    return ++*count == (fail ? atoi(fail) : -1);
}
static int copy(void *dst, const void *src, size_t nbytes, uintptr_t handle) {
    if (failing(&copies, "FAKE_CUDA_FAIL_AT")) return ILLEGAL_ADDRESS;
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
int cuStreamQuery(uintptr_t handle) {
    pthread_mutex_lock(&lock);
    struct stream *s = stream_of(handle);
    if (!s->stalled) run_until(s, s->queued);
    pthread_mutex_unlock(&lock);
    return s->stalled ? NOT_READY : 0;
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
    s->used = s->stalled = 0;
    pthread_mutex_unlock(&lock);
    return 0;
}
/* The caller's work on a fake cupy stream is done as it is queued, as a partner's pushes are: a wait for either
 * has nothing to wait for, but where FAKE_CUDA_PARTNER_STALLS says the partner's never runs. */
int cuStreamWaitEvent(uintptr_t handle, void *event, unsigned int flags) {
    in_context("a stream's wait");
    pthread_mutex_lock(&lock);
    for (int i = 0; i < OPENED; i++)
        if (event && opened[i] == event && getenv("FAKE_CUDA_PARTNER_STALLS")) stream_of(handle)->stalled = 1;
    pthread_mutex_unlock(&lock);
    return 0;
}
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
    e->stalled = e->stream->stalled;
    pthread_mutex_unlock(&lock);
    return 0;
}
int cuEventQuery(void *event) {
    struct event *e = event;
    pthread_mutex_lock(&lock);
    if (e->stream && !e->stalled) run_until(e->stream, e->after > e->stream->ran ? e->after : e->stream->ran);
    pthread_mutex_unlock(&lock);
    return e->stalled ? NOT_READY : 0;
}
int cuEventDestroy_v2(void *event) {
    pthread_mutex_lock(&lock);
    for (int i = 0; i < OPENED; i++)
        if (opened[i] == event) opened[i] = NULL;
    pthread_mutex_unlock(&lock);
    free(event);
    return 0;
}
int cuGetErrorName(int error, const char **text) { *text = error == ILLEGAL_ADDRESS ? "CUDA_ERROR_ILLEGAL_ADDRESS" : "CUDA_ERROR_UNKNOWN"; return 0; }
int cuGetErrorString(int error, const char **text) { *text = "an illegal memory access was encountered (fake)"; return 0; }
/* ---- what a GPU pair uses: device memory another process maps, copies between device buffers, the add ---- */
typedef struct { char reserved[64]; } ipc_handle;  /* CUipcMemHandle, CUipcEventHandle: passed by value to open */
struct shared { pid_t pid; int fd; size_t nbytes; };  /* an IPC handle of memory: where the other process opens it */
enum { MAPPINGS = 64 };
static struct { uintptr_t at; size_t nbytes; int fd; } mappings[MAPPINGS];  /* ours and those opened, by address */

static void mapped(uintptr_t at, size_t nbytes, int fd) {  /* under lock */
    for (int i = 0; i < MAPPINGS; i++)
        if (!mappings[i].at) { mappings[i].at = at; mappings[i].nbytes = nbytes; mappings[i].fd = fd; return; }
    fprintf(stderr, "fake libcuda: more than %d device buffers\n", MAPPINGS);
    abort();
}
static int unmapped(uintptr_t at) {  /* under lock: its fd (-1 for one opened by handle) */
    for (int i = 0; i < MAPPINGS; i++)
        if (mappings[i].at == at) {
            munmap((void *)at, mappings[i].nbytes);
            mappings[i].at = 0;
            return mappings[i].fd;
        }
    fprintf(stderr, "fake libcuda: no device buffer at %#lx\n", (unsigned long)at);
    abort();
}
int cuDeviceGetCount(int *count) { *count = 1; return 0; }
int cuDeviceGetUuid_v2(unsigned char *uuid, int device) {  /* a CUuuid: 16 bytes, the same for a device's ranks */
    memset(uuid, 0, 16);
    snprintf((char *)uuid, 16, "fake-gpu-%d", device);
    return 0;
}
int cuDeviceCanAccessPeer(int *can, int device, int peer) { *can = 1; return 0; }
int cuDeviceGetP2PAttribute(int *value, int attribute, int device, int peer) { *value = 1; return 0; }
int cuMemAlloc_v2(uintptr_t *at, size_t nbytes) {
    in_context("an allocation");
    int fd = memfd_create("fake-cuda", MFD_CLOEXEC);  /* another process opens it as /proc/<pid>/fd/<fd> */
    void *p = fd < 0 || ftruncate(fd, (off_t)nbytes) ? MAP_FAILED
                                                     : mmap(NULL, nbytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        if (fd >= 0) close(fd);
        return 2;  /* CUDA_ERROR_OUT_OF_MEMORY */
    }
    pthread_mutex_lock(&lock);
    mapped(*at = (uintptr_t)p, nbytes, fd);
    pthread_mutex_unlock(&lock);
    return 0;
}
int cuMemFree_v2(uintptr_t at) {
    pthread_mutex_lock(&lock);
    close(unmapped(at));
    pthread_mutex_unlock(&lock);
    return 0;
}
int cuIpcGetMemHandle(ipc_handle *handle, uintptr_t at) {
    struct shared shared = {getpid(), -1, 0};
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAPPINGS; i++)
        if (mappings[i].at == at && mappings[i].fd >= 0) { shared.fd = mappings[i].fd; shared.nbytes = mappings[i].nbytes; }
    pthread_mutex_unlock(&lock);
    if (shared.fd < 0) return 1;  /* CUDA_ERROR_INVALID_VALUE: not an allocation of ours */
    memset(handle, 0, sizeof *handle);
    memcpy(handle->reserved, &shared, sizeof shared);
    return 0;
}
int cuIpcOpenMemHandle_v2(uintptr_t *at, ipc_handle handle, unsigned int flags) {
    struct shared shared;
    char path[64];
    memcpy(&shared, handle.reserved, sizeof shared);
    in_context("an IPC open");
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)shared.pid, shared.fd);
    int fd = open(path, O_RDWR);
    void *p = fd < 0 ? MAP_FAILED : mmap(NULL, shared.nbytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (fd >= 0) close(fd);
    if (p == MAP_FAILED) return 1;
    pthread_mutex_lock(&lock);
    mapped(*at = (uintptr_t)p, shared.nbytes, -1);
    pthread_mutex_unlock(&lock);
    return 0;
}
int cuIpcCloseMemHandle(uintptr_t at) {
    pthread_mutex_lock(&lock);
    unmapped(at);
    pthread_mutex_unlock(&lock);
    return 0;
}
int cuIpcGetEventHandle(ipc_handle *handle, void *event) { memset(handle, 0, sizeof *handle); return 0; }
int cuIpcOpenEventHandle(void **event, ipc_handle handle) {
    *event = calloc(1, sizeof(struct event));
    pthread_mutex_lock(&lock);
    for (int i = 0; i < OPENED && *event; i++)
        if (!opened[i]) { opened[i] = *event; break; }
    pthread_mutex_unlock(&lock);
    return 0;
}
int cuMemcpyDtoDAsync_v2(uintptr_t dst, uintptr_t src, size_t nbytes, uintptr_t handle) {
    if (failing(&copies, "FAKE_CUDA_FAIL_AT")) return ILLEGAL_ADDRESS;
    in_context("a device copy");
    pthread_mutex_lock(&lock);
    struct stream *s = stream_of(handle);
    run_until(s, s->queued);
    memcpy((void *)dst, (const void *)src, nbytes);
    pthread_mutex_unlock(&lock);
    return 0;
}
int cuModuleLoadData(void **module, const void *image) { *module = calloc(1, 1); return 0; }
int cuModuleUnload(void *module) { free(module); return 0; }
int cuModuleGetFunction(void **function, void *module, const char *name) { *function = strdup(name); return 0; }

/* hfr/pairs.py's adds: acc[i] = a op b, a the lower rank's (acc's where acc_first), in the wide type W; sums
 * and products in U, the unsigned type for the integer kinds, so that they wrap without undefined behaviour */
static float bf16_wide(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }
static uint16_t bf16_narrow(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);  /* a quiet NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float fp16_wide(uint16_t h) { _Float16 v; memcpy(&v, &h, 2); return (float)v; }
static uint16_t fp16_narrow(float f) { _Float16 v = (_Float16)f; uint16_t h; memcpy(&h, &v, 2); return h; }
#define SAME(v) (v)
#define SUM(U, a, b) ((U)(a) + (U)(b))
#define PROD(U, a, b) ((U)(a) * (U)(b))
#define MAX(U, a, b) (((a) > (b)) | ((a) != (a)) ? (a) : (b))  /* a NaN of either side, as np.maximum */
#define MIN(U, a, b) (((a) < (b)) | ((a) != (a)) ? (a) : (b))
#define LOOP(OP, T, W, U, WIDE, NARROW) \
    for (unsigned long long i = 0; i < n; i++) { \
        W mine = WIDE(acc[i]), theirs = WIDE(other[i]); \
        W a = acc_first ? mine : theirs, b = acc_first ? theirs : mine; \
        acc[i] = (T)NARROW(OP(U, a, b)); \
    }
#define ADD(KIND, T, W, U, WIDE, NARROW) \
    static void add_##KIND(void *acc_, const void *other_, unsigned long long n, int acc_first, int op) { \
        T *acc = acc_; \
        const T *other = other_; \
        switch (op) { \
        case 0: LOOP(SUM, T, W, U, WIDE, NARROW) break; \
        case 1: LOOP(MAX, T, W, U, WIDE, NARROW) break; \
        case 2: LOOP(MIN, T, W, U, WIDE, NARROW) break; \
        default: LOOP(PROD, T, W, U, WIDE, NARROW) \
        } \
    }
ADD(f32, float, float, float, SAME, SAME)
ADD(f64, double, double, double, SAME, SAME)
ADD(i8, int8_t, int8_t, uint8_t, SAME, SAME)
ADD(u8, uint8_t, uint8_t, uint8_t, SAME, SAME)
ADD(i32, int32_t, int32_t, uint32_t, SAME, SAME)
ADD(u32, uint32_t, uint32_t, uint32_t, SAME, SAME)
ADD(i64, int64_t, int64_t, uint64_t, SAME, SAME)
ADD(u64, uint64_t, uint64_t, uint64_t, SAME, SAME)
ADD(bf16, uint16_t, float, float, bf16_wide, bf16_narrow)
ADD(fp16, uint16_t, float, float, fp16_wide, fp16_narrow)
static const char *const ops[] = {"sum", "max", "min", "prod"};  /* in add_*'s cases */
static const struct { const char *kind; void (*add)(void *, const void *, unsigned long long, int, int); } adds[] = {
    {"f32", add_f32}, {"f64", add_f64}, {"i8", add_i8}, {"u8", add_u8}, {"i32", add_i32}, {"u32", add_u32},
    {"i64", add_i64}, {"u64", add_u64}, {"bf16", add_bf16}, {"fp16", add_fp16}};

int cuLaunchKernel(void *function, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by,
                   unsigned int bz, unsigned int shared_bytes, uintptr_t handle, void **params, void **extra) {
    const char *name = function;  /* cuModuleGetFunction's copy of the name */
    char kind[8], op[8];
    int end = 0, k = -1, o = -1;
    if (failing(&launches, "FAKE_CUDA_FAIL_LAUNCH")) return ILLEGAL_ADDRESS;
    in_context("a launch");
    if (sscanf(name, "hfr_pair_%7[a-z0-9]_%7[a-z]%n", kind, op, &end) == 2 && !name[end]) {
        for (int i = 0; i < (int)(sizeof adds / sizeof adds[0]); i++)
            if (!strcmp(adds[i].kind, kind)) k = i;
        for (int i = 0; i < (int)(sizeof ops / sizeof ops[0]); i++)
            if (!strcmp(ops[i], op)) o = i;
    }
    if (k < 0 || o < 0) {
        fprintf(stderr, "fake libcuda: no kernel %s\n", name);
        abort();
    }
    pthread_mutex_lock(&lock);
    struct stream *s = stream_of(handle);
    run_until(s, s->queued);
    adds[k].add(*(void **)params[0], *(void **)params[1], *(unsigned long long *)params[2], *(int *)params[3], o);
    pthread_mutex_unlock(&lock);
    return 0;
}
int fake_launches(void) { return launches; }
int fake_copies(void) { return copies; }
int fake_depth(void) { return depth; }
