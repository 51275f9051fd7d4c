# The C entry of hfr/_cuda.pyx, for hfr/_node_call.pyx (which stages a CUDA array's call with it).
from libc.stdint cimport uintptr_t

from hfr._simd cimport KIND_COUNT, OP_COUNT

cdef enum:
    CALL_EVENTS = 6  # events of a device's, made once, that a call records after its copies (hfr/_node_call.pyx)
    CUDA_EVENTS = CALL_EVENTS + 1  # and one on the caller's stream (order)
    PAIR_EVENTS = 6  # interprocess events a GPU pair's rank records after its pushes to its partner
    PAIR_OPS = OP_COUNT  # the pair's add kernels, one per element kind (hfr/_simd.pxd's Kind) and op
    PAIR_KERNELS = KIND_COUNT * PAIR_OPS
    UUID_BYTES = 16
    IPC_HANDLE_BYTES = 64
    NOT_READY = 600  # CUDA_ERROR_NOT_READY: what ran() says of work not run yet
    DRAINED = -1  # ran()'s event for all the work queued on the call's streams


cdef enum Link:  # how a GPU pair's devices reach each other (link)
    NO_LINK = -1  # no peer access, or a kind the setting does not pair over (the pair stays apart)
    UNLINKED = 0  # not known yet: the partner has not published its record
    LINKED = 1  # its buffers and events opened: the pair can work together


cdef struct PairRecord:  # what a rank publishes to its partner (in its control row: hfr/_node_call.pyx)
    unsigned char uuid[UUID_BYTES]  # its device's
    char boxes[IPC_HANDLE_BYTES]  # IPC handle of its boxes: the inbox, then the outbox
    char events[PAIR_EVENTS][IPC_HANDLE_BYTES]


cdef struct Pair:  # this rank's side of its GPU pair (hfr/_node_call.pyx's terms), made by Device.prepare_pair
    uintptr_t boxes  # our device buffer: the inbox, then the outbox, each box_bytes
    size_t box_bytes
    void* events[PAIR_EVENTS]  # ours, interprocess
    uintptr_t kernels[PAIR_KERNELS]  # the add's CUfunction by kind * PAIR_OPS + op; all 0: no pair prepared
    bint one_device  # a partner on our own device links (hfr/pairs.py's policy)
    bint any_peer  # a partner on a peer device links over any peer access, not only NVLink's
    Link link
    uintptr_t partner_boxes  # the partner's, opened once LINKED
    void* partner_events[PAIR_EVENTS]


cdef struct Cuda:  # one device's copies, as a call runs them from C
    void* context  # the device's primary context, retained by its Device
    int device  # the driver's handle of it
    void* events[CUDA_EVENTS]  # made on the first enter()
    uintptr_t own[2]  # the device's own two streams, one each way, made on the first enter()
    bint pushed  # enter() made the context current (leave() pops it)
    uintptr_t caller  # the call's caller's stream, the one its x and out are used on
    void* ready  # an event recorded on it when the call was queued, or NULL (a call run on its caller's thread)
    uintptr_t to_host, to_device  # the call's streams, one each way (they may be one), as order() chose them
    Pair pair


cdef int enter(Cuda* cuda) noexcept nogil
cdef void leave(Cuda* cuda) noexcept nogil
cdef int order(Cuda* cuda, bint several) noexcept nogil
cdef int copy(Cuda* cuda, char* dst, const char* src, size_t nbytes, bint to_host) noexcept nogil
cdef int record(Cuda* cuda, int event, bint to_host) noexcept nogil
cdef int ran(Cuda* cuda, int event) noexcept nogil
cdef int link(Cuda* cuda, const PairRecord* partner) noexcept nogil
cdef int push(Cuda* cuda, uintptr_t dst, const char* src, size_t nbytes, bint to_host) noexcept nogil
cdef int record_pushed(Cuda* cuda, int event, bint to_host) noexcept nogil
cdef int after_partner(Cuda* cuda, int event, bint to_host) noexcept nogil
cdef int pair_add(Cuda* cuda, int kernel, uintptr_t acc, const char* other, size_t count, bint acc_first) noexcept nogil


cdef class Device:
    cdef Cuda cuda
