# cython: language_level=3
"""The calling thread's side of the engine, in C: which calls it takes, which one runs, and the
commonest call run whole without Python.

Admission (the engine's submit, run and close): a call is counted in as unfinished unless the
communicator is closed or has failed (broken), and may run on its caller's thread when no other call is
unfinished; otherwise the progress thread runs it. One call runs at a time, on whichever thread (the
running lock).

allreduce() takes the blocking allreduce, where Python around the C protocol (hfr/_node_call.pyx) cost more
than the protocol (bench/RESULTS.md): checked, admitted, run and counted out here. A NumPy array or a CPU torch
tensor, and once the engine has met a CUDA array (take_cuda) a CuPy array or CUDA tensor on that device, staged
in C after the work queued on the caller's current stream of the device; a tensor read through DLPack's C
exchange API (below: torch from 2.11, or an older one that an extension gave one; with a torch that has none,
the engine's Python takes tensors). It returns None, before admitting it, for anything else, and the engine's
Python takes that call, raising what it raises: another array or argument, one that the checks would refuse, a
call not to be run on this thread (another is unfinished). Across nodes a call runs here in C where the engine
keeps its call shape's rail schedules (by rail_shape_key, in the dict shared with this: which shapes it keeps
is the engine's rule, _kept); another is admitted here and run by the engine's Python (Engine.run_held, which
keeps its schedules if the rule says so), so that no call admitted after it runs first. A failed call is handed
back to the engine, which names the failure as for its own calls.
"""
from cpython.pythread cimport (NOWAIT_LOCK, PY_LOCK_ACQUIRED, WAIT_LOCK, PyLockStatus, PyThread_acquire_lock,
                               PyThread_allocate_lock, PyThread_free_lock, PyThread_get_thread_ident,
                               PyThread_release_lock, PyThread_type_lock)
from cpython.exc cimport PyErr_Clear
from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_IsValid
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t, uintptr_t
from libc.string cimport memcmp

import sys

cimport numpy as cnp

from hfr._cuda cimport Device
from hfr._internode cimport Schedule
from hfr._kernels cimport Kind, kernel_kind, on_caller_team
from hfr._kernels cimport op_code as kernel_op_code
from hfr._kernels import take_caller_team
from hfr._node_call cimport ALLREDUCE, DESCRIPTOR_FIELDS, DONE, STAGES, NodeCall, describe, same_or_apart
from hfr._wait cimport HFR_SIGNAL_CHECK_S, PyErr_CheckSignals, forget_cancel, hfr_nap, hfr_now, raise_pending

cdef extern from "pythread.h":
    PyLockStatus PyThread_acquire_lock_timed(PyThread_type_lock lock, long long microseconds, int intr_flag) nogil

cdef extern from *:
    """
    /* Whether torch has sized this thread's OpenMP team: libgomp keeps a thread count per thread, and torch
       sets it from its own (torch.set_num_threads, OMP_NUM_THREADS) at a thread's first parallel op, or at its
       first torch.get_num_threads(). */
    static __thread int hfr_team_sized;
    """
    int hfr_team_sized

from hfr.arrays import torch_dtypes
from hfr.errors import HFRError
from hfr.ops import DTYPE_CODES, DTYPES, Op, combining, is_float

cnp.import_array()

cdef enum:
    MAX_DTYPES = 16
    OPS = 5  # hfr.Op's members, in their wire order: SUM, AVG, MAX, MIN, PROD
    AVG = 1
    IDLE_NAP_NS = 1000000  # close() looks for the last unfinished call this often


# DLPack's C exchange API (dlpack.h, DLPackExchangeAPI, from DLPack 1.3): a tensor library hangs a table of C
# functions on its tensor type as the capsule __dlpack_c_exchange_api__. dltensor_from_py_object_no_sync
# describes a tensor of that type (its memory, device, dtype, shape and strides, valid until control returns
# to Python) without a Python call or a capsule, in a tenth of the time that reading them from the tensor took
# (bench/RESULTS.md); current_work_stream gives the library's current stream of a device. The structs as
# dlpack.h lays them out (major version 1).
cdef struct DLDevice:
    int32_t device_type  # DL_CPU, DL_CUDA, ...
    int32_t device_id

