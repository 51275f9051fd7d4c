/* How far apart two CPUs are: the round trip of one cache line between a thread pinned to each, and what the
   first CPU's stores into 1 MiB cost where the second CPU has just read it (the lines shared with its caches, as
   a slot of hfr's segment is when its owner writes it again) against where no other CPU holds it, with plain
   (cached) and non-temporal (streamed) stores.

       cc -O2 -pthread bench/core_trip.c -o /tmp/core_trip && /tmp/core_trip [CPU_A CPU_B]   (default 0 1)

   The dev VM runs in two modes that its sysfs cannot tell apart (one 32 MiB L3 shared by both vCPUs, either
   way): 76-78 ns a round trip, where hfr's node calls run at full speed, and 370-394 ns, where they take twice
   as long from 1 MiB up (bench/RESULTS.md, "The dev VM's slow mode"): there a cached store into a line the
   other vCPU holds runs at 7-8 GB/s against 60-68 into a line no other CPU holds. Run this before trusting a
   dev VM number. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

enum { TRIPS = 2000000, BYTES = 1 << 20, ROUNDS = 30 };
static _Atomic long word __attribute__((aligned(64)));  /* odd: the first CPU's turn is over; even: the second's */

static void pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (pthread_setaffinity_np(pthread_self(), sizeof set, &set)) {
        fprintf(stderr, "cannot run on CPU %d\n", cpu);
        exit(2);
    }
}

static void *answer(void *cpu) {
    pin(*(int *)cpu);
    for (long i = 0; i < TRIPS; i++) {
        while (atomic_load(&word) != 2 * i + 1)
            ;
        atomic_store(&word, 2 * i + 2);
    }
    return NULL;
}

static char *lines, *source, *sink;  /* BYTES each: the lines stored into, what is stored, where the reader copies */
static _Atomic long turn;  /* odd: the first CPU has stored round turn / 2; even: the second has read it */
static int shared;  /* whether the second CPU reads the lines between the first CPU's rounds of stores */

static void *read_lines(void *cpu) {
    pin(*(int *)cpu);
    for (long r = 0; r < ROUNDS; r++) {
        while (atomic_load(&turn) != 2 * r + 1)
            ;
        if (shared)
            memcpy(sink, lines, BYTES);
        atomic_store(&turn, 2 * r + 2);
    }
    return NULL;
}

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* GB/s of the first CPU's stores into the lines, each round after the second CPU read them (shared) or not */
static double store_rate(int b, int streamed) {
    pthread_t other;
    double spent = 0;
    atomic_store(&turn, 0);
    pthread_create(&other, NULL, read_lines, &b);
    for (long r = 0; r < ROUNDS; r++) {
        while (atomic_load(&turn) != 2 * r)
            ;
        double start = seconds();
#if defined(__SSE2__)
        if (streamed) {
            for (size_t i = 0; i < BYTES; i += 16)
                _mm_stream_si128((__m128i *)(lines + i), _mm_load_si128((const __m128i *)(source + i)));
            _mm_sfence();
        } else
#endif
            memcpy(lines, source, BYTES);
        if (r > 0)  /* the first round's lines are the kernel's fresh pages */
            spent += seconds() - start;
        atomic_store(&turn, 2 * r + 1);
    }
    pthread_join(other, NULL);
    return (double)BYTES * (ROUNDS - 1) / spent / 1e9;
}

int main(int argc, char **argv) {
    int a = argc > 2 ? atoi(argv[1]) : 0, b = argc > 2 ? atoi(argv[2]) : 1;
    pthread_t other;
    pin(a);
    pthread_create(&other, NULL, answer, &b);
    double start = seconds();
    for (long i = 0; i < TRIPS; i++) {
        atomic_store(&word, 2 * i + 1);
        while (atomic_load(&word) != 2 * i + 2)
            ;
    }
    double spent = seconds() - start;
    pthread_join(other, NULL);
    printf("CPUs %d and %d: %.1f ns a round trip\n", a, b, spent * 1e9 / TRIPS);
    lines = aligned_alloc(64, BYTES);
    source = aligned_alloc(64, BYTES);
    sink = aligned_alloc(64, BYTES);
    memset(lines, 1, BYTES);
    memset(source, 2, BYTES);
    memset(sink, 3, BYTES);
    double rates[2][2];  /* [shared][streamed] */
    for (shared = 0; shared < 2; shared++)
        for (int streamed = 0; streamed < 2; streamed++)
            rates[shared][streamed] = store_rate(b, streamed);
    printf("CPU %d's stores into 1 MiB, GB/s, where CPU %d has read it / where no other CPU holds it: cached %.1f / %.1f,"
           " streamed %.1f / %.1f\n", a, b, rates[1][0], rates[0][0], rates[1][1], rates[0][1]);
    return 0;
}
