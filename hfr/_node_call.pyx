# cython: language_level=3
"""The node protocol in C (Algorithm 1 of the paper): one call's chunk loop, with the GIL released from the
first step to the last, for every call of every Communicator.

Terms. A call's array is cut into the fewest **chunks** of at most the engine's chunk (hfr/engine.py:
chunk_bytes across nodes, a cache chunk on one node, cache_chunk_bytes), all of one size but the last (_even).
Chunks are numbered across the whole life of the Communicator (the chunk's **sequence number** g), and chunk g
uses **stage** g % STAGES of the node-shared segment (hfr/shm.py): local_size **input slots**, one per local
rank, then the **result slot**. Within a chunk, local rank l owns **slice** l: it sums slice l of the input
slots in slot order into the result slot, then takes it through the inter-node step on its rail.
Ranks of a node synchronise through monotonic **counters** in their control rows (hfr/_node_call.pxd's
Protocol), each written only by its owner and read by the others ("I have done this step for chunks up
to here"; chunk g's value is g + 1):
  ANNOUNCED  calls whose descriptor I have written (checked by everyone before data leaves a rank)
  ARRIVED    chunks I have copied into my input slot
  REDUCED    chunks whose slice I own is final in the result slot, their input slots read by me
  CONSUMED   chunks I have copied out of the result slot
  CLOSING    BROKEN once this rank's communicator failed (TIMED_OUT where a wait of it timed out), else
             HEALTHY once it closed: a rank whose word is HEALTHY or BROKEN makes no more progress, so a wait
             for it ends at once (_wait_all), not at the timeout
A stage's input slots are reused once every rank has REDUCED the chunk that used them before, its result
slot once every rank has CONSUMED it. So copies into the segment run ahead by up to STAGES chunks, while
other chunks are reduced, travel and are copied back.

The steps (a cache chunk is copied in, reduced and copied out while it is still in the cache).
Chunk c of the call is chunk g = first_chunk + c of the Communicator and uses stage g % STAGES.
  announce         write the call's descriptor into our control row, then ANNOUNCED
  copy in          into our input slot, for each of the call's first STAGES chunks before the check and for
                   chunk c + STAGES once chunk c is copied out, the parts of x the others reduce (our own
                   slice is read from x; all of x in a whole call, below), once every rank has REDUCED the
                   chunk that used the slot before; broadcast's root and allgather's shards go to the result
                   slot instead, once every rank has CONSUMED the chunk that used it before
  check            wait until every rank has ANNOUNCED, compare the descriptors; across nodes, vote on the
                   rail (a max-allreduce of every node's verdict and descriptor). A difference returns before
                   any other counter moves, so every rank's counters stay as they were (a folded call's,
                   below, once its chunk is ended)
  reduce the node  per chunk: ARRIVED, then our slice of the inputs into the result slot (avg divided there)
  cross nodes      per chunk, across nodes: the slice's allreduce (a reduce's reduce, a broadcast's broadcast
                   from the root's node, an allgather's allgather, a large reduce_scatter's reduce-scatter)
                   over the rail
  copy out         per chunk: REDUCED, then, once every rank has REDUCED, our part of the result slot into
                   out (from our own slice on, wrapping round: _to_out; an allgather in place leaves its
                   shard, which is x), then CONSUMED. A whole call
                   (WHOLE_UP_TO_BYTES, one node; out on the host, or a CUDA array's staging) instead reduces
                   out's part straight from the input slots, which hold all of every rank's x (the same kernel
                   in the same slot order: the same bits), and publishes REDUCED only then, without waiting
                   for the others'
Stores: plain (cached) while what they write is read again soon from the cache, non-temporal (streamed
past it) where the call's working set on the node does not fit three quarters of the cache (_stores).
A *folded* call (across nodes; the engine says which) sends its slice with the vote, in the vote's record
(hfr/_internode.pyx, "vote records"): one doubling over the rail rather than two. Its node's ranks,
agreeing on the call, take the reduce's first steps before the vote (ARRIVED, the slice into the record)
and copy the slice into the result slot after it. If the vote finds that nodes differ, every rank of the
node has arrived: each ends the chunk (REDUCED, CONSUMED) with no result, so the next call finds the
node's counters agreeing (MISMATCH_SPENT: the engine counts the chunk as done).
A CUDA array's call is *staged* (hfr/_cuda.pyx): its copies are queued on two streams, one each way, and run
while the node works on other chunks (the device's own, after the caller's work; the caller's stream itself
for a call of one chunk run on its thread: hfr/_cuda.pyx's order). Copy in queues x's part of the chunk (into
our input slot, all of it: the reduce reads our own slice there too) and an event after it, which the rank
waits for before ARRIVED. Copy out queues out's part of the result and an event after it; CONSUMED waits for
that event: the rank publishes it as chunk c + STAGES begins (before that chunk's waits, which may need the
others' CONSUMED of chunk c), and at the call's end, which thus waits for every copy. A whole call reduces
out's part into staging, a page-locked buffer of this rank's, and copies it out from there. A call that stops
waits for the copies it queued before it returns, so that none touches x or out after (within the timeout:
a stream held up by a GPU pair partner that never pushed is left as it is).
Ranks whose GPUs pair (hfr/pairs.py) add each chunk's halves on the device before half of it crosses PCIe:
the GPU pairs section below says how.
With one rank a node, a host array's allreduce of several chunks makes each chunk's result in out itself
(in_out), where the rail works on it: two copies fewer a chunk, the same bits.
Python builds the plain description below (and the rail's schedules, hfr/_internode.pyx, one per chunk)
and turns the outcome into the call's result or error (hfr/engine.py).
"""
from libc.stdint cimport int64_t, uintptr_t
from libc.stdlib cimport free, malloc
from libc.string cimport memset

from hfr._cuda cimport (CALL_EVENTS, DRAINED, LINKED, NO_LINK, NOT_READY, PAIR_EVENTS, PAIR_OPS, UNLINKED, Cuda,
                        Device, PairRecord, after_partner, enter, leave, link, order, pair_add, push, ran, record,
                        record_pushed)
from hfr._cuda cimport copy as cuda_copy

from hfr._internode cimport INTERRUPTED as RAIL_INTERRUPTED
from hfr._internode cimport VOTE_FIELDS, VOTE_WORDS, vote_for, votes_agree
from hfr._internode cimport Call as RailCall
from hfr._internode cimport Schedule, advance_fn, poll
from hfr._kernels cimport CACHED, STORES_BY_SIZE, STREAMED, Kind, Stores, copy_nogil, kernel_kind, op_code, reduce_nogil
from hfr._simd cimport BF16, F32, F64, FP16, I8, I32, I64, KIND_COUNT, MAX, MIN, PROD, SUM, U8, U32, U64
from hfr._wait cimport (ENDED, STILL, WAIT_ENDED, WAIT_SIGNALLED, WAIT_TIMED_OUT, Look, Waited, hfr_load_acquire, hfr_now,
                        raise_pending, wait_for)

from hfr._cuda import error_text
from hfr.ops import Op, combining

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

cdef enum:
    INTERRUPTED = -1  # a signal handler raised (Ctrl-C) during a wait: run() raises its exception
    WAITED = -2  # a wait that reached its target
    WATCHED_GONE = -3  # _ran_within: the rank it watched closed or broke first

cdef enum Mark:  # the steps of a chunk whose end mark_steps records (STEP_MARKS names them)
    MARK_BEGIN, MARK_RETIRED, MARK_COPIED_IN, MARK_ARRIVED, MARK_REDUCED, MARK_CROSSED, MARK_ALL_REDUCED
    MARK_COPIED_OUT, MARK_NEXT_COPY_IN, MARKS

STEP_MARKS = ("begin", "retired", "copied in", "arrived", "reduced", "crossed", "all reduced", "copied out",
              "next copy in")


cdef enum CudaStep:  # where a staged call's CUDA failure came (Plan.cuda_step)
    CUDA_CONTEXT = 1, CUDA_ORDER, CUDA_COPY_IN, CUDA_COPY_OUT, CUDA_PAIR_LINK, CUDA_PAIR_IN, CUDA_PAIR_OUT

cdef enum:
    IN_EVENTS = 0  # a staged call's events (hfr/_cuda.pyx): after chunk g's copy in, IN_EVENTS + g % STAGES;
    OUT_EVENTS = STAGES  # after its copy out, OUT_EVENTS + g % STAGES
    # ... and a paired call's pair events, shared with the partner: after chunk g's push into its inbox,
    IN_PUSHED = 0  # IN_PUSHED + g % STAGES; after its push into its outbox, OUT_PUSHED + g % STAGES
    OUT_PUSHED = STAGES

cdef enum Half:  # what a local rank's input slot holds in a call (Node.halves)
    WHOLE  # all of each chunk (the rank is not paired in the call)
    LOWER  # the pair's sum of the chunk's lower half [0, middle): the pair's lower local rank
    UPPER  # of its upper half [middle, count): the pair's upper local rank

if 2 * STAGES > CALL_EVENTS or 2 * STAGES > PAIR_EVENTS:
    raise ImportError(f"hfr/_cuda.pxd's CALL_EVENTS ({CALL_EVENTS}) and PAIR_EVENTS ({PAIR_EVENTS}) must hold two "
                      f"events a stage ({STAGES} stages)")
