# cython: language_level=3
"""Copies between a CUDA device and page-locked host memory, from C with the GIL released: the staging
of a CUDA array's call (hfr/_node_call.pyx), where CuPy's Python wrappers around the same calls cost more
than the copy of a small array.

The CUDA driver's functions (libcuda.so.1, which CuPy and torch load too) are looked up when the engine first
meets a CUDA array (bind), so hfr builds and imports without CUDA. A call's copies run on the two streams
order() chooses, its caller's (a handle CuPy's and torch's streams give as .ptr: the driver's and the
runtime's are one) or the device's own, queued without waiting (copy), each direction's followed by an event
where the call needs to know that they ran (record, then ran polls it: a blocking wait would outlive the
call's timeout and Ctrl-C where a stream waits on a GPU pair partner that never comes); the device's primary context (the one CuPy and
torch use) is current from enter() to leave(), whatever context the calling thread had. A GPU pair's rank
(hfr/_node_call.pyx) also pushes into its partner's buffers, opened by CUDA IPC handles (link), waits on
the partner's interprocess events on the device (after_partner), and adds the pair's halves with a small
kernel (pair_add; hfr/pairs.py compiles it).
"""
from libc.stdint cimport uintptr_t
from libc.string cimport memcmp, memcpy

import ctypes

ctypedef int (*init_fn)(unsigned int flags) noexcept nogil
ctypedef int (*device_get_fn)(int* device, int ordinal) noexcept nogil
ctypedef int (*retain_fn)(void** context, int device) noexcept nogil
ctypedef int (*release_fn)(int device) noexcept nogil
ctypedef int (*get_context_fn)(void** context) noexcept nogil
ctypedef int (*push_fn)(void* context) noexcept nogil
ctypedef int (*to_host_fn)(void* dst, uintptr_t src, size_t nbytes, uintptr_t stream) noexcept nogil
ctypedef int (*to_device_fn)(uintptr_t dst, const void* src, size_t nbytes, uintptr_t stream) noexcept nogil
ctypedef int (*stream_fn)(uintptr_t stream) noexcept nogil
ctypedef int (*event_create_fn)(void** event, unsigned int flags) noexcept nogil
ctypedef int (*event_record_fn)(void* event, uintptr_t stream) noexcept nogil
ctypedef int (*event_fn)(void* event) noexcept nogil
ctypedef int (*error_text_fn)(int error, const char** text) noexcept nogil
ctypedef int (*stream_create_fn)(uintptr_t* stream, unsigned int flags) noexcept nogil
ctypedef int (*stream_wait_fn)(uintptr_t stream, void* event, unsigned int flags) noexcept nogil
ctypedef int (*count_fn)(int* count) noexcept nogil
ctypedef int (*uuid_fn)(unsigned char* uuid, int device) noexcept nogil
ctypedef int (*peer_fn)(int* can, int device, int peer) noexcept nogil
ctypedef int (*p2p_attribute_fn)(int* value, int attribute, int device, int peer) noexcept nogil
ctypedef int (*alloc_fn)(uintptr_t* pointer, size_t nbytes) noexcept nogil
ctypedef int (*free_fn)(uintptr_t pointer) noexcept nogil
ctypedef int (*device_copy_fn)(uintptr_t dst, uintptr_t src, size_t nbytes, uintptr_t stream) noexcept nogil
ctypedef struct IpcHandle:
    char reserved[IPC_HANDLE_BYTES]
ctypedef int (*ipc_get_memory_fn)(IpcHandle* handle, uintptr_t pointer) noexcept nogil
ctypedef int (*ipc_open_memory_fn)(uintptr_t* pointer, IpcHandle handle, unsigned int flags) noexcept nogil
ctypedef int (*ipc_get_event_fn)(IpcHandle* handle, void* event) noexcept nogil
ctypedef int (*ipc_open_event_fn)(void** event, IpcHandle handle) noexcept nogil
ctypedef int (*launch_fn)(uintptr_t function, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                          unsigned int by, unsigned int bz, unsigned int shared_bytes, uintptr_t stream, void** params,
                          void** extra) noexcept nogil

