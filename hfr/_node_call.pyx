# cython: language_level=3
"""A call whose elements fit in one chunk: the engine's protocol in C.

The steps are those of the engine's chunk loop (hfr/engine.py, whose terms this uses) for its one
chunk g, on stage g % STAGES, with the GIL released from the first step to the last:
  announce   write the call's descriptor into our control row, then ANNOUNCED
  copy in    the parts of x the others reduce into our input slot (our own slice is read from x; all
             of x in a small call, below); broadcast's root and allgather's shards go to the result
             slot once it is free
  check      wait until every rank has ANNOUNCED, compare the descriptors; across nodes, vote on the
             rail (a max-allreduce of every node's verdict and descriptor). A difference returns before
             any other counter moves, so every rank's counters stay as they were (a folded call's,
             below, once the chunk is ended)
  reduce     ARRIVED; our slice of the inputs into the result slot (avg divided there); across nodes,
             the slice's allreduce over the rail; then REDUCED (of a whole call, below, only once done
             reading the input slots)
  copy out   our part of the result slot into out, then CONSUMED. A small call (WHOLE_UP_TO_BYTES, one
             node; out on the host, or a CUDA array's staging) instead reduces out's part straight from
             the input slots, which hold all of every rank's x (the same kernel in the same slot order:
             the same bits), without waiting for the others' REDUCED: a hand-off fewer (the engine's
             terms say why that is safe)
A *folded* call (across nodes; the engine says which) sends its slice with the vote, in the vote's
record (hfr/_internode.pyx, "vote records"): one doubling over the rail rather than two. Its node's
ranks, agreeing on the call, take the reduce's first steps before the vote (ARRIVED, the slice into the
record) and copy the slice into the result slot after it. If the vote finds that nodes differ, every
rank of the node has arrived: each ends the chunk (REDUCED, CONSUMED) with no result, so the next call
finds the node's counters agreeing (MISMATCH_SPENT: the engine counts the chunk as done).
A CUDA array's call (allreduce, reduce, reduce_scatter: those that reduce) is *staged* around these
steps (call_staged): x is copied whole into our input slot (after the announce, so that a peer waits for
our data, not for our call) and out's part of the result back to the device, each copy finished before
the next step (hfr/_cuda.pyx). A whole call stages its result in a small page-locked buffer of this
rank's (its reduce reads the input slots as the host's does), the others from the result slot.
Python builds the plain description below (and the rail's schedules, hfr/_internode.pyx) and turns
the outcome into the call's result or error. The Python loop runs every other call (several chunks,
and across nodes broadcast, allgather and the algorithms other than doubling and halving).
"""
from libc.stdint cimport int64_t, uintptr_t
from libc.stdlib cimport free, malloc

from hfr._cuda cimport Device

from hfr._internode cimport INTERRUPTED as RAIL_INTERRUPTED
from hfr._internode cimport VOTE_WORDS
from hfr._internode cimport Call as RailCall
from hfr._internode cimport Schedule, advance_fn, poll
from hfr._kernels cimport Kind, copy_nogil, kernel_kind, op_code, reduce_nogil
from hfr._spin cimport counters_reached
from hfr._wait cimport HFR_SIGNAL_CHECK_S, hfr_now, raise_pending, signal_raised

from hfr._cuda import error_text
from hfr.ops import Op

cdef extern from *:
    """
    static inline void hfr_publish(long long *p, long long v) {
        __atomic_thread_fence(__ATOMIC_SEQ_CST);  /* our data stores are seen before the counter */
        __atomic_store_n(p, v, __ATOMIC_RELEASE);
    }
    static inline void hfr_fence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
    """
    void hfr_publish(long long* p, long long v) nogil
    void hfr_fence() nogil

cpdef enum Outcome:  # of run(); a WAIT_ outcome is a wait that timed out (the engine names it), a _STOPPED
    # one a schedule on the rail that did not finish (the schedule says why)
    DONE, MISMATCH, NO_MEMORY, WAIT_CALL, WAIT_RESULT_SLOT, WAIT_ARRIVED, WAIT_PREVIOUS_RESULT, WAIT_REDUCED
    VOTE_STOPPED, RAIL_STOPPED, MISMATCH_SPENT, CUDA_FAILED  # CUDA_FAILED: a staged call's copy (cuda_failure)