if PAIRABLE >= DESCRIPTOR_WORDS or PAIR_RECORD * 8 + sizeof(PairRecord) > ROW_WORDS * 8:
    raise ImportError("a control row has no room for the pair's words (hfr/_node_call.pxd)")
if VOTE_WORDS != 1 + 2 * VOTE_FIELDS or <int>VOTE_FIELDS != <int>DESCRIPTOR_FIELDS:  # votes carry the descriptor
    raise ImportError(f"hfr/_internode.pxd's votes ({VOTE_WORDS} words, {VOTE_FIELDS} fields) must carry the "
                      f"descriptor's {DESCRIPTOR_FIELDS} fields")

cdef struct Rail:  # a schedule of hfr/_internode.pyx over the rail, made in Python, polled here
    advance_fn advance  # NULL: no schedule
    void* state
    RailCall* call


cdef struct Plan:  # one call on this rank, as call() lays it out; offsets and sizes in bytes
    long long* fields  # the descriptor: collective, x's count, dtype code, op code on the wire, root
    int collective
    bint into_result  # x goes to the result slot (broadcast's root, allgather's shards), not our input slot
    bint deposits  # this rank copies x in
    bint copies_out  # this rank's out receives the result
    bint whole, folded
    bint in_out  # the chunks' results lie in out itself, not in the result slot (an allreduce, one rank a node)
    char* x  # x's elements [x_at, x_at + x_nbytes) of the elements the chunks cut (total)
    Py_ssize_t x_nbytes, x_at
    char* out  # out's, likewise
    Py_ssize_t out_nbytes, out_at
    Py_ssize_t kept_lo, kept_hi  # bytes [kept_lo, kept_hi) of out hold their result already: not copied out
    Py_ssize_t total, chunk, nchunks  # chunk: the call's (_even), at most the engine's
    Py_ssize_t itemsize
    Kind kind
    int code
    Py_ssize_t divisor  # avg: the ranks; else 1
    Stores slot_stores, out_stores  # into the segment, into out
    int64_t first_chunk, calls_done  # g of the call's chunk 0; calls checked before this one
    Py_ssize_t column  # where the descriptors are
    Py_ssize_t at  # the chunk the loop is at (a failure's)
    bint arrived  # folded: the vote carried our slice, and chunk 0 has ARRIVED
    bint counted  # every rank has ANNOUNCED the call: it counts in calls_done, whatever happens next
    Rail* rails  # across nodes: per chunk, our slice's step over the rail (its allreduce, ...); else NULL
    Cuda* cuda  # staged (x and out on a CUDA device): its copies; else NULL
    char* staging  # staged: this rank's page-locked buffer of WHOLE_UP_TO_BYTES, for a whole call's result
    Py_ssize_t consumed  # staged: the chunks whose CONSUMED is published (their copies out ran)
    double* marks  # mark_steps' rows (chunk c's at c * MARKS), mark_rows of them; NULL: none
    Py_ssize_t mark_rows
    int cuda_error  # staged: the CUresult that stopped the call (CUDA_FAILED), and at which step
    CudaStep cuda_step
    bint pairable  # staged: this rank can pair the call (_pairable), as its descriptor row says (PAIRABLE)
    bint paired  # this rank and its partner pair the call (both pairable: _pair_up)
    bint pairs_out  # paired, and the pair passes each other its half of the result (an allreduce)
    bint stalled  # staged: _until_ran's wait timed out (our streams may never drain)
    bint halved  # some pair of the node is paired in the call: its chunks have a middle (Node.halves)


cdef inline void _mark(Plan* p, Py_ssize_t c, Mark step) noexcept nogil:
    """When chunk c's step ended, where mark_steps asked for it."""
    if p.marks != NULL and c < p.mark_rows:
        p.marks[c * MARKS + step] = hfr_now()


cdef inline bint _closed(Node* node, int rank) noexcept nogil:
    """Whether local rank `rank` closed or broke (its CLOSING word HEALTHY or BROKEN): it makes no more progress."""
    return hfr_load_acquire(node.control + rank * node.row_words + CLOSING) > 0


cdef struct Counters:  # what _wait_ranks waits for: word `column` of local ranks [first, first + count) at target
    Node* node
    int first, count
    Py_ssize_t column
    int64_t target
    int gone  # the first of them that is gone (_short_and_closed), else -1


cdef Look _counters_reached(void* state) noexcept nogil:
    cdef Counters* w = <Counters*>state
    cdef const long long* word = w.node.control + w.first * w.node.row_words + w.column
    cdef int r
    for r in range(w.count):
        if hfr_load_acquire(word + r * w.node.row_words) < w.target:
            return STILL
    return ENDED


cdef bint _short_and_closed(void* state) noexcept nogil:
    """Whether one of the ranks closed or broke (_closed) short of the target: a rank stores its counters
    before its CLOSING word, so the one read after that word (acquire) is its last."""
    cdef Counters* w = <Counters*>state
    cdef int r
    if w.column == CLOSING:
        return False
    for r in range(w.first, w.first + w.count):
        if _closed(w.node, r) and hfr_load_acquire(w.node.control + r * w.node.row_words + w.column) < w.target:
            w.gone = r
            return True
    return False


cdef int _wait_ranks(Node* node, int first, int count, Py_ssize_t column, int64_t target, int timed_out) noexcept nogil:
    """WAITED once the counters in column of local ranks [first, first + count) have reached target; timed_out
    if the timeout passes first, or before it where a rank that has not reached it is gone (gone_rank:
    _short_and_closed), INTERRUPTED if a signal handler raised meanwhile."""
    cdef Counters w
    if target <= 0:
        return WAITED
    w.node, w.first, w.count, w.column, w.target, w.gone = node, first, count, column, target, -1
    cdef Waited waited = wait_for(_counters_reached, _short_and_closed, &w, hfr_now() + node.timeout, True)
    if waited == WAIT_ENDED:
        return WAITED
    if waited == WAIT_SIGNALLED:
        return INTERRUPTED
    node.late_column, node.late_target, node.gone_rank = column, target, w.gone
    node.late_only = first if count == 1 and node.local_size > 1 else -1
    return timed_out


cdef inline int _wait_all(Node* node, Py_ssize_t column, int64_t target, int timed_out) noexcept nogil:
    """_wait_ranks for every local rank."""
    return _wait_ranks(node, 0, node.local_size, column, target, timed_out)


cdef inline void _publish(Node* node, Py_ssize_t column, int64_t value) noexcept nogil:
    hfr_publish(node.control + node.local_rank * node.row_words + column, value)


cdef inline int _copy(Node* node, char* dst, char* src, Py_ssize_t nbytes, Stores stores) noexcept nogil:
    """dst[:nbytes] = src[:nbytes] (nothing to do where they are the same bytes)."""
    return nbytes > 0 and dst != src and copy_nogil(dst, src, nbytes, node.threads, stores)