cdef init_fn cu_init = NULL
cdef device_get_fn cu_device_get
cdef retain_fn cu_primary_retain
cdef release_fn cu_primary_release
cdef get_context_fn cu_get_current, cu_pop_current
cdef push_fn cu_push_current
cdef to_host_fn cu_to_host
cdef to_device_fn cu_to_device
cdef stream_fn cu_stream_query
cdef event_create_fn cu_event_create
cdef event_record_fn cu_event_record
cdef event_fn cu_event_query, cu_event_destroy
cdef error_text_fn cu_error_name, cu_error_string
cdef stream_create_fn cu_stream_create
cdef stream_wait_fn cu_stream_wait_event
cdef stream_fn cu_stream_destroy
cdef count_fn cu_device_count
cdef uuid_fn cu_device_uuid
cdef peer_fn cu_can_access_peer
cdef p2p_attribute_fn cu_p2p_attribute
cdef alloc_fn cu_alloc
cdef free_fn cu_free, cu_ipc_close_memory
cdef device_copy_fn cu_device_copy
cdef ipc_get_memory_fn cu_ipc_get_memory
cdef ipc_open_memory_fn cu_ipc_open_memory
cdef ipc_get_event_fn cu_ipc_get_event
cdef ipc_open_event_fn cu_ipc_open_event
cdef launch_fn cu_launch
_driver = None  # libcuda.so.1, once bound


def bind() -> None:
    """Look the driver's functions up (once): OSError where libcuda.so.1 is missing."""
    global cu_init, cu_device_get, cu_primary_retain, cu_primary_release, cu_get_current, cu_pop_current
    global cu_push_current, cu_to_host, cu_to_device, cu_stream_query, cu_error_name, cu_error_string, _driver
    global cu_event_create, cu_event_record, cu_event_query, cu_event_destroy
    global cu_stream_create, cu_stream_wait_event, cu_stream_destroy
    global cu_device_count, cu_device_uuid, cu_can_access_peer, cu_p2p_attribute, cu_alloc, cu_free, cu_device_copy
    global cu_ipc_get_memory, cu_ipc_open_memory, cu_ipc_close_memory, cu_ipc_get_event, cu_ipc_open_event, cu_launch
    if cu_init != NULL:
        return
    _driver = lib = ctypes.CDLL("libcuda.so.1")
    cu_device_get = <device_get_fn>_address(lib, "cuDeviceGet")
    cu_primary_retain = <retain_fn>_address(lib, "cuDevicePrimaryCtxRetain")
    cu_primary_release = <release_fn>_address(lib, "cuDevicePrimaryCtxRelease_v2")
    cu_get_current = <get_context_fn>_address(lib, "cuCtxGetCurrent")
    cu_push_current = <push_fn>_address(lib, "cuCtxPushCurrent_v2")
    cu_pop_current = <get_context_fn>_address(lib, "cuCtxPopCurrent_v2")
    cu_to_host = <to_host_fn>_address(lib, "cuMemcpyDtoHAsync_v2")
    cu_to_device = <to_device_fn>_address(lib, "cuMemcpyHtoDAsync_v2")
    cu_stream_query = <stream_fn>_address(lib, "cuStreamQuery")
    cu_event_create = <event_create_fn>_address(lib, "cuEventCreate")
    cu_event_record = <event_record_fn>_address(lib, "cuEventRecord")
    cu_event_query = <event_fn>_address(lib, "cuEventQuery")
    cu_event_destroy = <event_fn>_address(lib, "cuEventDestroy_v2")
    cu_stream_create = <stream_create_fn>_address(lib, "cuStreamCreate")
    cu_stream_wait_event = <stream_wait_fn>_address(lib, "cuStreamWaitEvent")
    cu_stream_destroy = <stream_fn>_address(lib, "cuStreamDestroy_v2")
    cu_device_count = <count_fn>_address(lib, "cuDeviceGetCount")
    cu_device_uuid = <uuid_fn>_address(lib, "cuDeviceGetUuid_v2")
    cu_can_access_peer = <peer_fn>_address(lib, "cuDeviceCanAccessPeer")
    cu_p2p_attribute = <p2p_attribute_fn>_address(lib, "cuDeviceGetP2PAttribute")
    cu_alloc = <alloc_fn>_address(lib, "cuMemAlloc_v2")
    cu_free = <free_fn>_address(lib, "cuMemFree_v2")
    cu_device_copy = <device_copy_fn>_address(lib, "cuMemcpyDtoDAsync_v2")
    cu_ipc_get_memory = <ipc_get_memory_fn>_address(lib, "cuIpcGetMemHandle")
    cu_ipc_open_memory = <ipc_open_memory_fn>_address(lib, "cuIpcOpenMemHandle_v2")
    cu_ipc_close_memory = <free_fn>_address(lib, "cuIpcCloseMemHandle")
    cu_ipc_get_event = <ipc_get_event_fn>_address(lib, "cuIpcGetEventHandle")
    cu_ipc_open_event = <ipc_open_event_fn>_address(lib, "cuIpcOpenEventHandle")
    cu_launch = <launch_fn>_address(lib, "cuLaunchKernel")
    cu_error_name = <error_text_fn>_address(lib, "cuGetErrorName")
    cu_error_string = <error_text_fn>_address(lib, "cuGetErrorString")
    cu_init = <init_fn>_address(lib, "cuInit")