cdef enum:
    INTERRUPTED = -1  # a signal handler raised (Ctrl-C) during a wait: run() raises its exception
    WAITED = -2  # a wait that reached its target

# Control words, stages and collectives as hfr/engine.py numbers them (tests/test_collectives.py compares)
cpdef enum Protocol:
    ANNOUNCED = 0
    ARRIVED = 8
    REDUCED = 16
    CONSUMED = 24
    STAGES = 3
    SLICE_ALIGN_BYTES = 64
    DESCRIPTOR = 32  # two descriptor rows of DESCRIPTOR_WORDS, used by alternate calls
    DESCRIPTOR_WORDS = 8
    DESCRIPTOR_FIELDS = 5
    WHOLE_UP_TO_BYTES = 4096  # a call on one node of at most this many bytes: x whole in every input slot
cpdef enum Collective:
    ALLREDUCE = 0
    REDUCE = 1
    BROADCAST = 2
    REDUCE_SCATTER = 3
    ALLGATHER = 4


cdef int _wait_all(Node* node, Py_ssize_t column, int64_t target, int timed_out) noexcept nogil:
    """WAITED once every local rank's counter in column has reached target; timed_out if the timeout
    passes first, INTERRUPTED if a signal handler raised meanwhile."""
    cdef double deadline = hfr_now() + node.timeout
    if target <= 0:
        return WAITED
    while not counters_reached(node.control, node.row_words, node.local_size, column, target,
                               min(HFR_SIGNAL_CHECK_S, deadline - hfr_now())):
        if hfr_now() >= deadline:
            return timed_out
        if signal_raised():
            return INTERRUPTED
    return WAITED


cdef inline void _publish(Node* node, Py_ssize_t column, int64_t value) noexcept nogil:
    hfr_publish(node.control + node.local_rank * node.row_words + column, value)


cdef inline int _copy(char* dst, char* src, Py_ssize_t nbytes, int threads) noexcept nogil:
    """dst[:nbytes] = src[:nbytes] (nothing to do where they are the same bytes)."""
    return nbytes > 0 and dst != src and copy_nogil(dst, src, nbytes, threads)