cdef struct DLDataType:
    uint8_t code  # int, uint, float, bfloat, ...
    uint8_t bits
    uint16_t lanes

cdef struct DLTensor:
    void* data
    DLDevice device
    int32_t ndim
    DLDataType dtype
    int64_t* shape
    int64_t* strides  # in elements; NULL: compact, row-major
    uint64_t byte_offset

ctypedef int (*dltensor_from_fn)(void* py_object, DLTensor* out) noexcept  # 0, or -1 with an exception set
ctypedef int (*current_stream_fn)(int32_t device_type, int32_t device_id, void** stream) noexcept

cdef struct DLPackExchangeAPI:
    uint32_t major  # DLPackVersion
    uint32_t minor
    void* prev_api
    void* managed_tensor_allocator
    void* managed_tensor_from_py_object_no_sync
    void* managed_tensor_to_py_object_no_sync
    dltensor_from_fn dltensor_from_py_object_no_sync  # may be NULL
    current_stream_fn current_work_stream

cdef enum:
    DL_CPU = 1  # DLDeviceType's kDLCPU
    DL_CUDA = 2  # kDLCUDA


cdef struct Operands:  # an allreduce's arrays, as allreduce() found them
    char* x
    char* out
    Py_ssize_t count
    int dtype  # the wire code
    bint cuda  # on the CUDA device: copies on stream
    uintptr_t stream
    bint tensor  # torch tensors


cpdef tuple rail_shape_key(int stage, Py_ssize_t count, int dtype_code, int op_code):
    """The key of a call shape's rail schedules (the engine's _rail_shapes): the stage, the elements,
    and the dtype's and op's wire codes."""
    return (stage, count, dtype_code, op_code)


cpdef tuple rewound(tuple schedules):
    """A kept call shape's schedules (vote, [rail], folded, in_out: the engine's _rail_schedules) rewound for
    its next call; returned."""
    cdef Schedule vote = schedules[0], rail
    vote.rewind()
    for rail in schedules[1]:
        if rail is not None:
            rail.rewind()
    return schedules