cdef uintptr_t _address(lib, str name) except 0:
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def error_text(int error) -> str:
    """The driver's name and words for a CUresult."""
    cdef const char* name = NULL
    cdef const char* words = NULL
    if cu_init == NULL or cu_error_name(error, &name) or cu_error_string(error, &words):
        return f"CUDA error {error}"
    return f"{name.decode()}: {words.decode()}"


cdef enum:
    EVENT_DISABLE_TIMING = 2  # CU_EVENT_DISABLE_TIMING
    STREAM_NON_BLOCKING = 1  # CU_STREAM_NON_BLOCKING
    CALLER_READY = CALL_EVENTS  # the event order() records on the caller's stream


cdef int _push(Cuda* cuda) noexcept nogil:
    """Make the device's primary context current, if it is not. Returns the CUresult; leave() after."""
    cdef void* current = NULL
    cdef int error = cu_get_current(&current)
    cuda.pushed = False
    if not error and current != cuda.context:
        error = cu_push_current(cuda.context)
        cuda.pushed = not error
    return error


cdef int enter(Cuda* cuda) noexcept nogil:
    """Make the device's primary context current for the copies that follow (made its events and its own
    streams, the first time). Returns the CUresult (0: entered); leave() after either way."""
    cdef int error = _push(cuda), i = 0
    while not error and i < CUDA_EVENTS:
        if cuda.events[i] == NULL:
            error = cu_event_create(&cuda.events[i], EVENT_DISABLE_TIMING)
        i += 1
    i = 0
    while not error and i < 2:
        if cuda.own[i] == 0:
            error = cu_stream_create(&cuda.own[i], STREAM_NON_BLOCKING)
        i += 1
    return error


cdef void leave(Cuda* cuda) noexcept nogil:
    """The calling thread's context back as it was before enter()."""
    cdef void* popped = NULL
    if cuda.pushed:
        cu_pop_current(&popped)
        cuda.pushed = False


cdef int order(Cuda* cuda, bint several) noexcept nogil:
    """Choose the call's streams (to_host, to_device), the context entered: a call of one chunk run on its
    caller's thread (ready NULL) copies on the caller's stream both ways, in its order, with no event; any
    other on the device's own two streams, so that its chunks copy both ways at once, after the caller's
    work: that queued when the call was (ready), or, without ready, that queued by now (an event recorded
    on the caller's stream here). Returns the CUresult."""
    cdef void* after = cuda.ready
    cdef int error = 0
    if after == NULL and not several:
        cuda.to_host = cuda.to_device = cuda.caller
        return 0
    if after == NULL:
        after = cuda.events[CALLER_READY]
        error = cu_event_record(after, cuda.caller)
    cuda.to_host, cuda.to_device = cuda.own[0], cuda.own[1]
    if not error:
        error = cu_stream_wait_event(cuda.to_host, after, 0)
    if not error:
        error = cu_stream_wait_event(cuda.to_device, after, 0)
    return error


cdef int copy(Cuda* cuda, char* dst, const char* src, size_t nbytes, bint to_host) noexcept nogil:
    """Queue a copy of nbytes from src to dst, device to host (to_host, on stream to_host) or host to device
    (on stream to_device). Returns the CUresult of queueing it."""
    if to_host:
        return cu_to_host(dst, <uintptr_t>src, nbytes, cuda.to_host)
    return cu_to_device(<uintptr_t>dst, src, nbytes, cuda.to_device)


cdef int record(Cuda* cuda, int event, bint to_host) noexcept nogil:
    """Record events[event] after what is queued so far on the stream of that direction."""
    return cu_event_record(cuda.events[event], cuda.to_host if to_host else cuda.to_device)