cdef inline Py_ssize_t _edge(Py_ssize_t count, int parts, int j, Py_ssize_t align) noexcept nogil:
    return count if j >= parts else (j * count // parts) // align * align


cpdef tuple slice_bounds(Py_ssize_t count, int parts, int part, Py_ssize_t align):
    """Elements [lo, hi) of `count` that part `part` of `parts` owns; every bound but the last is a
    multiple of align (the engine's slices of a chunk)."""
    return _edge(count, parts, part, align), _edge(count, parts, part + 1, align)


cdef struct Rail:  # a schedule of hfr/_internode.pyx over the rail, made in Python, polled here
    advance_fn advance  # NULL: no schedule
    void* state
    RailCall* call


cdef void _rail_of(Schedule schedule, Rail* rail):
    rail.advance = NULL
    if schedule is not None:
        rail.advance, rail.state, rail.call = schedule.advance, schedule.state, &schedule.call


cdef int _run_rail(Rail* rail, double timeout, double yield_s, long sleep_ns, int stopped) noexcept nogil:
    """Poll the rail's schedule to its end: WAITED once done (or where there is none), INTERRUPTED if a
    signal handler raised, else `stopped` (the timeout passed, an MPI call failed, no memory)."""
    if rail.advance == NULL or poll(rail.advance, rail.state, rail.call, hfr_now() + timeout, yield_s, sleep_ns):
        return WAITED
    return INTERRUPTED if rail.call.error == RAIL_INTERRUPTED else stopped


cdef class NodeCall:
    """This rank's view of its node's segment, made once by the engine; run() runs one call, on chunk
    chunks_done, and counts it (the engine's Python loop counts its own calls in the same two counters)."""

    def __cinit__(self, size_t control, Py_ssize_t row_words, int local_size, int local_rank, double timeout,
                  size_t stages, Py_ssize_t stage_bytes, Py_ssize_t slot_bytes, int size, int rank, int threads,
                  double rail_yield_s, double rail_sleep_s):
        self.node.control, self.node.row_words = <long long*>control, row_words
        self.node.local_size, self.node.local_rank, self.node.timeout = local_size, local_rank, timeout
        self.stages, self.stage_bytes, self.slot_bytes = <char*>stages, stage_bytes, slot_bytes
        self.size, self.rank, self.threads = size, rank, threads
        self.rail_yield_s, self.rail_sleep_ns = rail_yield_s, <long>(rail_sleep_s * 1e9)
        self.inputs = <void**>malloc(local_size * sizeof(void*))
        if self.inputs == NULL:
            raise MemoryError()

    def __dealloc__(self):
        free(self.inputs)

    @property
    def descriptor_column(self) -> int:
        """Where the next call's descriptors go (the engine's Python loop reads them there)."""
        return _descriptor_column(self.calls_done)

    def publish(self, Py_ssize_t column, int64_t value) -> None:
        """Our counter in column := value, seen by the others after every store of ours before it."""
        _publish(&self.node, column, value)

    def announce(self, list descriptor) -> None:
        """Write the next call's descriptor (DESCRIPTOR_FIELDS ints) and publish ANNOUNCED: the announce
        step, for a call that runs in the engine's Python loop or copies its data in first."""
        cdef long long fields[DESCRIPTOR_FIELDS]
        cdef Py_ssize_t i
        if len(descriptor) != DESCRIPTOR_FIELDS:
            raise ValueError(f"a descriptor has {DESCRIPTOR_FIELDS} fields, got {descriptor!r}")
        for i in range(DESCRIPTOR_FIELDS):
            fields[i] = descriptor[i]
        _announce(&self.node, _descriptor_column(self.calls_done), fields, self.calls_done)

    def run(self, int collective, size_t x, Py_ssize_t x_count, size_t out, Py_ssize_t out_count, object dtype,
            int dtype_code, object op, int op_code_on_wire, int root, bint copy_out=True, Schedule vote=None,
            Schedule rail=None, bint announced=False, bint folded=False, *, Device cuda=None, uintptr_t to_host=0,
            uintptr_t to_device=0, size_t staging=0) -> int:
        """Run the call on chunk g = chunks_done; returns its outcome. x and out are host addresses of
        x_count and out_count elements of dtype (x may be our own input slot of the stage, where a caller
        copied it); op is an hfr.Op, avg dividing the sum by the ranks. Its descriptor is (collective,
        x_count, dtype_code, op_code_on_wire, root). Without copy_out the call ends once the result is
        final: the caller copies it out and publishes CONSUMED.
        Across nodes, vote is the call check's doubling of vote records, whose votes this fills, and rail
        the allreduce of our slice of the result slot (None where the slice is empty); folded: the vote's
        record carries our slice (its data: the slice's elements, none where it is empty) and rail is
        None. announced: the caller has written the descriptor and ANNOUNCED already (before its own copy
        into the slot).
        With cuda, x and out are on that device and the call is staged (call_staged; copy_out and announced
        do not apply): the copies run on streams to_host and to_device, staging is this rank's page-locked
        buffer of WHOLE_UP_TO_BYTES."""
        cdef bint avg = op is Op.AVG
        cdef int code = op_code(Op.SUM if avg else op)
        cdef long long fields[DESCRIPTOR_FIELDS]
        fields[0], fields[1], fields[2], fields[3], fields[4] = collective, x_count, dtype_code, op_code_on_wire, root
        if cuda is not None and staging == 0:
            raise ValueError("a staged call needs the staging buffer")
        if cuda is not None:
            return self.call_staged(fields, <const char*>x, <char*>out, out_count, dtype.itemsize,
                                    kernel_kind(dtype, code), code, avg, cuda, to_host, to_device, <char*>staging, vote,
                                    rail, folded)
        return self.call(fields, <char*>x, <char*>out, out_count, dtype.itemsize, kernel_kind(dtype, code), code, avg,
                         copy_out, vote, rail, announced, folded)

    cdef int call(self, long long* fields, char* x, char* out, Py_ssize_t out_count, Py_ssize_t itemsize, Kind kind,
                  int code, bint avg, bint copy_out, Schedule vote, Schedule rail, bint announced,
                  bint folded) except -1:
        """run() for callers in C: the descriptor's fields (collective, x_count, dtype code, op code on the
        wire, root), and the kernel's element kind and op code given. Counts the call once its ANNOUNCED
        wait passed, and its chunk once ended (DONE, MISMATCH_SPENT)."""
        cdef int collective = fields[0]
        cdef Py_ssize_t x_count = fields[1]
        # x and out within the chunk's elements: an allgather cuts out's, the others x's
        cdef Py_ssize_t total = out_count if collective == ALLGATHER else x_count
        cdef Py_ssize_t x_at = self.rank * x_count if collective == ALLGATHER else 0
        cdef Py_ssize_t out_at = self.rank * out_count if collective == REDUCE_SCATTER else 0
        cdef Py_ssize_t align = max(SLICE_ALIGN_BYTES // itemsize, 1)
        cdef Py_ssize_t lo = _edge(total, self.node.local_size, self.node.local_rank, align)
        cdef Py_ssize_t hi = _edge(total, self.node.local_size, self.node.local_rank + 1, align)
        cdef int64_t g = self.chunks_done
        cdef Py_ssize_t column = _descriptor_column(self.calls_done)
        cdef Rail vote_rail, data_rail
        _rail_of(vote, &vote_rail)
        _rail_of(rail, &data_rail)
        cdef int outcome
        with nogil:
            outcome = _run(&self.node, column, fields, self.calls_done, g,
                           self.stages + (g % STAGES) * self.stage_bytes, self.slot_bytes, collective,
                           self.rank == fields[4], x, x_count * itemsize, x_at * itemsize, out,
                           out_count * itemsize, out_at * itemsize, total * itemsize, lo * itemsize, hi * itemsize,
                           kind, itemsize, code, self.size if avg else 1, self.threads, self.inputs, copy_out,
                           &vote_rail, &data_rail, self.rail_yield_s, self.rail_sleep_ns, announced, folded)
        if outcome == INTERRUPTED:
            return raise_pending()
        if outcome != WAIT_CALL:
            self.calls_done += 1
        if outcome == DONE or outcome == MISMATCH_SPENT:
            self.chunks_done = g + 1
        return outcome

    cdef int call_staged(self, long long* fields, const char* x, char* out, Py_ssize_t out_count, Py_ssize_t itemsize,
                         Kind kind, int code, bint avg, Device cuda, uintptr_t to_host, uintptr_t to_device,
                         char* staging, Schedule vote, Schedule rail, bint folded) except -1:
        """call() of a CUDA array x (allreduce, reduce or reduce_scatter; x and out device addresses), staged
        (the module's docstring): announce, x into our input slot on stream to_host, the call, out's part
        of the result to out on stream to_device, CONSUMED. A whole call (_whole) reduces all of out's
        part into staging, this rank's page-locked buffer of WHOLE_UP_TO_BYTES, without waiting for the
        others' slices. CUDA_FAILED where a copy failed (cuda_failure says how), else call()'s outcome."""
        cdef int64_t g = self.chunks_done
        cdef char* stage = self.stages + (g % STAGES) * self.stage_bytes
        cdef char* slot = stage + self.node.local_rank * self.slot_bytes
        cdef Py_ssize_t x_nbytes = fields[1] * itemsize, out_nbytes = out_count * itemsize
        cdef Py_ssize_t out_at = self.rank * out_nbytes if fields[0] == REDUCE_SCATTER else 0
        cdef bint whole = _whole(fields[0], vote is None, x_nbytes)  # as _run decides
        cdef bint copies_out = _copies_out(fields[0], self.rank == fields[4], False)  # no broadcast is staged
        cdef int error
        _announce(&self.node, _descriptor_column(self.calls_done), fields, self.calls_done)
        with nogil:
            error = cuda.copy(slot, x, x_nbytes, True, to_host)
        if error:
            self.cuda_failure = f"copying x to the host: {error_text(error)}"
            return CUDA_FAILED
        cdef int outcome = self.call(fields, slot, staging if whole else NULL, out_count, itemsize, kind, code, avg,
                                     whole, vote, rail, True, folded)  # copy_out, vote, rail, announced, folded
        if outcome != DONE:
            return outcome
        if copies_out:
            with nogil:
                error = cuda.copy(out, staging if whole else stage + self.node.local_size * self.slot_bytes + out_at,
                                  out_nbytes, False, to_device)
            if error:
                self.cuda_failure = f"copying the result to the device: {error_text(error)}"
                return CUDA_FAILED
        if not whole:
            _publish(&self.node, CONSUMED, g + 1)
        return DONE


cdef inline bint _whole(int collective, bint one_node, Py_ssize_t total) noexcept nogil:
    """Whether a call of total bytes (the chunk's) is whole: one node, x deposited in the input slots
    (not the result slot), at most WHOLE_UP_TO_BYTES."""
    return one_node and collective != BROADCAST and collective != ALLGATHER and total <= WHOLE_UP_TO_BYTES


cdef inline bint _copies_out(int collective, bint is_root, bint out_is_x) noexcept nogil:
    """Whether this rank's out receives the result: not a reduce's other ranks, nor a broadcast's root in
    place."""
    if collective == REDUCE:
        return is_root
    if collective == BROADCAST:
        return not (is_root and out_is_x)
    return True


cdef inline Py_ssize_t _descriptor_column(int64_t calls_done) noexcept nogil:
    """Where the descriptors of the call after calls_done go: calls alternate between two rows, so a fast
    rank never overwrites a row that a slow one still reads."""
    return DESCRIPTOR + DESCRIPTOR_WORDS * (calls_done % 2)


cdef void _announce(Node* node, Py_ssize_t column, long long* fields, int64_t calls_done) noexcept nogil:
    """Our descriptor into our control row at column, then ANNOUNCED for the call after calls_done."""
    cdef long long* row = node.control + node.local_rank * node.row_words
    cdef Py_ssize_t i
    for i in range(DESCRIPTOR_FIELDS):
        row[column + i] = fields[i]
    _publish(node, ANNOUNCED, calls_done + 1)


cdef int _arrive(Node* node, int64_t g) noexcept nogil:
    """ARRIVED for chunk g, then wait for every rank's, and for the result slot's last chunk to be copied out."""
    _publish(node, ARRIVED, g + 1)
    cdef int waited = _wait_all(node, ARRIVED, g + 1, WAIT_ARRIVED)
    if waited == WAITED:
        waited = _wait_all(node, CONSUMED, g - STAGES + 1, WAIT_PREVIOUS_RESULT)
    hfr_fence()
    return waited


cdef int _reduce_slice(Node* node, char* dst, char* x, char* slots, Py_ssize_t slot_bytes, Py_ssize_t lo,
                       Py_ssize_t hi, Kind kind, Py_ssize_t itemsize, int code, Py_ssize_t divisor, int threads,
                       void** inputs) noexcept nogil:
    """dst = bytes [lo, hi) of the inputs reduced in slot order (ours read from x); NO_MEMORY or 0."""
    cdef int j
    for j in range(node.local_size):
        inputs[j] = (x if j == node.local_rank else slots + j * slot_bytes) + lo
    if reduce_nogil(kind, itemsize, dst, inputs, node.local_size, (hi - lo) // itemsize, code, threads, divisor):
        return NO_MEMORY
    return 0


cdef int _run(Node* node, Py_ssize_t column, long long* fields, int64_t calls_done, int64_t g,
              char* slots, Py_ssize_t slot_bytes, int collective, bint is_root,
              char* x, Py_ssize_t x_nbytes, Py_ssize_t x_at, char* out, Py_ssize_t out_nbytes, Py_ssize_t out_at,
              Py_ssize_t total, Py_ssize_t lo, Py_ssize_t hi, Kind kind, Py_ssize_t itemsize, int code,
              Py_ssize_t divisor, int threads, void** inputs, bint copy_out, Rail* vote, Rail* rail,
              double rail_yield_s, long rail_sleep_ns, bint announced, bint folded) noexcept nogil:
    cdef long long* other
    cdef long long* votes
    cdef char* own_slot = slots + node.local_rank * slot_bytes
    cdef char* result = slots + node.local_size * slot_bytes
    cdef bint into_result = collective == BROADCAST or collective == ALLGATHER
    cdef bint deposits = collective != BROADCAST or is_root
    cdef bint copies_out = _copies_out(collective, is_root, out == x)
    cdef bint differs = False, arrived = False
    cdef Py_ssize_t a, b, i
    cdef int j, waited
    cdef bint whole = _whole(collective, vote.advance == NULL, total)  # no vote: one node

    if not announced:
        _announce(node, column, fields, calls_done)
    # copy in: what the others reduce (our own slice stays in x). Our slot's last readers are done: they
    # read it for chunk g - STAGES, and every rank had published REDUCED for it before its ARRIVED g that
    # we saw at chunk g - 1 (the engine's terms)
    if deposits and not into_result:
        if whole:
            if _copy(own_slot, x, total, threads):
                return NO_MEMORY
        elif _copy(own_slot, x, lo, threads) or _copy(own_slot + hi, x + hi, total - hi, threads):
            return NO_MEMORY
    # check: the node's descriptors, then across nodes the vote (every node's verdict, and its descriptor
    # as max(d) and max(-d): they are the same on every node where max(d) == -max(-d))
    waited = _wait_all(node, ANNOUNCED, calls_done + 1, WAIT_CALL)
    if waited != WAITED:
        return waited
    hfr_fence()
    for j in range(node.local_size):
        other = node.control + j * node.row_words + column
        for i in range(DESCRIPTOR_FIELDS):
            differs = differs or other[i] != fields[i]
    if vote.advance != NULL:
        votes, other = <long long*>vote.call.buf - VOTE_WORDS, node.control + column  # local rank 0's descriptor
        votes[0] = differs
        for i in range(DESCRIPTOR_FIELDS):
            votes[1 + i], votes[1 + DESCRIPTOR_FIELDS + i] = other[i], -other[i]
        if folded and not differs:  # the reduce's first steps, our slice into the vote's record
            waited = _arrive(node, g)
            if waited != WAITED:
                return waited
            arrived = True
            if hi > lo and _reduce_slice(node, vote.call.buf, x, slots, slot_bytes, lo, hi, kind, itemsize, code,
                                         divisor, threads, inputs):
                return NO_MEMORY
        waited = _run_rail(vote, node.timeout, rail_yield_s, rail_sleep_ns, VOTE_STOPPED)
        if waited != WAITED:
            return waited
        differs = votes[0] != 0
        for i in range(DESCRIPTOR_FIELDS):
            differs = differs or votes[1 + i] != -votes[1 + DESCRIPTOR_FIELDS + i]
    if differs and arrived:  # end the chunk with no result, as every rank of the node does
        _publish(node, REDUCED, g + 1)
        waited = _wait_all(node, REDUCED, g + 1, WAIT_REDUCED)
        if waited != WAITED:
            return waited
        _publish(node, CONSUMED, g + 1)
        return MISMATCH_SPENT
    if differs:
        return MISMATCH
    if deposits and into_result:
        waited = _wait_all(node, CONSUMED, g - STAGES + 1, WAIT_RESULT_SLOT)
        if waited != WAITED:
            return waited
        a, b = max(0, x_at), min(total, x_at + x_nbytes)
        if a < b and _copy(result + a, x + a - x_at, b - a, threads):
            return NO_MEMORY
    # reduce
    if arrived:  # folded: the slice came back with the vote
        if _copy(result + lo, vote.call.buf, hi - lo, threads):
            return NO_MEMORY
    else:
        waited = _arrive(node, g)
        if waited != WAITED:
            return waited
        if not into_result and hi > lo:
            if _reduce_slice(node, result + lo, x, slots, slot_bytes, lo, hi, kind, itemsize, code, divisor,
                             threads, inputs):
                return NO_MEMORY
            waited = _run_rail(rail, node.timeout, rail_yield_s, rail_sleep_ns, RAIL_STOPPED)
            if waited != WAITED:
                return waited
    # copy out: out's part [a, b) of the chunk
    a, b = max(0, out_at), min(total, out_at + out_nbytes)
    if not copies_out:
        a = b
    if whole and copy_out:  # from the input slots, then REDUCED: the next chunk's copies in may overwrite them
        if a < b and _reduce_slice(node, out + a - out_at, own_slot, slots, slot_bytes, a, b, kind, itemsize, code,
                                   divisor, threads, inputs):
            return NO_MEMORY
        _publish(node, REDUCED, g + 1)
    else:
        _publish(node, REDUCED, g + 1)
        waited = _wait_all(node, REDUCED, g + 1, WAIT_REDUCED)
        if waited != WAITED:
            return waited
        hfr_fence()
        if not copy_out:
            return DONE
        if a < b and _copy(out + a - out_at, result + a, b - a, threads):
            return NO_MEMORY
    _publish(node, CONSUMED, g + 1)
    return DONE