cdef inline Py_ssize_t _edge(Py_ssize_t count, int parts, int j, Py_ssize_t align) noexcept nogil:
    """Where part j of count elements cut into `parts` starts, rounded down to `align` (count for j = parts)."""
    return count if j >= parts else (j * count // parts) // align * align


cdef void _rail_of(Node* node, Schedule schedule, Rail* rail):
    """The schedule as the chunk loop polls it, stopping where a rank of our node broke (its CLOSING word
    BROKEN: the node cannot finish the call)."""
    rail.advance = NULL
    if schedule is not None:
        rail.advance, rail.state, rail.call = schedule.advance, schedule.state, &schedule.call
        schedule.call.watch, schedule.call.watch_stride = node.control + CLOSING, node.row_words
        schedule.call.watch_rows, schedule.call.watch_broken = node.local_size, BROKEN


cdef int _run_rail(Node* node, Rail* rail, int stopped) noexcept nogil:
    """Poll the rail's schedule to its end: WAITED once done (or where there is none), INTERRUPTED if a
    signal handler raised, else `stopped` (the timeout passed, an MPI call failed, no memory)."""
    if rail.advance == NULL or poll(rail.advance, rail.state, rail.call, hfr_now() + node.timeout):
        return WAITED
    return INTERRUPTED if rail.call.error == RAIL_INTERRUPTED else stopped


cdef class NodeCall:
    """This rank's view of its node's segment, made once by the engine; run() runs one call from chunk
    chunks_done on, and counts it."""

    def __cinit__(self, size_t control, Py_ssize_t row_words, int local_size, int local_rank, double timeout,
                  size_t stages, Py_ssize_t stage_bytes, Py_ssize_t slot_bytes, int size, int rank, int threads,
                  Py_ssize_t cache_bytes, Py_ssize_t chunk, Pairs pairs=PAIRS_OFF, Py_ssize_t pairs_from=0):
        self.node.control, self.node.row_words = <long long*>control, row_words
        self.node.local_size, self.node.local_rank, self.node.timeout = local_size, local_rank, timeout
        self.node.stages, self.node.stage_bytes, self.node.slot_bytes = <char*>stages, stage_bytes, slot_bytes
        self.node.threads, self.node.gone_rank, self.node.late_only = threads, -1, -1
        self.node.partner = partner_of(local_rank, local_size)
        self.node.pairs, self.node.pairs_from = pairs, pairs_from
        self.size, self.rank = size, rank
        self.cache_bytes, self.chunk = cache_bytes, chunk
        self.node.inputs = <void**>malloc(local_size * sizeof(void*))
        self.node.halves = <char*>malloc(local_size)
        if self.node.inputs == NULL or self.node.halves == NULL:
            raise MemoryError()
        memset(self.node.halves, WHOLE, local_size)

    def __dealloc__(self):
        free(self.node.inputs)
        free(self.node.halves)

    def chunks(self, Py_ssize_t elements, Py_ssize_t itemsize, bint in_out=False) -> list:
        """How the next call, if it cuts `elements` of itemsize bytes, is cut, in elements, as its chunk loop
        cuts it: per chunk (first, count, lo, hi, result), its first element and count, this rank's slice
        [lo, hi) of it, and where the loop reduces that slice to (_result): a byte offset into the segment's
        stages, or, in_out (as run() takes it), into out."""
        cdef Py_ssize_t total = elements * itemsize, c, first, count, lo, hi, nchunks
        cdef Py_ssize_t chunk = _even(self.chunk, total, &nchunks)
        cdef char* base = self.node.stages  # in_out: out's place in the offset, as the stages' otherwise
        cuts = []
        for c in range(nchunks):
            _cut(&self.node, chunk, total, itemsize, c, &first, &count, &lo, &hi)
            result = _result(&self.node, base, in_out, self.chunks_done + c, first) + lo - base
            cuts.append((first // itemsize, count // itemsize, lo // itemsize, hi // itemsize, result))
        return cuts

    def mark_steps(self, marks) -> None:
        """Record, from the next call on, when each step of each chunk ended (hfr_now(): time.monotonic()'s
        clock) into marks, a C-contiguous float64 array of rows of len(STEP_MARKS): chunk c's into row c
        (chunks past the last row are not recorded; a step a chunk does not take is left as it was). None
        stops it. For bench/chunk_steps.py."""
        if marks is None:
            self.marks, self.mark_rows, self.marked = NULL, 0, None
            return
        cdef double[:, ::1] rows = marks
        if rows.shape[1] != MARKS:
            raise ValueError(f"marks needs {MARKS} columns (STEP_MARKS), got {rows.shape[1]}")
        self.marks, self.mark_rows, self.marked = &rows[0, 0] if rows.shape[0] else NULL, rows.shape[0], marks

    @property
    def late_wait(self) -> tuple:
        """(counter column, target, gone, only) of the last wait that timed out (a WAIT_ outcome's): column -1
        for a wait on the device (WAIT_DEVICE); gone is the local rank whose CLOSING word ended it before the
        timeout, or -1; only the one local rank it waited for (a GPU pair's partner), or -1: every rank."""
        return self.node.late_column, self.node.late_target, self.node.gone_rank, self.node.late_only

    def wait_all(self, Py_ssize_t column, int64_t target) -> bool:
        """Wait, the GIL released, until every local rank's counter in column has reached target: True; False
        once the timeout passes (late_wait names the wait); a signal handler's exception raises."""
        cdef int waited
        with nogil:
            waited = _wait_all(&self.node, column, target, WAIT_CALL)
            hfr_fence()
        if waited == INTERRUPTED:
            raise_pending()
        return waited == WAITED

    def publish(self, Py_ssize_t column, int64_t value) -> None:
        """Our counter in column := value, seen by the others after every store of ours before it."""
        _publish(&self.node, column, value)

    def run(self, list descriptor, size_t x, size_t out, Py_ssize_t out_count, object dtype, object op,
            Schedule vote=None, list rails=None, bint folded=False, bint in_out=False, *, Device cuda=None,
            uintptr_t caller=0, uintptr_t ready=0, size_t staging=0) -> int:
        """Run the call from chunk chunks_done on; returns its outcome (and, where it failed, the chunk it
        was at: failed_chunk). descriptor: its DESCRIPTOR_FIELDS (collective, x's count, dtype code, op
        code on the wire, root), or a refused call's (count REFUSED: it takes part in the call check and
        moves nothing). x and out are host addresses of x's count and out_count elements of dtype; op is an
        hfr.Op, avg dividing the sum by the ranks.
        Across nodes, vote is the call check's doubling of vote records, whose votes this fills, and
        rails[c] chunk c's step of our slice of its result over the rail, its allreduce, ... (None where the
        slice is empty), one per chunk; folded (one chunk): the vote's record carries our slice (its data:
        the slice's elements, none where it is empty) and rails is [None]. in_out (an allreduce of host
        arrays, one rank a node): each chunk's result is made in out itself, where its rail works, rather
        than in the result slot.
        With cuda, x and out are on that device and the call is staged (the module's docstring): its copies
        are ordered after the caller's work on stream caller, that queued by the time event ready (0: none)
        was recorded on it (hfr/_cuda.pyx, order); staging is this rank's page-locked buffer of
        WHOLE_UP_TO_BYTES."""
        cdef bint avg = op is Op.AVG
        cdef int code = op_code(combining(op))
        cdef long long fields[DESCRIPTOR_FIELDS]
        cdef Py_ssize_t i
        if len(descriptor) != DESCRIPTOR_FIELDS:
            raise ValueError(f"a descriptor has {DESCRIPTOR_FIELDS} fields, got {descriptor!r}")
        for i in range(DESCRIPTOR_FIELDS):
            fields[i] = descriptor[i]
        if cuda is None:
            return self.call(fields, <char*>x, <char*>out, out_count, dtype.itemsize, kernel_kind(dtype, code), code,
                             avg, vote, rails, folded, in_out, NULL, NULL)
        if staging == 0:
            raise ValueError("a staged call needs the staging buffer")
        cuda.cuda.caller, cuda.cuda.ready = caller, <void*>ready
        return self.call(fields, <char*>x, <char*>out, out_count, dtype.itemsize, kernel_kind(dtype, code), code, avg,
                         vote, rails, folded, in_out, &cuda.cuda, <char*>staging)

    cdef int call(self, long long* fields, char* x, char* out, Py_ssize_t out_count, Py_ssize_t itemsize, Kind kind,
                  int code, bint avg, Schedule vote, list rails, bint folded, bint in_out, Cuda* cuda,
                  char* staging) except -1:
        """run() for callers in C: the descriptor's fields (collective, x_count, dtype code, op code on the
        wire, root), and the kernel's element kind and op code given; with cuda (its caller and ready set),
        staged.
        Counts the call once its ANNOUNCED wait passed, and its chunks once ended (DONE, MISMATCH_SPENT)."""
        cdef Plan p
        cdef Py_ssize_t x_count = max(fields[1], 0), c  # a refused call's count (REFUSED) moves nothing
        p.fields, p.collective, p.folded = fields, fields[0], folded
        p.into_result = not reduces(p.collective)
        p.deposits = p.collective != BROADCAST or self.rank == fields[4]
        p.in_out = in_out
        p.copies_out = receives(p.collective, self.rank == fields[4]) and not in_out
        # x and out within the elements the chunks cut (cut_count)
        p.x, p.x_nbytes = x, x_count * itemsize
        p.out, p.out_nbytes = out, out_count * itemsize
        p.total = cut_count(p.collective, x_count, out_count) * itemsize
        p.x_at = shard_start(self.rank, p.x_nbytes) if p.collective == ALLGATHER else 0
        p.out_at = shard_start(self.rank, p.out_nbytes) if p.collective == REDUCE_SCATTER else 0
        p.kept_lo = p.kept_hi = 0
        if p.collective == ALLGATHER and at_shard(<Py_ssize_t>x, <Py_ssize_t>out, p.x_nbytes, self.rank):
            p.kept_lo, p.kept_hi = p.x_at, p.x_at + p.x_nbytes
        p.whole = _whole(p.collective, vote is None, p.total)
        p.chunk = _even(self.chunk, p.total, &p.nchunks)
        p.itemsize, p.kind, p.code = itemsize, kind, code
        p.divisor = self.size if avg else 1
        p.cuda, p.staging, p.consumed, p.cuda_error = cuda, staging, 0, 0
        p.pairable = p.paired = p.pairs_out = p.halved = p.stalled = False
        p.marks, p.mark_rows = self.marks, self.mark_rows
        _stores(&p, self.node.local_size, self.cache_bytes)
        p.first_chunk, p.calls_done, p.column = self.chunks_done, self.calls_done, _descriptor_column(self.calls_done)
        p.at, p.arrived, p.counted, p.rails = 0, False, False, NULL
        cdef Rail vote_rail
        _rail_of(&self.node, vote, &vote_rail)
        if (vote is None) != (rails is None) or rails is not None and len(rails) != p.nchunks:
            raise ValueError(f"across nodes a call takes the vote and a rail per chunk ({p.nchunks}): "
                             f"vote {vote!r}, rails {rails!r}")
        if in_out and (self.node.local_size != 1 or cuda != NULL):
            raise ValueError(f"a call whose result is made in out runs with one rank a node ({self.node.local_size}"
                             f" here) on host arrays")
        if rails is not None:
            if not all(rail is None or isinstance(rail, Schedule) for rail in rails):
                raise TypeError(f"rails are schedules of hfr/_internode.pyx or None, got {rails!r}")
            p.rails = <Rail*>malloc(max(len(rails), 1) * sizeof(Rail))
            if p.rails == NULL:
                raise MemoryError()
            for c in range(len(rails)):
                _rail_of(&self.node, rails[c], &p.rails[c])
        cdef int outcome
        with nogil:
            outcome = _run_staged(&self.node, &p, &vote_rail) if cuda != NULL else _run(&self.node, &p, &vote_rail)
        free(p.rails)
        self.call_chunks, self.failed_chunk = p.nchunks, p.at
        if outcome == CUDA_FAILED:
            self.cuda_failure = (f"{_CUDA_STEPS[p.cuda_step]}: {error_text(p.cuda_error)}")
        if outcome == INTERRUPTED:
            return raise_pending()
        if p.counted:
            self.calls_done += 1
        if outcome == DONE:
            self.chunks_done = p.first_chunk + p.nchunks
        elif outcome == MISMATCH_SPENT:
            self.chunks_done = p.first_chunk + 1
        return outcome


# What a WAIT_ outcome's wait was for, in the words of its timeout (the engine adds whom: late_wait)
WAITED_FOR = {WAIT_CALL: "the node's ranks to make the call",
              WAIT_INPUT_SLOT: "the node's ranks to finish reading our input slot",
              WAIT_RESULT_SLOT: "the result slot to be copied out",
              WAIT_ARRIVED: "the node's ranks to copy their data in",
              WAIT_PREVIOUS_RESULT: "the previous result to be copied out",
              WAIT_REDUCED: "the node's ranks to finish their slices",
              WAIT_PARTNER: "the GPU pair partner to pass its half",
              WAIT_DEVICE: "the device to run our copies (in a paired call, after the GPU pair partner's pushes)"}

_CUDA_STEPS = {CUDA_CONTEXT: "making the CUDA device's context current (its events and streams, the first time)",
               CUDA_ORDER: "ordering the copies after the caller's stream", CUDA_COPY_IN: "copying x to the host",
               CUDA_COPY_OUT: "copying the result to the device",
               CUDA_PAIR_LINK: "opening the GPU pair partner's buffers and events (CUDA IPC)",
               CUDA_PAIR_IN: "adding the GPU pair's halves (a push to the partner, the add, the copy to the host)",
               CUDA_PAIR_OUT: "passing the result's half to the GPU pair partner"}

# The pair's add kernels (hfr/pairs.py compiles them), by kind * PAIR_OPS + op as pair_add takes them: each
# (name, CUDA C type, the type it is summed in, the macros that widen to it and narrow from it, the op's macro)
_PAIR_TYPES = {F32: ("f32", "float", "float", "SAME", "SAME"), F64: ("f64", "double", "double", "SAME", "SAME"),
               I8: ("i8", "signed char", "signed char", "SAME", "SAME"),
               U8: ("u8", "unsigned char", "unsigned char", "SAME", "SAME"), I32: ("i32", "int", "int", "SAME", "SAME"),
               U32: ("u32", "unsigned int", "unsigned int", "SAME", "SAME"),
               I64: ("i64", "long long", "long long", "SAME", "SAME"),
               U64: ("u64", "unsigned long long", "unsigned long long", "SAME", "SAME"),
               BF16: ("bf16", "unsigned short", "float", "bf16_wide", "bf16_narrow"),
               FP16: ("fp16", "unsigned short", "float", "fp16_wide", "fp16_narrow")}
_OP_NAMES = {SUM: "sum", MAX: "max", MIN: "min", PROD: "prod"}
PAIR_ADDS = tuple((f"hfr_pair_{_PAIR_TYPES[k][0]}_{_OP_NAMES[o]}",) + _PAIR_TYPES[k][1:] + (_OP_NAMES[o].upper(),)
                  for k in range(KIND_COUNT) for o in range(PAIR_OPS))


cpdef Py_ssize_t cut_count(int collective, Py_ssize_t x_count, Py_ssize_t out_count) noexcept nogil:
    """The elements a call's chunks cut: out's for an allgather (every rank's shard), x's for the others."""
    return out_count if collective == ALLGATHER else x_count


cpdef bint apart(Py_ssize_t a, Py_ssize_t a_nbytes, Py_ssize_t b, Py_ssize_t b_nbytes) noexcept nogil:
    """Whether a_nbytes at address a and b_nbytes at b share no byte."""
    return a + a_nbytes <= b or b + b_nbytes <= a


cpdef bint same_or_apart(Py_ssize_t a, Py_ssize_t b, Py_ssize_t nbytes) noexcept nogil:
    """Whether two arrays of nbytes at addresses a and b are one memory or apart: what a call's out may be to
    its x of the same size (in place, or out of place; a partial overlap would read bytes already written)."""
    return a == b or apart(a, nbytes, b, nbytes)


cpdef Py_ssize_t shard_start(int rank, Py_ssize_t shard) noexcept nogil:
    """Where rank's shard (an allgather's x, a reduce_scatter's out) of `shard` elements or bytes starts in the
    whole array, in the same unit: rank r's is [r * shard, (r + 1) * shard)."""
    return rank * shard


cpdef bint at_shard(Py_ssize_t shard, Py_ssize_t whole, Py_ssize_t shard_nbytes, int rank) noexcept nogil:
    """Whether a shard (an allgather's x, a reduce_scatter's out) lies in the whole array at rank's place, as
    FSDP's all-gather passes it (in place): an allgather's shard is then not copied out."""
    return shard == whole + shard_start(rank, shard_nbytes)


cpdef bint reduces(int collective) noexcept nogil:
    """Whether the collective combines the ranks' data by an op (not broadcast, allgather): x goes to our
    input slot, and the descriptor carries the op."""
    return collective != BROADCAST and collective != ALLGATHER


cdef inline bint _whole(int collective, bint one_node, Py_ssize_t total) noexcept nogil:
    """Whether a call of total bytes is whole: one node, x deposited in the input slots (not the result
    slot), at most WHOLE_UP_TO_BYTES (so one chunk)."""
    return one_node and reduces(collective) and total <= WHOLE_UP_TO_BYTES


cpdef bint receives(int collective, bint is_root) noexcept nogil:
    """Whether this rank's out (x, in place) receives the call's result: not a reduce's other ranks, nor a
    broadcast's root, whose x is the data."""
    if collective == REDUCE:
        return is_root
    if collective == BROADCAST:
        return not is_root
    return True


cdef inline Py_ssize_t _stages_budget(Py_ssize_t cache_bytes) noexcept nogil:
    """What of the cache the stages in flight may take: half, so that a chunk stays there from its copy in to
    its copy out while the rest of the call (the arrays, the program) moves through the other half."""
    return cache_bytes // 2


cdef inline Py_ssize_t _stored_budget(Py_ssize_t cache_bytes) noexcept nogil:
    """What of the cache a call's working set (what its stores write, and for out's stores what shares the
    cache with them: _stores) may take and still be stored cached: three quarters.
    A cached store reads its line first but leaves it to be read again (the copy out, the caller's next use);
    a streamed store skips that read but sends the line to memory. A call whose working set fills up to three
    quarters of the cache still finds most of it there: in place, 4 MiB on 2 ranks (20 MiB of a 32 MiB cache)
    ran 1.1-1.4x faster cached than streamed on the dev VM, out of place (28 MiB) streamed was faster; in place,
    32 MiB on 8 ranks (0.94 of the H200 host's cache) was slower cached (bench/RESULTS.md)."""
    return cache_bytes * 3 // 4


cdef enum:
    MIN_CACHE_CHUNK_BYTES = 256 * 1024  # below this a chunk's hand-offs cost more than the cache saves


cpdef Py_ssize_t cache_chunk_bytes(Py_ssize_t cache_bytes, int local_size, Py_ssize_t chunk_bytes,
                                   bint oversubscribed=False):
    """The chunk of a host array's call on one node (the engine's NodeCall gets it): the largest multiple of
    CHUNK_ALIGN_BYTES whose STAGES stages (local_size input slots and a result slot each) fit the budget
    (_stages_budget) of the node's share of the cache, cache_bytes, within [MIN_CACHE_CHUNK_BYTES,
    chunk_bytes].
    chunk_bytes where the cache is unknown (0), or where the host's ranks outnumber its cores
    (oversubscribed): a rank that waits for another then waits for the scheduler to run it, so each chunk's
    hand-offs cost a time slice (bench/RESULTS.md)."""
    if cache_bytes <= 0 or oversubscribed:
        return chunk_bytes
    cdef Py_ssize_t fitting = _stages_budget(cache_bytes) // (STAGES * (local_size + 1))
    fitting = fitting // CHUNK_ALIGN_BYTES * CHUNK_ALIGN_BYTES
    return min(chunk_bytes, max(fitting, MIN_CACHE_CHUNK_BYTES))


cdef void _stores(Plan* p, int local_size, Py_ssize_t cache_bytes) noexcept nogil:
    """How the call's stores go (kernels' Stores): into the segment and into out alike, cached while the
    node's working set of what they write fits its budget (_stored_budget), else streamed past it: for the
    segment, the stages in flight; for out, the stages and every rank's x and out (the bytes they span
    together where one lies within the other: an allgather's x at its shard of out, a reduce_scatter's out at
    its shard of x), or in place the stages and every rank's chunks of x in flight. In place, out's lines are
    x's, which the rank's copy in read at most STAGES chunks before: while those fit too they are still cached,
    and a streamed store would evict each (a dirty one written back) only to write it again. By each store's
    size where the cache is unknown (0), and for a staged call, whose result the device's copy engine reads, not
    a core: there streaming from 1 MiB made CuPy's 186 MiB call 1.3-1.4x faster on the GPU host
    (bench/RESULTS.md)."""
    cdef Py_ssize_t in_flight = min(p.total, STAGES * p.chunk)  # of the call's bytes, in the stages at once
    cdef Py_ssize_t stages = in_flight * (local_size + 1)
    cdef bint in_place = p.out == p.x and p.out_nbytes == p.x_nbytes
    # the bytes x and out span together: more than their sum where they lie apart
    cdef Py_ssize_t spanned = max(p.x + p.x_nbytes, p.out + p.out_nbytes) - min(p.x, p.out)
    cdef Py_ssize_t arrays = local_size * (in_flight if in_place else min(spanned, p.x_nbytes + p.out_nbytes))
    if cache_bytes == 0 or p.cuda != NULL:
        p.slot_stores = p.out_stores = STORES_BY_SIZE
        return
    p.slot_stores = CACHED if stages <= _stored_budget(cache_bytes) else STREAMED
    p.out_stores = CACHED if stages + arrays <= _stored_budget(cache_bytes) else STREAMED


DESCRIPTOR_NAMES = ("collective", "count", "dtype", "op", "root")  # a descriptor's DESCRIPTOR_FIELDS, in order


cdef void describe(long long* fields, int collective, Py_ssize_t count, int dtype, int op, int root) noexcept nogil:
    """A call's descriptor (what the call check compares) into fields: the collective's and dtype's wire
    codes, x's count, the op's wire code (-1 for a collective without one: broadcast, allgather) and the
    root; a refused call's (count REFUSED) has -1 in every field but the collective."""
    cdef bint refused = count == REFUSED
    fields[0], fields[1] = collective, count
    fields[2] = -1 if refused else dtype
    fields[3] = op if reduces(collective) and not refused else -1
    fields[4] = -1 if refused else root


def descriptor(int collective, Py_ssize_t count, int dtype=-1, int op=-1, int root=-1) -> list:
    """describe()'s descriptor as a list, for the engine (count REFUSED: a refused call's)."""
    cdef long long fields[DESCRIPTOR_FIELDS]
    cdef int i
    describe(fields, collective, count, dtype, op, root)
    return [fields[i] for i in range(DESCRIPTOR_FIELDS)]


cdef inline Py_ssize_t _descriptor_column(int64_t calls_done) noexcept nogil:
    """Where the descriptors of the call after calls_done go: calls alternate between two rows, so a fast
    rank never overwrites a row that a slow one still reads."""
    return DESCRIPTOR + DESCRIPTOR_WORDS * (calls_done % 2)


cdef void _announce(Node* node, Py_ssize_t column, long long* fields, bint pairable, int64_t calls_done) noexcept nogil:
    """Our descriptor, and whether we can pair the call, into our control row at column, then ANNOUNCED for
    the call after calls_done."""
    cdef long long* row = node.control + node.local_rank * node.row_words
    cdef Py_ssize_t i
    for i in range(DESCRIPTOR_FIELDS):
        row[column + i] = fields[i]
    row[column + PAIRABLE] = pairable
    _publish(node, ANNOUNCED, calls_done + 1)


cdef inline char* _stage(Node* node, int64_t g) noexcept nogil:
    """Chunk g's stage: its first input slot; the result slot follows the local_size input slots."""
    return node.stages + (g % STAGES) * node.stage_bytes


cdef inline Py_ssize_t _even(Py_ssize_t chunk, Py_ssize_t total, Py_ssize_t* nchunks) noexcept nogil:
    """How a call of total bytes is cut: into the fewest chunks of at most `chunk` bytes (nchunks), of one
    size (returned) up to the last, which may be smaller: total / nchunks rounded up to CHUNK_ALIGN_BYTES
    (a call just over a chunk makes two halves, not a chunk and a sliver that costs a hand-off of its own)."""
    nchunks[0] = (total + chunk - 1) // chunk
    if nchunks[0] <= 1:
        return chunk
    return ((total + nchunks[0] - 1) // nchunks[0] + CHUNK_ALIGN_BYTES - 1) // CHUNK_ALIGN_BYTES * CHUNK_ALIGN_BYTES


cdef inline void _cut(Node* node, Py_ssize_t chunk, Py_ssize_t total, Py_ssize_t itemsize, Py_ssize_t c,
                      Py_ssize_t* first, Py_ssize_t* count, Py_ssize_t* lo, Py_ssize_t* hi) noexcept nogil:
    """Chunk c of a call of total bytes cut into chunks of `chunk` (as _even makes it): its first byte and
    bytes, and this rank's slice [lo, hi) of it, whose bounds but the last start cache lines
    (SLICE_ALIGN_BYTES)."""
    cdef Py_ssize_t align = max(SLICE_ALIGN_BYTES // itemsize, 1)
    first[0] = c * chunk
    count[0] = min(chunk, total - first[0])
    cdef Py_ssize_t elements = count[0] // itemsize
    lo[0] = _edge(elements, node.local_size, node.local_rank, align) * itemsize
    hi[0] = _edge(elements, node.local_size, node.local_rank + 1, align) * itemsize


cdef inline void _bounds(Node* node, Plan* p, Py_ssize_t c, Py_ssize_t* first, Py_ssize_t* count, Py_ssize_t* lo,
                         Py_ssize_t* hi) noexcept nogil:
    """The call's chunk c (_cut)."""
    _cut(node, p.chunk, p.total, p.itemsize, c, first, count, lo, hi)


cdef int _copy_in(Node* node, Plan* p, Py_ssize_t c) noexcept nogil:
    """Copy in, chunk c (the module's docstring): WAITED, or what stopped it."""
    cdef int64_t g = p.first_chunk + c
    cdef char* stage = _stage(node, g)
    cdef char* dst
    cdef Py_ssize_t first, count, lo, hi, a, b
    cdef int waited
    _bounds(node, p, c, &first, &count, &lo, &hi)
    if p.into_result:  # x's part of the chunk, once the result slot's last chunk is copied out
        waited = _wait_all(node, CONSUMED, g - STAGES + 1, WAIT_RESULT_SLOT)
        if waited != WAITED:
            return waited
        a, b = max(first, p.x_at), min(first + count, p.x_at + p.x_nbytes)
        waited = _into_segment(node, p, stage + node.local_size * node.slot_bytes + a - first, p.x + a - p.x_at, b - a)
        return _copied_in(p, g) if waited == WAITED else waited
    waited = _wait_all(node, REDUCED, g - STAGES + 1, WAIT_INPUT_SLOT)
    if waited != WAITED:
        return waited
    dst = stage + node.local_rank * node.slot_bytes
    if p.paired:
        return _pair_in(node, p, g, dst, first, count)
    if p.whole or p.cuda != NULL:  # all of the chunk (a whole call's: all of x)
        waited = _into_segment(node, p, dst, p.x + first, count)
    else:  # our own slice is read from x
        waited = _into_segment(node, p, dst, p.x + first, lo)
        if waited == WAITED:
            waited = _into_segment(node, p, dst + hi, p.x + first + hi, count - hi)
    return _copied_in(p, g) if waited == WAITED else waited


cdef int _into_segment(Node* node, Plan* p, char* dst, char* src, Py_ssize_t nbytes) noexcept nogil:
    """dst[:nbytes] = x's bytes at src, into the segment: copied, or staged, queued. WAITED or what stopped it."""
    cdef int error
    if nbytes <= 0:
        return WAITED
    if p.cuda == NULL:
        return NO_MEMORY if _copy(node, dst, src, nbytes, p.slot_stores) else WAITED
    error = cuda_copy(p.cuda, dst, src, nbytes, True)
    return _cuda_failed(p, error, CUDA_COPY_IN) if error else WAITED


cdef int _copied_in(Plan* p, int64_t g) noexcept nogil:
    """Chunk g's copies in are queued: staged, the event after them (_arrive waits for it)."""
    cdef int error = record(p.cuda, IN_EVENTS + g % STAGES, True) if p.cuda != NULL else 0
    return _cuda_failed(p, error, CUDA_COPY_IN) if error else WAITED


cdef int _to_out(Node* node, Plan* p, int64_t g, char* src, Py_ssize_t a, Py_ssize_t b,
                 Py_ssize_t own) noexcept nogil:
    """Out's part [a, b) of chunk g's result, at src, into out, but the bytes out already holds (_out_part): copied
    from byte `own` on (our slice's first: that part was reduced here), then from a up to it, then CONSUMED;
    staged, queued in order, with the event after it (_retire publishes CONSUMED once it ran). WAITED or what
    stopped it. Each rank starting at its own slice, the ranks read different slices at any time, each from its
    reducer's cache, not all the first one at once."""
    cdef int error = 0
    cdef Py_ssize_t s = min(max(own, a), b)
    if p.cuda == NULL:
        if _out_part(node, p, src, a, s, b) or _out_part(node, p, src, a, a, s):
            return NO_MEMORY
        _publish(node, CONSUMED, g + 1)
        return WAITED
    error = _out_part(node, p, src, a, a, b)
    if not error:
        error = record(p.cuda, OUT_EVENTS + g % STAGES, False)
    return _cuda_failed(p, error, CUDA_COPY_OUT) if error else WAITED


cdef int _out_part(Node* node, Plan* p, char* src, Py_ssize_t a, Py_ssize_t lo, Py_ssize_t hi) noexcept nogil:
    """Out's bytes [lo, hi) from the result at src (which holds byte a) but the kept ones (p.kept_lo, p.kept_hi):
    copied, or staged, queued. 0, or what failed: the copy's nonzero, or the CUresult."""
    cdef Py_ssize_t kept_lo = min(max(p.kept_lo, lo), hi), kept_hi = max(min(p.kept_hi, hi), kept_lo)
    return _out_bytes(node, p, src, a, lo, kept_lo) or _out_bytes(node, p, src, a, kept_hi, hi)


cdef inline int _out_bytes(Node* node, Plan* p, char* src, Py_ssize_t a, Py_ssize_t lo, Py_ssize_t hi) noexcept nogil:
    """_out_part's copy of out's bytes [lo, hi), all of them."""
    if hi <= lo:
        return 0
    if p.cuda == NULL:
        return _copy(node, p.out + lo - p.out_at, src + lo - a, hi - lo, p.out_stores)
    return cuda_copy(p.cuda, p.out + lo - p.out_at, src + lo - a, hi - lo, False)


cdef int _retire(Node* node, Plan* p, int64_t until) noexcept nogil:
    """Staged: CONSUMED up to `until` (chunk g's is g + 1) once our copies out of the call's chunks before it
    have run (the others publish it as they copy out). Chunk g retires chunk g - STAGES as it begins,
    before it waits for anyone: a rank that held it back while it waited for ARRIVED could wait for a
    rank that waits for it. WAITED or what stopped it (_until_ran)."""
    if p.cuda == NULL or p.first_chunk + p.consumed >= until:
        return WAITED
    # the copies out run in order on one stream: once the last one's event is done, so are the others
    cdef int waited = _until_ran(node, p, OUT_EVENTS + (until - 1) % STAGES, CUDA_COPY_OUT)
    if waited != WAITED:
        return waited
    p.consumed = until - p.first_chunk
    _publish(node, CONSUMED, until)
    return WAITED


cdef struct EventWait:  # what _ran_within waits for
    Node* node
    Cuda* cuda
    int event
    int watched  # a local rank whose going ends the wait, or -1
    int error  # what ran() said last


cdef Look _event_ran(void* state) noexcept nogil:
    cdef EventWait* w = <EventWait*>state
    w.error = ran(w.cuda, w.event)
    return STILL if w.error == NOT_READY else ENDED


cdef bint _watched_closed(void* state) noexcept nogil:
    cdef EventWait* w = <EventWait*>state
    return w.watched >= 0 and _closed(w.node, w.watched)


cdef int _ran_within(Node* node, Cuda* cuda, int event, bint signals, int watched) noexcept nogil:
    """Poll until what our events[event] was recorded after has run (DRAINED: all the call's streams hold):
    0, or the CUresult it failed with; NOT_READY once the timeout passes first; where `signals`, INTERRUPTED
    if a signal handler raised meanwhile; WATCHED_GONE if local rank `watched` (not -1: a GPU pair partner,
    whose pushes our streams may wait on) closed or broke (_closed). A poll, as every wait of the call: the
    driver's blocking wait would outlive the timeout and Ctrl-C where a stream waits on a partner's push that
    never runs."""
    cdef EventWait w
    w.node, w.cuda, w.event, w.watched, w.error = node, cuda, event, watched, NOT_READY
    cdef Waited waited = wait_for(_event_ran, _watched_closed, &w, hfr_now() + node.timeout, signals)
    if waited == WAIT_ENDED:
        return w.error
    if waited == WAIT_SIGNALLED:
        return INTERRUPTED
    return NOT_READY if waited == WAIT_TIMED_OUT else WATCHED_GONE


cdef int _until_ran(Node* node, Plan* p, int event, CudaStep step) noexcept nogil:
    """WAITED once what our events[event] was recorded after has run; CUDA_FAILED (step) where it failed;
    INTERRUPTED; WAIT_DEVICE where the timeout passed first, with p.stalled (our streams may never drain):
    in a paired call they wait on the partner's pushes (after_partner), so late_wait names it, and the wait
    ends as soon as the partner closed or broke (late_wait's gone)."""
    cdef int error = _ran_within(node, p.cuda, event, True, node.partner if p.paired else -1)
    if error == 0:
        return WAITED
    if error == INTERRUPTED:
        return INTERRUPTED
    if error != NOT_READY and error != WATCHED_GONE:
        return _cuda_failed(p, error, step)
    p.stalled = True
    node.late_column, node.late_target = -1, 0
    node.gone_rank = node.partner if error == WATCHED_GONE else -1
    node.late_only = node.partner if p.paired else -1
    return WAIT_DEVICE


cdef inline int _cuda_failed(Plan* p, int error, CudaStep step) noexcept nogil:
    """CUDA_FAILED, the driver's error and the step noted for the engine's words."""
    p.cuda_error, p.cuda_step = error, step
    return CUDA_FAILED


cdef inline char* _own(Node* node, Plan* p, int64_t g, Py_ssize_t first) noexcept nogil:
    """Where this rank's input to chunk g's reduce lies (the chunk's first byte `first`): x itself, or, staged,
    our input slot (x is on the device)."""
    return _stage(node, g) + node.local_rank * node.slot_bytes if p.cuda != NULL else p.x + first


cdef int _arrive(Node* node, Plan* p, int64_t g) noexcept nogil:
    """ARRIVED for chunk g (staged, once our copies in ran), then wait for every rank's, and for the result
    slot's last chunk to be copied out."""
    cdef int waited = _until_ran(node, p, IN_EVENTS + g % STAGES, CUDA_COPY_IN) if p.cuda != NULL and p.deposits \
        else WAITED
    if waited != WAITED:
        return waited
    _mark(p, g - p.first_chunk, MARK_COPIED_IN)
    _publish(node, ARRIVED, g + 1)
    waited = _wait_all(node, ARRIVED, g + 1, WAIT_ARRIVED)
    if waited == WAITED:
        waited = _wait_all(node, CONSUMED, g - STAGES + 1, WAIT_PREVIOUS_RESULT)
    hfr_fence()
    _mark(p, g - p.first_chunk, MARK_ARRIVED)
    return waited


cdef int _reduce_slice(Node* node, Plan* p, char* dst, char* own, char* slots, Py_ssize_t lo, Py_ssize_t hi,
                       Py_ssize_t middle, Stores stores) noexcept nogil:
    """dst = bytes [lo, hi) of the chunk's inputs reduced in slot order (ours read from own): below the chunk's
    middle from every slot but a pair's UPPER one, from it on from every slot but a pair's LOWER one
    (Node.halves); NO_MEMORY or 0."""
    cdef Py_ssize_t cut = min(max(middle, lo), hi)  # [lo, cut) below the middle, [cut, hi) from it
    if lo < cut and _reduce_part(node, p, dst, own, slots, lo, cut, UPPER, stores):
        return NO_MEMORY
    if cut < hi and _reduce_part(node, p, dst + cut - lo, own, slots, cut, hi, LOWER, stores):
        return NO_MEMORY
    return 0


cdef int _reduce_part(Node* node, Plan* p, char* dst, char* own, char* slots, Py_ssize_t lo, Py_ssize_t hi,
                      Half apart, Stores stores) noexcept nogil:
    """dst = bytes [lo, hi) of the inputs of every local rank whose slot does not hold only `apart`, in slot
    order; nonzero: no memory."""
    cdef int j, k = 0
    for j in range(node.local_size):
        if node.halves[j] != apart:
            node.inputs[k] = (own if j == node.local_rank else slots + j * node.slot_bytes) + lo
            k += 1
    return reduce_nogil(p.kind, p.itemsize, dst, node.inputs, k, (hi - lo) // p.itemsize, p.code, node.threads,
                        p.divisor, stores)


cdef int _check(Node* node, Plan* p, Rail* vote) noexcept nogil:
    """The call check: WAITED where every rank made this call, else MISMATCH (no counter but ANNOUNCED
    moved), MISMATCH_SPENT (folded: chunk 0 ended with no result), or what stopped it. A folded call that
    passes has ARRIVED for chunk 0 and its slice came back in the vote's record (p.arrived)."""
    cdef long long* other
    cdef long long* votes
    cdef bint differs = False
    cdef Py_ssize_t first, count, lo, hi, i
    cdef int j, waited
    cdef int64_t g = p.first_chunk
    waited = _wait_all(node, ANNOUNCED, p.calls_done + 1, WAIT_CALL)
    if waited != WAITED:
        return waited
    p.counted = True
    hfr_fence()
    _pair_up(node, p)
    for j in range(node.local_size):
        other = node.control + j * node.row_words + p.column
        for i in range(DESCRIPTOR_FIELDS):
            differs = differs or other[i] != p.fields[i]
    if vote.advance == NULL:
        return MISMATCH if differs else WAITED
    # across nodes: every node's verdict and descriptor, merged on the rail (hfr/_internode.pxd's vote_for)
    votes, other = <long long*>vote.call.buf - VOTE_WORDS, node.control + p.column  # local rank 0's descriptor
    vote_for(votes, differs, other)
    if p.folded and not differs:  # the reduce's first steps, our slice into the vote's record
        waited = _arrive(node, p, g)
        if waited != WAITED:
            return waited
        p.arrived = True
        _bounds(node, p, 0, &first, &count, &lo, &hi)
        if hi > lo and _reduce_slice(node, p, vote.call.buf, _own(node, p, g, first), _stage(node, g), lo, hi,
                                      _middle(p, count), CACHED):
            return NO_MEMORY
    waited = _run_rail(node, vote, VOTE_STOPPED)
    if waited != WAITED:
        return waited
    if votes_agree(votes):
        return WAITED
    if not p.arrived:
        return MISMATCH
    # end the chunk with no result, as every rank of the node does
    _publish(node, REDUCED, g + 1)
    waited = _wait_all(node, REDUCED, g + 1, WAIT_REDUCED)
    if waited != WAITED:
        return waited
    _publish(node, CONSUMED, g + 1)
    return MISMATCH_SPENT


# ---- GPU pairs ----------------------------------------------------------------------------------------
# Local ranks 2i and 2i + 1 of a node are partners (hfr/pairs.py says when a pair forms). Each has a device
# buffer of two boxes, inbox and outbox, of STAGES parts each (part g % STAGES for chunk g), which the partner
# opened by CUDA IPC (hfr/_cuda.pyx), and two counters the partner reads: PUSHED and RETURNED (g + 1 once its
# push of chunk g into our inbox, or outbox, is queued, with its pair event after it). A call that both
# partners can pair (_pairable: a staged call of a reducing collective, neither whole nor folded; PAIRABLE in
# the descriptor row) is *paired* (_pair_up, after the call check, on every rank of the node alike). Each
# chunk then has a *middle* (_middle): the lower rank owns the bytes below it, the upper rank those from it.
#   copy in     push the partner's half of x's chunk into its inbox; once its push of our half is queued
#               (PUSHED) and has run (its pair event), add it to ours in our inbox on the device, lower rank's
#               first (one kernel), and copy that sum into our input slot: half the bytes cross PCIe
#   reduce      every slot holding a half is one input of that half (Half, _reduce_slice): L / 2 inputs
#   copy out    of an allreduce: our half of the result into out, then from out into the partner's outbox;
#               once its push is queued (RETURNED) and has run, its half from our outbox into out. Other
#               collectives copy out as unpaired ranks do.
# The boxes' parts are reused as the slots are: a partner pushes chunk g only once every rank has REDUCED
# chunk g - STAGES (copy in) or has reduced chunk g (copy out), by which time we have read the part.

cpdef int partner_of(int local_rank, int local_size) noexcept nogil:
    """A local rank's GPU pair partner: local ranks 2i and 2i + 1 pair; -1 for an odd node's last rank."""
    return local_rank ^ 1 if (local_rank ^ 1) < local_size else -1


cpdef Py_ssize_t pair_box_bytes(Py_ssize_t chunk) noexcept nogil:
    """A GPU pair's box (its inbox, or its outbox): a part per stage (_box), each with room for a chunk's
    larger half (_middle: half of it and a cache line at most)."""
    return STAGES * (chunk // 2 + SLICE_ALIGN_BYTES)


cdef inline uintptr_t _box(uintptr_t boxes, size_t box_bytes, bint outbox, int64_t g) noexcept nogil:
    """Chunk g's part of the inbox (or outbox) of the boxes at boxes."""
    return boxes + (box_bytes if outbox else 0) + (g % STAGES) * (box_bytes // STAGES)


cdef inline Py_ssize_t _middle(Plan* p, Py_ssize_t count) noexcept nogil:
    """The middle of a chunk of count bytes where a pair of the node is paired in the call (p.halved): the
    first byte of a pair's upper half, on a cache line; else its end (every slot holds all of it)."""
    if not p.halved:
        return count
    return _edge(count // p.itemsize, 2, 1, max(SLICE_ALIGN_BYTES // p.itemsize, 1)) * p.itemsize


cdef inline void _half(Plan* p, Py_ssize_t count, bint upper, Py_ssize_t* lo, Py_ssize_t* hi) noexcept nogil:
    """The bytes [lo, hi) of a paired chunk of count bytes that the pair's lower (or upper) rank owns."""
    lo[0], hi[0] = 0, _middle(p, count)
    if upper:
        lo[0], hi[0] = hi[0], count


cdef int _pairable(Node* node, Plan* p) noexcept nogil:
    """Whether this rank can pair the staged call (p.pairable), the context entered: a reducing collective,
    neither whole nor folded, of at least pairs_from bytes (PAIRS_AUTO), with a partner whose device links
    to ours, linked here the first time (then PAIR_LINKED): at the first such call after both partners
    published their records (PAIR_SINCE), so that both link at the same call, in every run. A link that
    fails leaves the pair apart (PAIRS_AUTO) or stops the call (PAIRS_ON). The CUresult."""
    cdef Cuda* cuda = p.cuda
    cdef long long* partner = node.control + node.partner * node.row_words
    cdef long long* own = node.control + node.local_rank * node.row_words
    cdef int error = 0
    if (node.pairs == PAIRS_OFF or node.partner < 0 or cuda.pair.kernels[0] == 0 or not reduces(p.collective)
            or p.whole or p.folded or p.total == 0 or node.pairs == PAIRS_AUTO and p.total < node.pairs_from):
        return 0
    if cuda.pair.link == UNLINKED:
        if hfr_load_acquire(partner + PAIR_READY) == 0:  # its record's stores (and PAIR_SINCE) are seen after it
            return 0
        if partner[<int>PAIR_SINCE] >= p.calls_done or own[<int>PAIR_SINCE] >= p.calls_done:  # not both before it
            return 0
        error = link(cuda, <PairRecord*>(partner + PAIR_RECORD))
        if error and node.pairs == PAIRS_AUTO:
            cuda.pair.link, error = NO_LINK, 0
        if not error and cuda.pair.link == LINKED:
            _publish(node, PAIR_READY, PAIR_LINKED)
    p.pairable = not error and cuda.pair.link == LINKED
    return error


cdef void _pair_up(Node* node, Plan* p) noexcept nogil:
    """After the call check: each pair whose two ranks can pair the call is paired (LOWER, UPPER in
    Node.halves), every other rank WHOLE; whether we are, and pass the result's halves (p.pairs_out)."""
    cdef long long* rows = node.control + p.column + PAIRABLE
    cdef int j, k
    memset(node.halves, WHOLE, node.local_size)
    for j in range(node.local_size):
        k = partner_of(j, node.local_size)
        if j < k and rows[j * node.row_words] and rows[k * node.row_words]:
            node.halves[j], node.halves[k] = LOWER, UPPER
            p.halved = True
    p.paired = node.halves[node.local_rank] != WHOLE
    p.pairs_out = p.paired and p.collective == ALLREDUCE


cdef int _hand_over(Node* node, Plan* p, int64_t g, Py_ssize_t column, int event, bint to_host,
                    CudaStep step) noexcept nogil:
    """After our push of chunk g into the partner's box (on the to_host stream, or to_device): our pair event
    after it and our counter in column at g + 1; then, once the partner's counter is (its push into ours
    queued), what that stream queues next ordered after the partner's pair event. WAITED or what stopped it."""
    cdef int error = record_pushed(p.cuda, event, to_host)
    cdef int waited
    if error:
        return _cuda_failed(p, error, step)
    _publish(node, column, g + 1)
    waited = _wait_ranks(node, node.partner, 1, column, g + 1, WAIT_PARTNER)
    if waited != WAITED:
        return waited
    error = after_partner(p.cuda, event, to_host)
    return _cuda_failed(p, error, step) if error else WAITED


cdef int _pair_in(Node* node, Plan* p, int64_t g, char* slot, Py_ssize_t first, Py_ssize_t count) noexcept nogil:
    """Copy in, chunk g, paired (above): WAITED or what stopped it."""
    cdef Cuda* cuda = p.cuda
    cdef Py_ssize_t lo, hi
    cdef bint lower = node.local_rank < node.partner
    cdef uintptr_t inbox = _box(cuda.pair.boxes, cuda.pair.box_bytes, False, g)
    cdef int error = 0, waited
    _half(p, count, lower, &lo, &hi)  # the partner's
    if hi > lo:
        error = push(cuda, _box(cuda.pair.partner_boxes, cuda.pair.box_bytes, False, g), p.x + first + lo, hi - lo,
                     True)
    if error:
        return _cuda_failed(p, error, CUDA_PAIR_IN)
    waited = _hand_over(node, p, g, PUSHED, IN_PUSHED + g % STAGES, True, CUDA_PAIR_IN)
    if waited != WAITED:
        return waited
    _half(p, count, not lower, &lo, &hi)  # ours
    if hi > lo:
        error = pair_add(cuda, p.kind * PAIR_OPS + p.code, inbox, p.x + first + lo, (hi - lo) // p.itemsize,
                         not lower)
    if not error and hi > lo:
        error = cuda_copy(cuda, slot + lo, <char*>inbox, hi - lo, True)
    if not error:
        error = record(cuda, IN_EVENTS + g % STAGES, True)
    return _cuda_failed(p, error, CUDA_PAIR_IN) if error else WAITED


cdef int _pair_out(Node* node, Plan* p, int64_t g, char* result, Py_ssize_t first, Py_ssize_t count) noexcept nogil:
    """Copy out, chunk g (its result at result), of a paired allreduce (above), with the event after it
    (_retire publishes CONSUMED once it ran): WAITED or what stopped it."""
    cdef Cuda* cuda = p.cuda
    cdef Py_ssize_t lo, hi
    cdef bint lower = node.local_rank < node.partner
    cdef char* out = p.out + first
    cdef int error = 0, waited
    _half(p, count, not lower, &lo, &hi)  # ours
    if hi > lo:
        error = cuda_copy(cuda, out + lo, result + lo, hi - lo, False)
    if not error and hi > lo:
        error = push(cuda, _box(cuda.pair.partner_boxes, cuda.pair.box_bytes, True, g), out + lo, hi - lo, False)
    if error:
        return _cuda_failed(p, error, CUDA_PAIR_OUT)
    waited = _hand_over(node, p, g, RETURNED, OUT_PUSHED + g % STAGES, False, CUDA_PAIR_OUT)
    if waited != WAITED:
        return waited
    _half(p, count, lower, &lo, &hi)  # the partner's
    if hi > lo:
        error = push(cuda, <uintptr_t>(out + lo), <char*>_box(cuda.pair.boxes, cuda.pair.box_bytes, True, g), hi - lo,
                     False)
    if not error:
        error = record(cuda, OUT_EVENTS + g % STAGES, False)
    return _cuda_failed(p, error, CUDA_PAIR_OUT) if error else WAITED


cdef int _run_staged(Node* node, Plan* p, Rail* vote) noexcept nogil:
    """_run of a staged call, the device's context current throughout, ended once every copy it queued ran:
    at the end, CONSUMED once the last copies out ran; where it stopped, whatever the copies' fate, unless
    our streams stalled (p.stalled: waiting longer would not end) or, paired, the partner is gone."""
    cdef int error = enter(p.cuda)
    cdef int outcome, waited
    if error:
        outcome = _cuda_failed(p, error, CUDA_CONTEXT)
    else:
        error = order(p.cuda, p.nchunks > 1)
        if error:
            outcome = _cuda_failed(p, error, CUDA_ORDER)
        else:
            error = _pairable(node, p)
            outcome = _cuda_failed(p, error, CUDA_PAIR_LINK) if error else _run(node, p, vote)
    if outcome == DONE:
        waited = _retire(node, p, p.first_chunk + p.nchunks)
        outcome = DONE if waited == WAITED else waited
    if outcome != DONE and not error and not p.stalled:
        _ran_within(node, p.cuda, DRAINED, False, node.partner if p.paired else -1)
    leave(p.cuda)
    return outcome


cdef inline char* _result(Node* node, char* out, bint in_out, int64_t g, Py_ssize_t first) noexcept nogil:
    """Where chunk g (its first byte `first`) is reduced to: its stage's result slot, or out itself (in_out)."""
    return out + first if in_out else _stage(node, g) + node.local_size * node.slot_bytes


cdef int _reduce_node(Node* node, Plan* p, Py_ssize_t c, Rail* vote) noexcept nogil:
    """Reduce the node, chunk c: ARRIVED, then our slice of the inputs, in slot order, into the chunk's result
    (a folded call's slice came back with the vote instead). WAITED or what stopped it."""
    cdef int64_t g = p.first_chunk + c
    cdef Py_ssize_t first, count, lo, hi
    cdef char* result
    cdef char* own
    cdef int waited
    _bounds(node, p, c, &first, &count, &lo, &hi)
    result = _result(node, p.out, p.in_out, g, first)
    if p.arrived:
        return NO_MEMORY if _copy(node, result + lo, vote.call.buf, hi - lo, p.slot_stores) else WAITED
    waited = _arrive(node, p, g)
    if waited != WAITED or p.into_result or hi <= lo:  # a whole call's slice too: others may read it there
        return waited
    own = _own(node, p, g, first)
    if p.in_out and own == result and p.divisor == 1:  # one rank a node, in place: x is its node's sum
        return WAITED
    if _reduce_slice(node, p, result + lo, own, _stage(node, g), lo, hi, _middle(p, count),
                     p.out_stores if p.in_out else p.slot_stores):
        return NO_MEMORY
    _mark(p, c, MARK_REDUCED)
    return WAITED


cdef int _cross_nodes(Node* node, Plan* p, Py_ssize_t c) noexcept nogil:
    """Cross nodes, chunk c: our slice of its result through its schedule on the rail (none on one node, for
    an empty slice, or folded: the vote carried it). WAITED or what stopped it."""
    if p.rails == NULL:
        return WAITED
    cdef int waited = _run_rail(node, &p.rails[c], RAIL_STOPPED)
    _mark(p, c, MARK_CROSSED)
    return waited


cdef int _copy_out(Node* node, Plan* p, Py_ssize_t c) noexcept nogil:
    """Copy out, chunk c: REDUCED, then, once every rank has REDUCED, out's part [a, b) of the result into out;
    a whole call's part reduced straight from the input slots first (then REDUCED: later copies in may
    overwrite them). WAITED or what stopped it."""
    cdef int64_t g = p.first_chunk + c
    cdef Py_ssize_t first, count, lo, hi, a, b
    cdef char* slots = _stage(node, g)
    cdef char* made
    cdef int waited
    _bounds(node, p, c, &first, &count, &lo, &hi)
    a, b = max(first, p.out_at), min(first + count, p.out_at + p.out_nbytes)
    if not p.copies_out:
        a = b
    if p.whole:
        made = (p.staging if p.cuda != NULL else p.out) + a - p.out_at  # out's part, made here
        if a < b and _reduce_slice(node, p, made, slots + node.local_rank * node.slot_bytes, slots, a, b,
                                   _middle(p, count), p.out_stores):
            return NO_MEMORY
        _publish(node, REDUCED, g + 1)
        return _to_out(node, p, g, made, a, b, a)
    _publish(node, REDUCED, g + 1)
    waited = _wait_all(node, REDUCED, g + 1, WAIT_REDUCED)
    if waited != WAITED:
        return waited
    hfr_fence()
    _mark(p, c, MARK_ALL_REDUCED)
    if p.pairs_out:
        return _pair_out(node, p, g, _result(node, p.out, p.in_out, g, first), first, count)
    return _to_out(node, p, g, _result(node, p.out, p.in_out, g, first) + a - first, a, b, first + lo)


cdef int _run(Node* node, Plan* p, Rail* vote) noexcept nogil:
    """The call (the module's docstring): announce, the first copies in, the check, then per chunk the four
    steps; DONE, or the outcome that stopped it at chunk p.at."""
    cdef Py_ssize_t c
    cdef int waited
    cdef bint ahead = p.deposits and not p.into_result  # copies in run up to STAGES chunks ahead

    cdef Py_ssize_t queued = 0  # chunks copied in ahead
    _announce(node, p.column, p.fields, p.pairable, p.calls_done)
    while ahead and not p.pairable and queued < min(STAGES, p.nchunks):  # a paired call's only after the check
        p.at = queued
        waited = _copy_in(node, p, queued)
        if waited != WAITED:
            return waited
        queued += 1
    p.at = 0
    waited = _check(node, p, vote)
    if waited != WAITED:
        return waited
    while ahead and queued < min(STAGES, p.nchunks):
        p.at = queued
        waited = _copy_in(node, p, queued)
        if waited != WAITED:
            return waited
        queued += 1
    for c in range(p.nchunks):
        p.at = c
        _mark(p, c, MARK_BEGIN)
        waited = _retire(node, p, p.first_chunk + c - STAGES + 1)  # staged: the copies out STAGES back
        _mark(p, c, MARK_RETIRED)
        if waited == WAITED and p.deposits and p.into_result:
            waited = _copy_in(node, p, c)  # into the result slot, once it is free
        if waited == WAITED:
            waited = _reduce_node(node, p, c, vote)
        if waited == WAITED:
            waited = _cross_nodes(node, p, c)
        if waited == WAITED:
            waited = _copy_out(node, p, c)
            _mark(p, c, MARK_COPIED_OUT)
        if waited == WAITED and ahead and c + STAGES < p.nchunks:
            p.at = c + STAGES
            waited = _copy_in(node, p, c + STAGES)
            _mark(p, c, MARK_NEXT_COPY_IN)
        if waited != WAITED:
            return waited
    return DONE