cdef int ran(Cuda* cuda, int event) noexcept nogil:
    """Whether what events[event] was recorded after has run (event DRAINED: all that is queued on the call's
    streams): 0, NOT_READY not yet, or the CUresult it failed with."""
    cdef int error
    if event != DRAINED:
        return cu_event_query(cuda.events[event])
    error = cu_stream_query(cuda.to_host)
    if error == 0 and cuda.to_device != cuda.to_host:
        error = cu_stream_query(cuda.to_device)
    return error


# ---- GPU pairs (hfr/_node_call.pyx's terms): a rank's pushes into its partner's boxes, the add of the pair ----

cdef enum:
    EVENT_INTERPROCESS = 4  # CU_EVENT_INTERPROCESS
    IPC_LAZY_ENABLE_PEER_ACCESS = 1  # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
    P2P_NATIVE_ATOMICS = 3  # CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED: NVLink has them, PCIe does not
    ADD_THREADS = 256  # a block of the add
    ADD_BLOCKS = 1024  # at most, each thread striding over the rest


cdef int _peer(Cuda* cuda, const unsigned char* uuid, bint* linked) noexcept nogil:
    """linked: the device of that uuid is ours (where the pair's one_device), or one ours reaches as a peer
    (over NVLink, by its native atomics, unless the pair's any_peer). Returns the CUresult."""
    cdef unsigned char other[UUID_BYTES]
    cdef int count = 0, device = -1, i, can = 0, atomics = 0
    cdef int error = cu_device_uuid(other, cuda.device)
    linked[0] = False
    if error or memcmp(other, uuid, UUID_BYTES) == 0:
        linked[0] = not error and cuda.pair.one_device
        return error
    error = cu_device_count(&count)
    i = 0
    while not error and i < count and device < 0:
        error = cu_device_get(&device, i)
        if not error:
            error = cu_device_uuid(other, device)
        if not error and memcmp(other, uuid, UUID_BYTES) != 0:
            device = -1
        i += 1
    if error or device < 0:
        return error
    error = cu_can_access_peer(&can, cuda.device, device)
    if not error and can and not cuda.pair.any_peer:
        error = cu_p2p_attribute(&atomics, P2P_NATIVE_ATOMICS, cuda.device, device)
        can = atomics
    linked[0] = not error and can
    return error


cdef int link(Cuda* cuda, const PairRecord* partner) noexcept nogil:
    """The pair's link, once the partner's record is published (the context entered): NO_LINK where its device
    is not ours nor a peer of ours (_peer), else its boxes and events opened (LINKED). Returns the CUresult."""
    cdef Pair* pair = &cuda.pair
    cdef bint linked
    cdef IpcHandle handle
    cdef int error = _peer(cuda, partner.uuid, &linked), i
    if error or not linked:
        pair.link = NO_LINK if not error else UNLINKED
        return error
    memcpy(handle.reserved, partner.boxes, IPC_HANDLE_BYTES)
    error = cu_ipc_open_memory(&pair.partner_boxes, handle, IPC_LAZY_ENABLE_PEER_ACCESS)
    i = 0
    while not error and i < PAIR_EVENTS:
        memcpy(handle.reserved, partner.events[i], IPC_HANDLE_BYTES)
        error = cu_ipc_open_event(&pair.partner_events[i], handle)
        i += 1
    if not error:
        pair.link = LINKED
    return error


cdef int push(Cuda* cuda, uintptr_t dst, const char* src, size_t nbytes, bint to_host) noexcept nogil:
    """Queue a device-to-device copy (into the partner's boxes, or from our outbox) on the stream of that
    direction. Returns the CUresult of queueing it."""
    return cu_device_copy(dst, <uintptr_t>src, nbytes, cuda.to_host if to_host else cuda.to_device)


cdef int record_pushed(Cuda* cuda, int event, bint to_host) noexcept nogil:
    """Record our pair event `event` (the partner waits for it: after_partner) after what that stream queued."""
    return cu_event_record(cuda.pair.events[event], cuda.to_host if to_host else cuda.to_device)


cdef int after_partner(Cuda* cuda, int event, bint to_host) noexcept nogil:
    """Order what that stream queues next after the work the partner's pair event `event` was last recorded
    after (record_pushed, as its counter said)."""
    return cu_stream_wait_event(cuda.to_host if to_host else cuda.to_device, cuda.pair.partner_events[event], 0)