cdef class Front:
    cdef PyThread_type_lock order  # guards unfinished and closed; held only in short sections
    cdef PyThread_type_lock running  # held by the call that runs
    cdef unsigned long holder  # the thread that holds running, or 0
    cdef Py_ssize_t unfinished  # calls counted in and not yet out
    cdef bint closed
    cdef public object broken  # what failed a call and left the peers' state unknown: no more calls
    cdef int rank, nnodes
    cdef NodeCall node_call
    cdef object engine  # names failures
    cdef dict rail_shapes
    cdef tuple dtypes, ops, op_names
    cdef dict dtype_codes  # hfr.ops.DTYPE_CODES
    cdef int ndtypes
    cdef Py_ssize_t itemsizes[MAX_DTYPES]
    cdef bint floating[MAX_DTYPES]
    cdef Kind kinds[MAX_DTYPES][OPS]
    cdef int kernel_codes[OPS]
    # CUDA arrays, once the engine has met one (take_cuda): cupy.ndarray (and CUDA tensors) on this device,
    # staged through cuda with staging (hfr/_node_call.pyx) after the caller's current stream: the one
    # cupy.cuda.get_current_stream(device) gives (torch.cuda.current_stream(device) for a tensor)
    cdef object cuda_array, current_stream, staging_buffer
    cdef Device cuda
    cdef int cuda_device
    cdef char* staging
    # torch tensors, once torch is imported: torch.Tensor, its DLPack exchange API (NULL where torch has none),
    # each wire code's DLPack dtype and torch dtype, and what inspect (hfr/arrays.py) asks of a tensor it writes;
    # whether a CPU tensor's call runs its kernels on the caller's OpenMP team (hfr/_kernels.pyx): torch's
    # parallel ops run on OpenMP, and its runtime runs teams for us; torch.get_num_threads, which sizes the
    # calling thread's team as torch's own ops would
    cdef object tensor_type, dlpack_capsule, grad_enabled, increment_version, torch_threads
    cdef bint caller_team
    cdef DLPackExchangeAPI* dlpack
    cdef DLDataType tensor_dtypes[MAX_DTYPES]
    cdef list tensor_torch_dtypes

    def __cinit__(self):
        self.order = PyThread_allocate_lock()
        self.running = PyThread_allocate_lock()
        if self.order == NULL or self.running == NULL:
            raise MemoryError()

    def __init__(self, NodeCall node_call, engine, int rank, int nnodes, dict rail_shapes):
        self.node_call, self.engine, self.rank, self.nnodes = node_call, engine, rank, nnodes
        self.rail_shapes = rail_shapes
        self.dtypes, self.dtype_codes, self.ops = tuple(DTYPES), DTYPE_CODES, tuple(Op)
        self.op_names = tuple(op.value for op in Op)
        self.ndtypes = len(self.dtypes)
        if self.ndtypes > MAX_DTYPES or len(self.ops) != OPS or self.ops[AVG] is not Op.AVG:
            raise RuntimeError(f"hfr/_front.pyx's tables (MAX_DTYPES {MAX_DTYPES}, OPS {OPS}, AVG {AVG}) do not fit "
                               f"hfr.ops ({self.ndtypes} dtypes, ops {self.op_names})")
        cdef int d, k
        for k in range(OPS):
            self.kernel_codes[k] = kernel_op_code(combining(self.ops[k]))
        for d in range(self.ndtypes):
            self.itemsizes[d], self.floating[d] = self.dtypes[d].itemsize, is_float(self.dtypes[d])
            for k in range(OPS):
                self.kinds[d][k] = kernel_kind(self.dtypes[d], self.kernel_codes[k])

    def take_cuda(self, copies) -> None:
        """Take blocking allreduces of CuPy arrays and CUDA tensors on the device of copies (the engine's
        CudaCopies) too."""
        import cupy

        self.cuda, self.cuda_device, self.staging_buffer = copies.driver, copies.device, copies.staging
        self.staging = <char*><uintptr_t>copies.staging_address
        self.current_stream, self.cuda_array = cupy.cuda.get_current_stream, cupy.ndarray

    def __dealloc__(self):
        if self.order != NULL:
            PyThread_free_lock(self.order)
        if self.running != NULL:
            PyThread_free_lock(self.running)

    # --- admission ---------------------------------------------------------------------------
    def admit(self, bint inline) -> bool:
        """Count a new call in (HFRError once closed or failed); True if it may run on the calling thread:
        inline asked, and no other call is unfinished."""
        refused = self._count_in(&inline, False)
        if refused is not None:
            raise refused
        return inline

    cdef object _count_in(self, bint* inline, bint inline_only):
        """Count a call in, under the order lock: returns the HFRError that refuses it (closed or failed),
        else None; *inline becomes whether it may run on the calling thread (asked, and no other call
        unfinished). With inline_only a call that may not run there is not counted in either."""
        PyThread_acquire_lock(self.order, WAIT_LOCK)
        refused = HFRError("the communicator is closed") if self.closed else self.refusal()
        inline[0] = inline[0] and refused is None and self.unfinished == 0
        if refused is None and (inline[0] or not inline_only):
            self.unfinished += 1
        PyThread_release_lock(self.order)
        return refused

    def leave(self) -> None:
        """Count a call out: finished, or never run."""
        PyThread_acquire_lock(self.order, WAIT_LOCK)
        self.unfinished -= 1
        PyThread_release_lock(self.order)

    def close(self) -> None:
        """Refuse new calls."""
        PyThread_acquire_lock(self.order, WAIT_LOCK)
        self.closed = True
        PyThread_release_lock(self.order)

    def wait_idle(self, double timeout) -> bool:
        """Wait up to timeout seconds until no call is unfinished (those running on their callers' threads
        too); returns whether none is."""
        cdef Py_ssize_t unfinished = 1
        cdef double deadline = hfr_now() + timeout
        while True:
            PyThread_acquire_lock(self.order, WAIT_LOCK)
            unfinished = self.unfinished
            PyThread_release_lock(self.order)
            if unfinished == 0:
                return True
            if hfr_now() > deadline:
                return False
            with nogil:
                hfr_nap(IDLE_NAP_NS)
            if PyErr_CheckSignals():
                raise_pending()

    def held_here(self) -> bool:
        """Whether the calling thread holds the running lock: close() called from within a call (by a
        signal handler that interrupted it)."""
        return self.holder == PyThread_get_thread_ident()

    cpdef object refusal(self):
        """The HFRError a call gets once an earlier call failed (broken), else None."""
        if self.broken is None:
            return None
        return HFRError(f"rank {self.rank}: the communicator failed earlier and takes no more calls: {self.broken}")

    def hold(self) -> None:
        """Take the running lock, waiting for the call that holds it with the GIL released; a signal
        handler that raises meanwhile (Ctrl-C) ends the wait with its exception."""
        cdef bint got = PyThread_acquire_lock(self.running, NOWAIT_LOCK)
        while not got:
            with nogil:
                got = PyThread_acquire_lock_timed(self.running, <long long>(HFR_SIGNAL_CHECK_S * 1e6), 0) == PY_LOCK_ACQUIRED
            if not got and PyErr_CheckSignals():
                raise_pending()
        self.holder = PyThread_get_thread_ident()

    def release(self) -> None:
        self.holder = 0
        forget_cancel()
        PyThread_release_lock(self.running)

    # --- the blocking allreduce -----------------------------------------------------------------
    def allreduce(self, x, op, out):
        """comm.allreduce(x, op, out), run here: its result, or None where the
        engine's Python takes the call (the module's docstring says when)."""
        global hfr_team_sized
        cdef Operands o
        if type(x) is cnp.ndarray:
            if not self._host_operands(x, out, &o):
                return None
        elif type(x) is self.cuda_array and self.cuda is not None:
            if not self._cuda_operands(x, out, &o):
                return None
        elif self._is_tensor(x):
            if not self._tensor_operands(x, out, &o):
                return None
        else:
            return None
        cdef int k = self._op_code(op)
        if k < 0 or k == AVG and not self.floating[o.dtype]:
            return None
        cdef bint inline = True  # admitted to run here only when no other call is unfinished
        if self._count_in(&inline, True) is not None or not inline:
            return None
        if o.tensor:  # the tensor that receives is written, as torch's in-place ops count it
            try:
                self.increment_version(((x if out is None else out),))
            except BaseException:
                self.leave()
                raise
        cdef bint held = False
        cdef bint team = o.tensor and not o.cuda and self.caller_team  # in C here, or by the engine's Python
        try:
            self.hold()
            held = True
            if self.broken is not None:  # a call queued before ours failed
                raise self.refusal()
            if team:
                if not hfr_team_sized:  # once a thread: before its first parallel op torch has not sized it
                    self.torch_threads()
                    hfr_team_sized = 1
                on_caller_team(True)
            self._run_held(x, op, out, &o, k)
        finally:
            if team:
                on_caller_team(False)
            if held:
                self.release()
            self.leave()
        return x if out is None else out

    cdef bint _host_operands(self, x, out, Operands* o) except -1:
        """Whether x and out (or None) are NumPy arrays the front takes, as allreduce's checks would pass them:
        of one of our dtypes, C-contiguous, not empty, out writable, of x's dtype and shape, either x's memory
        or apart from it; into o."""
        if out is not None and type(out) is not cnp.ndarray:
            return False
        cdef cnp.ndarray a = <cnp.ndarray>x
        cdef cnp.ndarray b = a if out is None else <cnp.ndarray>out
        o.dtype, o.count = self._dtype_code(<object>cnp.PyArray_DESCR(a)), cnp.PyArray_SIZE(a)
        if o.dtype < 0 or o.count == 0 or b is not a and self._dtype_code(<object>cnp.PyArray_DESCR(b)) != o.dtype:
            return False
        cdef int flags = cnp.NPY_ARRAY_C_CONTIGUOUS
        if not cnp.PyArray_CHKFLAGS(a, flags) or not cnp.PyArray_CHKFLAGS(b, flags | cnp.NPY_ARRAY_WRITEABLE):
            return False
        if b is not a and (cnp.PyArray_NDIM(b) != cnp.PyArray_NDIM(a) or
                           memcmp(cnp.PyArray_DIMS(b), cnp.PyArray_DIMS(a), cnp.PyArray_NDIM(a) * sizeof(cnp.npy_intp))):
            return False
        o.x, o.out, o.cuda, o.stream, o.tensor = <char*>cnp.PyArray_DATA(a), <char*>cnp.PyArray_DATA(b), False, 0, False
        return same_or_apart(<Py_ssize_t>o.x, <Py_ssize_t>o.out, cnp.PyArray_NBYTES(a))

    cdef bint _cuda_operands(self, x, out, Operands* o) except -1:
        """Whether x and out (or None) are CuPy arrays the front takes: on our device, of one of our dtypes,
        C-contiguous, not empty, out of x's dtype and shape, apart from x or x itself; into o."""
        y = x if out is None else out
        if type(y) is not self.cuda_array:
            return False
        x_memory, y_memory = x.data, y.data
        o.dtype, o.count = self._dtype_code(x.dtype), x.size
        if o.dtype < 0 or o.count == 0 or x_memory.device_id != self.cuda_device:
            return False
        if y is not x and (y_memory.device_id != self.cuda_device or self._dtype_code(y.dtype) != o.dtype
                           or y.shape != x.shape):
            return False
        if not (x.flags.c_contiguous and y.flags.c_contiguous):
            return False
        o.x, o.out = <char*><uintptr_t>x_memory.ptr, <char*><uintptr_t>y_memory.ptr
        if not same_or_apart(<Py_ssize_t>o.x, <Py_ssize_t>o.out, o.count * self.itemsizes[o.dtype]):
            return False
        o.cuda, o.stream, o.tensor = True, self.current_stream(self.cuda_device).ptr, False
        return True

    cdef bint _is_tensor(self, x) except -1:
        """Whether x is a torch.Tensor (not a subclass); torch's types are taken once torch is imported."""
        if self.tensor_type is None:
            torch = sys.modules.get("torch")
            if torch is None or not hasattr(torch, "autograd"):  # not imported, or not yet whole
                return False
            self.grad_enabled, self.increment_version = torch.is_grad_enabled, torch._C._increment_version
            self._take_dlpack(torch)
            self.caller_team = ("ATen parallel backend: OpenMP" in torch.__config__.parallel_info()
                                and take_caller_team())
            self.torch_threads = torch.get_num_threads
            self.tensor_type = torch.Tensor
        return type(x) is self.tensor_type

    cdef _take_dlpack(self, torch):
        """torch.Tensor's DLPack exchange API, where torch has one of a major version we know and a version bump
        that takes an iterable of tensors (torch._C._increment_version: torch.autograd.graph.increment_version
        without its Python frame, from torch 2.5 on), and the DLPack dtype of each of our dtypes, as torch
        describes a CPU tensor of it."""
        capsule = getattr(torch.Tensor, "__dlpack_c_exchange_api__", None)
        if capsule is None or not PyCapsule_IsValid(capsule, "dlpack_exchange_api"):
            return
        try:
            self.increment_version(())
        except TypeError:  # torch 2.4's takes one tensor
            return
        cdef DLPackExchangeAPI* api = <DLPackExchangeAPI*>PyCapsule_GetPointer(capsule, "dlpack_exchange_api")
        if api.major != 1 or api.dltensor_from_py_object_no_sync == NULL or api.current_work_stream == NULL:
            return
        cdef DLTensor t
        cdef int d
        for d in range(MAX_DTYPES):
            self.tensor_dtypes[d].code, self.tensor_dtypes[d].bits = 255, 0  # none: no tensor has it
        self.tensor_torch_dtypes = [None] * MAX_DTYPES
        for theirs, ours in torch_dtypes(torch).items():
            sample = torch.empty(1, dtype=theirs, device="cpu")
            if api.dltensor_from_py_object_no_sync(<void*>sample, &t):
                PyErr_Clear()
                return
            d = self.dtype_codes[ours]
            self.tensor_dtypes[d], self.tensor_torch_dtypes[d] = t.dtype, theirs
        self.dlpack, self.dlpack_capsule = api, capsule

    cdef bint _tensor_operands(self, x, out, Operands* o) except -1:
        """Whether x and out (or None) are tensors the front takes, as inspect (hfr/arrays.py) would pass them:
        described by torch's DLPack exchange API, both on the CPU or both on our CUDA device (once take_cuda),
        of one of our dtypes, contiguous, not empty, with memory, without torch's negative bit (a lazy negation,
        which DLPack does not carry), the one written not requiring grad while grad mode is on, out of x's dtype
        and shape, either x's memory or apart from it; into o. A CUDA tensor's copies follow torch's current
        stream of the device."""
        cdef DLTensor a, b
        if not self._described(x, &a):
            return False
        cdef bint cuda = a.device.device_type == DL_CUDA
        if not (a.device.device_type == DL_CPU
                or cuda and a.device.device_id == self.cuda_device and self.cuda is not None):
            return False
        o.dtype, o.count = self._tensor_dtype(a.dtype), _contiguous_count(&a)
        if o.dtype < 0 or o.count <= 0 or a.data == NULL:  # no memory: freed storage, torch's zero tensors
            return False
        o.x = o.out = <char*>a.data + a.byte_offset
        y = x
        if out is not None:  # in place needs no second look
            y = out
            if type(y) is not self.tensor_type or not self._described(y, &b):
                return False
            if (b.device.device_type != a.device.device_type or b.device.device_id != a.device.device_id
                    or self._tensor_dtype(b.dtype) != o.dtype or b.ndim != a.ndim
                    or memcmp(b.shape, a.shape, a.ndim * sizeof(int64_t)) or _contiguous_count(&b) != o.count
                    or b.data == NULL):
                return False
            o.out = <char*>b.data + b.byte_offset
        # Python from here on (the DLTensors' shapes are read): torch's dtype where DLPack's says too little
        # (its 1- to 7-bit integers are described as 8-bit), the negative bit, grad (grad mode read only for a
        # tensor that requires it)
        cdef object dtype = self.tensor_torch_dtypes[o.dtype]
        if self.tensor_dtypes[o.dtype].bits == 8 and (x.dtype is not dtype or y.dtype is not dtype):
            return False
        if x.is_neg() or y is not x and y.is_neg() or y.requires_grad and self.grad_enabled():
            return False
        o.cuda, o.stream, o.tensor = cuda, 0, True
        if cuda:
            self._current_stream(a.device.device_id, &o.stream)
        return same_or_apart(<Py_ssize_t>o.x, <Py_ssize_t>o.out, o.count * self.itemsizes[o.dtype])

    cdef bint _described(self, t, DLTensor* d) except -1:
        """Whether torch's DLPack exchange API describes tensor t (of torch.Tensor's own type) into d, with
        one element a lane; not where torch has no such API, nor a tensor it cannot describe (sparse ones:
        the engine's checks name what they refuse)."""
        if self.dlpack == NULL:
            return False
        if self.dlpack.dltensor_from_py_object_no_sync(<void*>t, d):
            PyErr_Clear()
            return False
        return d.dtype.lanes == 1

    cdef int _current_stream(self, int32_t device, uintptr_t* stream) except -1:
        """torch's current stream of CUDA device `device` into stream (where torch cannot say, its exception)."""
        cdef void* current = NULL
        cdef int failed = self.dlpack.current_work_stream(DL_CUDA, device, &current)
        stream[0] = <uintptr_t>current
        return failed

    cdef int _tensor_dtype(self, DLDataType dtype) noexcept:
        """The wire code of a tensor of DLPack dtype `dtype` (_take_dlpack's table), -1 where none of ours."""
        cdef int d
        for d in range(self.ndtypes):
            if self.tensor_dtypes[d].code == dtype.code and self.tensor_dtypes[d].bits == dtype.bits:
                return d
        return -1

    cdef _run_held(self, x, op, out, Operands* o, int k):
        """Run the admitted allreduce, whose thread holds the running lock, raising its failure: in C,
        or across nodes where its call shape's rail schedules are not made yet, by the engine's Python
        (which makes them)."""
        cdef Schedule vote = None
        cdef list rails = None
        cdef bint folded = False, in_out = False
        cdef long long fields[DESCRIPTOR_FIELDS]  # the descriptor (hfr/_node_call.pyx's describe)
        cdef int outcome, d = o.dtype
        cdef int64_t g = self.node_call.chunks_done
        if self.nnodes > 1:
            schedules = self.rail_shapes.get(rail_shape_key(g % STAGES, o.count, d, k))
            if schedules is None:
                error = self.engine.run_held(self.engine.front_call(x, op, out))
                if error is not None:
                    raise error
                return
            vote, rails, folded, in_out = rewound(schedules)
        describe(fields, ALLREDUCE, o.count, d, k, 0)
        try:
            if o.cuda:  # ordered after the caller's stream as it is now
                self.cuda.cuda.caller, self.cuda.cuda.ready = o.stream, NULL
            outcome = self.node_call.call(fields, o.x, o.out, o.count, self.itemsizes[d], self.kinds[d][k],
                                          self.kernel_codes[k], k == AVG, vote, rails, folded, in_out,
                                          &self.cuda.cuda if o.cuda else NULL, self.staging)
        except BaseException as error:  # Ctrl-C in a wait
            raise self.engine.front_failed(x, op, out, error, vote, rails)
        if outcome != DONE:
            raise self.engine.front_failed(x, op, out, outcome, vote, rails)

    cdef int _dtype_code(self, object dtype) except -2:
        """dtype's wire code, -1 where it is none of DTYPES (as the engine's checks compare dtypes)."""
        cdef int d
        for d in range(self.ndtypes):
            if dtype is self.dtypes[d]:  # the common case: NumPy's own dtype objects
                return d
        # an equal one made elsewhere (an unpickled array's), looked up as the engine's checks do (== alone
        # also matches structured dtypes, which they refuse)
        return self.dtype_codes.get(dtype, -1)

    cdef int _op_code(self, object op):
        """op's wire code: an hfr.Op or its name as Op spells it; -1 for any other spelling."""
        cdef int k
        for k in range(OPS):
            if op is self.ops[k] or op is self.op_names[k]:
                return k
        if type(op) is str:  # the same name made at run time, not the interned constant
            for k in range(OPS):
                if op == self.op_names[k]:
                    return k
        return -1


cdef inline int64_t _contiguous_count(DLTensor* t) noexcept:
    """A tensor's elements where it is C-contiguous (each stride the product of the sizes after it, sizes of 1
    aside, as torch's is_contiguous() says), else -1."""
    cdef int64_t count = 1
    cdef int i
    for i in range(t.ndim - 1, -1, -1):
        if t.strides != NULL and t.shape[i] != 1 and t.strides[i] != count:
            return -1
        count *= t.shape[i]
    return count