cdef int pair_add(Cuda* cuda, int kernel, uintptr_t acc, const char* other, size_t count, bint acc_first) noexcept nogil:
    """Queue the pair's add on the to_host stream: acc[i] = acc[i] op other[i] for count elements (other's
    first where not acc_first: the lower local rank's comes first), by kernel (kind * PAIR_OPS + op)."""
    cdef unsigned long long n = count
    cdef int first = acc_first
    cdef void* params[4]
    params[0], params[1], params[2], params[3] = &acc, &other, &n, &first
    cdef unsigned int blocks = <unsigned int>min((count + ADD_THREADS - 1) // ADD_THREADS, <size_t>ADD_BLOCKS)
    return cu_launch(cuda.pair.kernels[kernel], max(blocks, 1), 1, 1, ADD_THREADS, 1, 1, 0, cuda.to_host, params,
                     NULL)


cdef class Device:
    """One CUDA device (its ordinal, as CuPy and torch number them), its primary context retained until
    this object goes (the engine's CudaCopies holds it, with the page-locked staging, past close())."""

    def __cinit__(self, int ordinal):
        bind()
        cdef int device = -1, error = cu_init(0)
        if not error:
            error = cu_device_get(&device, ordinal)
        if not error:
            error = cu_primary_retain(&self.cuda.context, device)
        if error:
            raise RuntimeError(f"CUDA device {ordinal}: {error_text(error)}")
        self.cuda.device = device

    def prepare_pair(self, size_t box_bytes, kernels, size_t record, bint one_device, bint any_peer) -> None:
        """Make this rank's side of a GPU pair: its inbox and outbox of box_bytes each, its interprocess
        events, the add's kernels (CUfunction handles, by kind * PAIR_OPS + op), and write what the partner
        opens them by into the PairRecord at address `record`; with which partners it links (Pair's
        one_device, any_peer). Once."""
        cdef Pair* pair = &self.cuda.pair
        cdef PairRecord* out = <PairRecord*>record
        cdef IpcHandle handle
        cdef int error, i
        if len(kernels) != PAIR_KERNELS:
            raise ValueError(f"a pair takes {PAIR_KERNELS} kernels, got {len(kernels)}")
        if pair.boxes != 0:
            raise RuntimeError("the pair is prepared already")
        with nogil:
            error = _push(&self.cuda)
            if not error:
                error = cu_alloc(&pair.boxes, 2 * box_bytes)
            i = 0
            while not error and i < PAIR_EVENTS:
                error = cu_event_create(&pair.events[i], EVENT_DISABLE_TIMING | EVENT_INTERPROCESS)
                if not error:
                    error = cu_ipc_get_event(&handle, pair.events[i])
                    memcpy(out.events[i], handle.reserved, IPC_HANDLE_BYTES)
                i += 1
            if not error:
                error = cu_ipc_get_memory(&handle, pair.boxes)
                memcpy(out.boxes, handle.reserved, IPC_HANDLE_BYTES)
            if not error:
                error = cu_device_uuid(out.uuid, self.cuda.device)
            leave(&self.cuda)
        if error:
            raise RuntimeError(f"preparing the GPU pair's buffers and events: {error_text(error)}")
        pair.box_bytes, pair.one_device, pair.any_peer = box_bytes, one_device, any_peer
        for i in range(PAIR_KERNELS):
            pair.kernels[i] = kernels[i]

    def __dealloc__(self):
        cdef int i
        cdef Pair* pair = &self.cuda.pair
        if self.cuda.context == NULL:
            return
        if not _push(&self.cuda):  # whatever enter() and prepare_pair made, in the context it was made in
            for i in range(CUDA_EVENTS):
                if self.cuda.events[i] != NULL:
                    cu_event_destroy(self.cuda.events[i])
            for i in range(2):
                if self.cuda.own[i] != 0:
                    cu_stream_destroy(self.cuda.own[i])
            for i in range(PAIR_EVENTS):
                if pair.events[i] != NULL:
                    cu_event_destroy(pair.events[i])
                if pair.partner_events[i] != NULL:
                    cu_event_destroy(pair.partner_events[i])
            if pair.partner_boxes != 0:
                cu_ipc_close_memory(pair.partner_boxes)
            if pair.boxes != 0:
                cu_free(pair.boxes)
        leave(&self.cuda)
        cu_primary_release(self.cuda.device)
